"""Run ``SpeedAdvisor`` on the plain digits baseline (what ``lightning-speedups advise`` prints).

Baseline = plain Lightning as most users write it: ``DigitsDataModule(batch_size=32)`` with per-sample transforms,
``DemoClassifier`` with Adam at a constant 1e-3, fp32, default Trainer settings on the CPU.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

import torch

from lightning_speedups.benchmarks._common import BenchRow
from lightning_speedups.measure import machine_info, median

__all__ = ["run", "run_advice"]


def run_advice(quick: bool = True, verbose: bool = True, width: int = 32, seed: int = 0) -> dict[str, Any]:
    """Fit the plain digits baseline with ``SpeedAdvisor`` and return its report as a dict (plus the machine).

    Args:
        quick: 2 warm-up + 6 timed batches (a few seconds) instead of 5 + 20.
        verbose: print the text report.
        width: ``DemoClassifier`` width (32 = the baseline).
        seed: seed for weights, data order and the split.

    Returns:
        ``{"machine": ..., "config": ..., "summary": ..., "findings": [...], "notes": [...], "applied": [...]}``.
    """
    import lightning as L

    from lightning_speedups.callbacks.advisor import SpeedAdvisor
    from lightning_speedups.demo import DemoClassifier, DigitsDataModule

    warmup, window = (2, 6) if quick else (5, 20)
    L.seed_everything(seed, verbose=False)
    advisor = SpeedAdvisor(warmup_steps=warmup, window_steps=window, verbose=verbose)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=warmup + window,
        limit_val_batches=0,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        num_sanity_val_steps=0,
        callbacks=[advisor],
    )
    trainer.fit(DemoClassifier(width=width), DigitsDataModule(batch_size=32, seed=seed))
    out: dict[str, Any] = {
        "machine": machine_info(),
        "config": {"warmup_steps": warmup, "window_steps": window, "batch_size": 32, "width": width},
    }
    out.update(advisor.to_dict())
    return out


def _hook_cost_s(calls: int = 20000) -> float:
    """Seconds per training batch that a finished advisor's hooks cost (the overhead outside the window)."""
    from lightning_speedups.callbacks.advisor import SpeedAdvisor

    adv = SpeedAdvisor(warmup_steps=1, window_steps=1, verbose=False)
    adv._done = True  # past its window: the state every batch after the window sees
    t0 = time.perf_counter()
    for i in range(calls):
        adv.on_train_batch_start(None, None, None, i)  # type: ignore[arg-type]
        adv.on_before_backward(None, None, None)  # type: ignore[arg-type]
        adv.on_before_optimizer_step(None, None, None)  # type: ignore[arg-type]
        adv.on_train_batch_end(None, None, None, None, i)  # type: ignore[arg-type]
    return (time.perf_counter() - t0) / calls


def _utilisation_note(summary: dict[str, Any]) -> str:
    """``baseline step <achieved> GFLOP/s = <util>% of an estimated peak of <peak>``, or why there is no utilisation."""
    achieved = summary.get("achieved_flops")
    util = summary.get("utilisation")
    peak = summary.get("peak_flops")
    if achieved is None:
        return "FLOPs not counted"
    head = f"baseline step {achieved / 1e9:.1f} GFLOP/s"
    if util is None or not peak:
        return f"{head}, device peak unknown"
    kind = "an estimated peak" if summary.get("peak_flops_estimated") else "the device's peak"
    text = f"{peak / 1e12:.3g} TFLOP/s" if peak >= 1e12 else f"{peak / 1e9:.3g} GFLOP/s"
    return f"{head} = {util:.1%} of {kind} of {text}"


def run(quick: bool = True) -> list[BenchRow]:
    """Benchmark rows: the advisor's hook overhead outside its window, and each effect it measured on this machine.

    The overhead row's ratio is ``step / (step + hook cost)`` (1.0 = free); its note and ``extra`` also carry the
    baseline step's achieved GFLOP/s and its utilisation against the device's peak (an estimate on CPUs). The effect
    rows are the micro-measured speedups (bf16 matmul, channels_last, fused optimizer step) that the report quotes,
    not end-to-end runs.
    """
    torch.manual_seed(0)
    report = run_advice(quick=quick, verbose=False)
    summary = report["summary"]
    step = summary["step_s"] or float("nan")
    hook = median([_hook_cost_s() for _ in range(3)])
    rows = [
        BenchRow(
            "advisor",
            "hooks outside window",
            "step time",
            step,
            step + hook,
            step / (step + hook),
            unit="s",
            note=f"{1e6 * hook:.2f} us of hook work per batch = {hook / step:.1e} of a baseline step; "
            + _utilisation_note(summary),
            extra={
                "achieved_gflops": None if summary.get("achieved_flops") is None else summary["achieved_flops"] / 1e9,
                "peak_gflops": None if summary.get("peak_flops") is None else summary["peak_flops"] / 1e9,
                "utilisation": summary.get("utilisation"),
                "peak_estimated": summary.get("peak_flops_estimated"),
                "peak_source": summary.get("peak_flops_source"),
            },
        )
    ]
    for f in report["findings"]:
        ev = f["evidence"]
        for key in ("bf16_matmul_speedup", "channels_last_speedup", "fused_step_speedup"):
            if f["measured"] and ev.get(key):
                rows.append(
                    BenchRow("advisor", f["key"], key, 1.0, 1.0 / ev[key], ev[key], note="micro-measured, not e2e")
                )
    return rows + threads_rows(quick)


def threads_rows(quick: bool = True) -> list[BenchRow]:
    """The advisor's CPU-thread finding, quiet and beside one CPU-bound process (started and stopped here).

    Each condition: the advisor's measurement on a model copy (``fewer_threads_speedup``, what its rule reads), then
    full training steps (forward, backward, Adam; DemoClassifier(width=32), batch 32) at torch's threads and at half
    of them, interleaved, medians. Empty with fewer than 2 torch threads.
    """
    from lightning_speedups.benchmarks.batch_size import background_load
    from lightning_speedups.demo import DemoClassifier
    from lightning_speedups.functional.advisor import fewer_threads_speedup
    from lightning_speedups.measure import interleaved_timings, torch_threads

    threads = torch.get_num_threads()
    if threads < 2:
        return []
    fewer = max(1, threads // 2)
    torch.manual_seed(0)
    model = DemoClassifier(width=32)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x = torch.randn(32, 3, 32, 32)
    y = torch.randint(0, 10, (32,))

    def steps(n: int) -> Any:
        def fn() -> None:
            with torch_threads(n):
                for _ in range(3 if quick else 10):
                    opt.zero_grad(set_to_none=True)
                    model.loss_fn(model(x), y).backward()
                    opt.step()

        return fn

    rows = []
    for label, load in (("quiet", contextlib.nullcontext()), ("beside 1 CPU-bound process", background_load())):
        with load:
            measured = fewer_threads_speedup(model, x, fewer)
            reps = interleaved_timings(
                {"current": steps(threads), "fewer": steps(fewer)}, repeats=3 if quick else 7, warmup=1
            )
        base = median(reps["current"])
        cand = median(reps["fewer"])
        said = measured is not None and measured > 1.05
        rows.append(
            BenchRow(
                "advisor",
                f"cpu_threads fix, {label}: {threads} -> {fewer} torch threads",
                "train step time",
                base,
                cand,
                base / cand,
                unit="s",
                note=(
                    f"the advisor measured {float(measured or 0):.2f}x on a model copy and "
                    + ("suggests (apply=True sets) torch.set_num_threads" if said else "stays silent")
                    + "; DemoClassifier(width=32), batch 32, fwd+bwd+Adam, medians of interleaved runs"
                ),
                extra={"advisor_measured": None if measured is None else float(measured), "advisor_says": said},
            )
        )
    return rows


if __name__ == "__main__":  # pragma: no cover
    run_advice(quick=True)
