"""The most autotune's step-time candidates could gain on each workload of the suite, on this machine: an oracle.

autotune's targets (1.5x on the median held-out task) are judged on time to the target. Where a target is missed, the
question is whether the trials chose badly or whether nothing on this hardware is worth that much. This bench answers
the second: per task (seed 0, its own module, optimizer and first training batch), the training step the fit runs is
timed interleaved, A B C A B C, under each candidate autotune can keep (bf16 autocast where the CPU has bf16 units,
channels_last for 4-D inputs, the optimizer's fused or foreach kernel), then under the best combination of them, then
compiled (``torch.compile`` of that combination, its compile seconds measured cold); the loader's own seconds per batch
(the per-sample work a data-path candidate could remove) are timed apart.

The oracle knows the best combination without trials, removes the loader's time altogether, and pays only the compile
where compiling wins over the steps the baseline needed to reach the target (``steps_to_target``, the median of the
committed baseline rows). Its ratio is an upper bound on a first run's time to target, for three reasons it leaves
out: a real data path still costs something, trials cost time, and Lightning's own per-step work (hooks, logging)
adds to both sides. ``ceiling`` allows bf16, ``ceiling_fp32`` does not (``no_bf16=True``); ``ceiling_batch`` also lets
a doubled batch gain its per-sample speed (optimistic: it assumes the doubled batch needs no more samples). Methods that
change how many steps the run needs (EMA, schedules, the learning rate) are not candidates here: the suite showed them
slowing held-out tasks (docs/evidence.md, Workloads).

Run: ``python -m benchmarks.workloads_ceiling --json docs/_data/workloads_ceiling.json [--tasks
a,b] [--baselines docs/_data] [--rounds 9]``. Timing: nothing else may run on the machine meanwhile.
"""

from __future__ import annotations

import math
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import lightning as L
import torch

from benchmarks._rows import comma_list, read_rows, write_rows
from benchmarks.workloads import get_workload, list_workloads, trainer_kwargs
from benchmarks.workloads._registry import Workload
from lightning_speedups._errors import SpeedupConfigError, check_bool, check_int
from lightning_speedups._inputs import first_batch, flat_tensors
from lightning_speedups._peak import cpu_bf16_units
from lightning_speedups.autotune.optim import trial_optimizer, with_implementation
from lightning_speedups.autotune.trials import TrialContext, make_step
from lightning_speedups.autotune.tune import planned_steps
from lightning_speedups.measure import machine_info, median_interval
from lightning_speedups.measure.models import model_copy
from lightning_speedups.measure.timing import interleaved_timings

__all__ = ["ROW_KEYS", "ceilings", "format_summary", "main", "run_suite", "steps_to_target"]

ROW_KEYS = (
    "task",
    "kind",
    "split",
    "steps_to_target",
    "planned_steps",
    "loader_s",
    "step_s",
    "ratios",
    "best",
    "best_fp32",
    "compiled",
    "ceiling",
    "ceiling_fp32",
    "ceiling_loader",
    "ceiling_batch",
    "bf16_units",
    "machine",
    "notes",
)
SINGLES: dict[str, dict[str, Any]] = {
    "bf16": {"precision": "bf16-mixed"},
    "channels_last": {"channels_last": True},
    "fused": {"implementation": "fused"},
    "foreach": {"implementation": "foreach"},
    "batch_x2": {"batch_scale": 2},  # timed per sample: its step holds twice the samples
}
LOADER_BATCHES = 20  # batches the loader's own time is the median of
HELPS = 1.02  # a candidate joins the oracle's combination when its median ratio is at least this


def steps_to_target(task: str, baseline_rows: Iterable[dict[str, Any]]) -> int | None:
    """The median over ``baseline_rows`` (the workload bench's rows: ``method == "baseline"`` of ``task`` that reached
    the target) of the steps the run took to the target, ``steps`` scaled by the share of the training seconds spent
    until then; ``None`` where no such row exists.

    Example::

        >>> rows = [{"task": "t", "method": "baseline", "steps": 400, "train_s": 40.0, "time_to_target_s": 10.0},
        ...         {"task": "t", "method": "baseline", "steps": 400, "train_s": 40.0, "time_to_target_s": 30.0}]
        >>> steps_to_target("t", rows)
        200
    """
    steps = [
        r["steps"] * r["time_to_target_s"] / r["train_s"]
        for r in baseline_rows
        if r.get("task") == task
        and r.get("method") == "baseline"
        and r.get("time_to_target_s") is not None
        and r.get("steps")
        and r.get("train_s")
    ]
    return round(statistics.median(steps)) if steps else None


def ceilings(row: dict[str, Any]) -> dict[str, float]:
    """The oracle's time-to-target ratios of a measured ``row`` (see the module docstring): ``ceiling`` (bf16 allowed
    where measured), ``ceiling_fp32``, ``ceiling_loader`` (as ``ceiling``, the loader's time kept: what is left where
    the data cannot move to the device) and ``ceiling_batch``.

    Example::

        >>> row = {"steps_to_target": 100, "loader_s": 0.01, "step_s": {"fp32": 0.1, "batch_x2": 0.16},
        ...        "best": {"step_s": 0.05}, "best_fp32": {"step_s": 0.1},
        ...        "compiled": {"best": {"step_s": 0.04, "compile_s": 5.0}}}
        >>> {k: round(v, 2) for k, v in ceilings(row).items()}
        {'ceiling': 2.2, 'ceiling_fp32': 1.1, 'ceiling_loader': 1.83, 'ceiling_batch': 2.75}
    """
    n = row["steps_to_target"]
    loader = row["loader_s"]
    base = row["step_s"]["fp32"] + loader
    out = {}
    for key, combo, kept in (
        ("ceiling", "best", 0.0),
        ("ceiling_fp32", "best_fp32", 0.0),
        ("ceiling_loader", "best", loader),
    ):
        seconds = n * (row[combo]["step_s"] + kept)
        compiled = row["compiled"].get(combo)
        if compiled is not None:
            seconds = min(seconds, n * (compiled["step_s"] + kept) + compiled["compile_s"])
        out[key] = n * base / seconds
    per_sample = row["step_s"]["fp32"] / (row["step_s"]["batch_x2"] / 2) if "batch_x2" in row["step_s"] else 1.0
    out["ceiling_batch"] = out["ceiling"] * max(per_sample, 1.0)
    return out


def _loader_seconds(loader: Any, batches: int) -> float:
    """Median seconds the loader takes to hand over one batch (its per-sample work), the RNG left as it was."""
    times = []
    with torch.random.fork_rng(devices=[]):
        it = iter(loader)
        next(it)  # the iterator's own start-up (workers, shuffling) is not a per-step cost
        for _ in range(batches):
            t0 = time.perf_counter()
            try:
                next(it)
            except StopIteration:
                break
            times.append(time.perf_counter() - t0)
    return statistics.median(times) if times else 0.0


def _kernel_applies(model: torch.nn.Module, planned: int, implementation: str) -> bool:
    optimizer, _ = trial_optimizer(model_copy(model, train=True), planned)
    return optimizer is not None and with_implementation(optimizer, implementation) is not optimizer


def _singles(ctx: TrialContext, no_bf16: bool) -> dict[str, dict[str, Any]]:
    """The candidates that can change this task's step on this machine."""
    out = {}
    for name, plan in SINGLES.items():
        if name == "bf16" and (no_bf16 or cpu_bf16_units() is None):
            continue
        if name == "channels_last" and not any(t.dim() == 4 and t.is_floating_point() for t in flat_tensors(ctx.batch)):
            continue
        if name in ("fused", "foreach") and not _kernel_applies(ctx.model, ctx.planned_steps, name):
            continue
        out[name] = plan
    return out


def _time(steps: dict[str, Callable[[], None]], rounds: int) -> tuple[dict[str, float], dict[str, list[float]]]:
    """Median seconds of each step and its per-round ratios against the first one (``[median, low, high]``)."""
    times = interleaved_timings(steps, repeats=rounds, warmup=1, sync=False)
    reference = times[next(iter(steps))]
    ratios = {}
    for name, ts in times.items():
        per_round = [b / c for b, c in zip(reference, ts, strict=True)]
        lo, hi = median_interval(per_round)
        ratios[name] = [statistics.median(per_round), lo, hi]
    return {name: statistics.median(ts) for name, ts in times.items()}, ratios


def _combo(singles: dict[str, dict[str, Any]], ratios: dict[str, list[float]], allow_bf16: bool) -> dict[str, Any]:
    """Every single that helped (median ratio >= :data:`HELPS`), the faster optimizer kernel only."""
    plan: dict[str, Any] = {}
    kernels = [n for n in ("fused", "foreach") if n in singles and ratios[n][0] >= HELPS]
    for name in singles:
        if name == "batch_x2" or ratios[name][0] < HELPS or (name == "bf16" and not allow_bf16):
            continue
        if name in kernels and name != max(kernels, key=lambda k: ratios[k][0]):
            continue
        plan.update(singles[name])
    return plan


def _compiled(ctx: TrialContext, plan: dict[str, Any], rounds: int) -> dict[str, Any]:
    """``plan``'s step compiled as the fit's ``TorchCompile`` compiles it: its compile seconds (the first call, cold,
    less one eager step) and its median step against the eager one."""
    eager = make_step(ctx, plan)
    eager()  # first-call costs
    t0 = time.perf_counter()
    eager()
    eager_s = time.perf_counter() - t0
    step = make_step(ctx, {**plan, "compile": True})
    t0 = time.perf_counter()
    step()  # compiles
    compile_s = max(time.perf_counter() - t0 - eager_s, 0.0)
    medians, ratios = _time({"eager": eager, "compiled": step}, rounds)
    return {"plan": plan, "compile_s": compile_s, "step_s": medians["compiled"], "vs_eager": ratios["compiled"]}


def measure_task(
    w: Workload, steps: int | None, rounds: int = 9, no_bf16: bool = False, small: bool = False, compile: bool = True
) -> dict[str, Any]:
    """One row: the task's step under every candidate and the oracle's combinations (see the module docstring)."""
    L.seed_everything(0, verbose=False)
    model, data = w.build(0, small=small)
    if isinstance(data, L.LightningDataModule):
        data.setup("fit")
        loader = data.train_dataloader()
    else:
        loader = data if data is not None else model.train_dataloader()
    planned = planned_steps(loader, trainer_kwargs(w))  # as autotune counts the planned run
    notes = [] if steps is not None else ["no baseline row: the whole planned run counted as the steps to target"]
    batch = first_batch(loader)
    ctx = TrialContext(model, batch, torch.device("cpu"), planned, 0.05, math.inf, {})
    singles = _singles(ctx, no_bf16)
    step_s, ratios = _time({"fp32": make_step(ctx, {}), **{n: make_step(ctx, p) for n, p in singles.items()}}, rounds)
    best = _combo(singles, ratios, True)
    best_fp32 = _combo(singles, ratios, False)
    combos = {"best": best} if best == best_fp32 else {"best": best, "best_fp32": best_fp32}
    _, combo_ratios = _time({"fp32": make_step(ctx, {}), **{n: make_step(ctx, p) for n, p in combos.items()}}, rounds)
    row: dict[str, Any] = {
        "task": w.name,
        "kind": w.kind,
        "split": w.split,
        "steps_to_target": steps or planned,
        "planned_steps": planned,
        "loader_s": _loader_seconds(loader, LOADER_BATCHES),
        "step_s": step_s,
        "ratios": ratios,
        "bf16_units": cpu_bf16_units() if not no_bf16 else None,
        "machine": machine_info(),
        "notes": notes,
        "compiled": {},
    }
    for key in ("best", "best_fp32"):
        name = key if key in combos else "best"
        # the combination's step relative to this group's own fp32 step, carried onto the singles' fp32 step
        row[key] = {"plan": combos[name], "step_s": step_s["fp32"] / combo_ratios[name][0], "ratio": combo_ratios[name]}
    if compile:
        before = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
        with tempfile.TemporaryDirectory() as cache:  # a cold compile, as a user's first run has it
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
            try:
                for key, plan in combos.items():
                    c = _compiled(ctx, plan, rounds)
                    c["step_s"] = row[key]["step_s"] / c["vs_eager"][0]
                    row["compiled"][key] = c
                if "best_fp32" not in combos:
                    row["compiled"]["best_fp32"] = row["compiled"]["best"]
            finally:
                if before is None:
                    os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
                else:
                    os.environ["TORCHINDUCTOR_CACHE_DIR"] = before
    row.update(ceilings(row))
    return row


def run_suite(
    tasks: Sequence[str] | None = None,
    json_path: str | Path | None = None,
    baselines: str | Path | None = None,
    rounds: int = 9,
    no_bf16: bool = False,
    small: bool = False,
    compile: bool = True,
    echo: bool = True,
) -> list[dict[str, Any]]:
    """One row per task (default: every registered one), written to ``json_path`` after each; a task already there is
    skipped. ``baselines``: a folder of the workload bench's JSON files (``workloads*.json``) to read the steps to
    the target from.

    Raises:
        SpeedupConfigError: an unknown task, a bad ``rounds`` or a ``baselines`` folder that does not exist, before
            anything runs.
    """
    check_int("rounds", rounds, 3, hint="interleaved rounds per comparison, e.g. 9")
    for name, flag in (("no_bf16", no_bf16), ("small", small), ("compile", compile)):
        check_bool(name, flag)
    workloads = [get_workload(n) for n in (tasks or list_workloads())]
    base_rows: list[dict[str, Any]] = []
    if baselines is not None:
        folder = Path(baselines)
        if not folder.is_dir():
            raise SpeedupConfigError(
                f"`baselines`={str(baselines)!r} is not a folder. Allowed values: a folder holding the workload "
                "bench's JSON files (e.g. 'docs/_data'), or None to count the whole planned run."
            )
        for path in sorted(folder.glob("workloads*.json")):
            base_rows += [r for r in read_rows(path, ("task",)) if "steps" in r]
    path = Path(json_path) if json_path is not None else None
    rows = read_rows(path, ("task",)) if path is not None else []
    for w in workloads:
        if any(r["task"] == w.name for r in rows):
            continue
        rows.append(measure_task(w, steps_to_target(w.name, base_rows), rounds, no_bf16, small, compile))
        if path is not None:
            write_rows(path, rows)
        if echo:
            print(f"[workloads_ceiling] {_line(rows[-1])}", flush=True)
    names = {w.name for w in workloads}
    return [r for r in rows if r["task"] in names]


def _ratio(values: Sequence[float] | None) -> str:
    return "-" if values is None else f"{values[0]:.2f}x"


def _plan_words(plan: dict[str, Any]) -> str:
    words = {"precision": "bf16", "channels_last": "channels_last", "implementation": None}
    return " + ".join(str(v) if words[k] is None else words[k] for k, v in plan.items() if k in words) or "fp32"


def _compiled_words(row: dict[str, Any], key: str) -> str:
    c = row["compiled"].get(key)
    return "-" if c is None else f"{c['vs_eager'][0]:.2f}x after {c['compile_s']:.0f} s"


def _per_sample(row: dict[str, Any]) -> str:
    """A doubled batch's samples/s against the user's batch (its step holds twice the samples)."""
    step_s = row["step_s"]
    return f"{step_s['fp32'] * 2 / step_s['batch_x2']:.2f}x" if "batch_x2" in step_s else "-"


def _line(row: dict[str, Any]) -> str:
    singles = ", ".join(f"{n} {_ratio(r)}" for n, r in row["ratios"].items() if n not in ("fp32", "batch_x2"))
    singles += f", batch x2 {_per_sample(row)} per sample"
    return (
        f"{row['task']}: fp32 step {row['step_s']['fp32'] * 1e3:.1f} ms, loader {row['loader_s'] * 1e3:.1f} ms; "
        f"{singles}; best {_plan_words(row['best']['plan'])} {_ratio(row['best']['ratio'])}, compiled "
        f"{_compiled_words(row, 'best')}; ceiling {row['ceiling']:.2f}x (fp32 {row['ceiling_fp32']:.2f}x, "
        f"loader kept {row['ceiling_loader']:.2f}x, batch {row['ceiling_batch']:.2f}x) over "
        f"{row['steps_to_target']} steps"
    )


def format_summary(rows: Sequence[dict[str, Any]]) -> str:
    """A markdown table, one row per task, and a line per split with the median ceilings."""
    lines = [
        "| task | split | steps to target | fp32 step, loader (ms) | bf16 | channels_last | optimizer kernel | "
        "batch x2 per sample | best eager | compiled (its step, compile s) | ceiling | ceiling fp32 | "
        "ceiling, loader kept | ceiling with batch x2 |",
        "|" + "---|" * 14,
    ]
    for r in rows:
        ratios = r["ratios"]
        kernels = [f"{n} {_ratio(ratios[n])}" for n in ("fused", "foreach") if n in ratios]
        lines.append(
            f"| {r['task']} | {r['split']} | {r['steps_to_target']} | {r['step_s']['fp32'] * 1e3:.1f}, "
            f"{r['loader_s'] * 1e3:.1f} | {_ratio(ratios.get('bf16'))} | {_ratio(ratios.get('channels_last'))} | "
            f"{', '.join(kernels) or '-'} | {_per_sample(r)} | {_plan_words(r['best']['plan'])} "
            f"{_ratio(r['best']['ratio'])} | {_compiled_words(r, 'best')} | {r['ceiling']:.2f}x | "
            f"{r['ceiling_fp32']:.2f}x | {r['ceiling_loader']:.2f}x | {r['ceiling_batch']:.2f}x |"
        )
    for split in ("held_out", "dev"):
        picked = [r for r in rows if r["split"] == split]
        if picked:
            keys = ("ceiling", "ceiling_fp32", "ceiling_loader", "ceiling_batch")
            med = {k: statistics.median(r[k] for r in picked) for k in keys}
            lines.append(
                f"\nMedian over the {len(picked)} {split.replace('_', '-')} tasks: ceiling "
                f"{med['ceiling']:.2f}x, fp32 {med['ceiling_fp32']:.2f}x, loader kept "
                f"{med['ceiling_loader']:.2f}x, with a doubled batch "
                f"{med['ceiling_batch']:.2f}x."
            )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m benchmarks.workloads_ceiling``: measure and print the table."""
    import argparse

    parser = argparse.ArgumentParser(description="The most autotune's candidates could gain per workload (an oracle).")
    parser.add_argument("--json", metavar="PATH", help="rows, rewritten after each one; a re-run resumes from it")
    parser.add_argument("--tasks", metavar="NAMES", help=f"comma-separated, from {', '.join(list_workloads())}")
    parser.add_argument(
        "--baselines",
        metavar="DIR",
        default=None,
        help="folder of the workload JSON files (steps to target), e.g. docs/_data",
    )
    parser.add_argument("--rounds", type=int, default=9, help="interleaved rounds per comparison (default 9)")
    parser.add_argument("--no-bf16", action="store_true", help="keep bf16 out (a CPU without bf16 units)")
    parser.add_argument("--no-compile", action="store_true", help="leave torch.compile out")
    parser.add_argument("--small", action="store_true", help="smoke test: the workloads' small builds")
    args = parser.parse_args(argv)
    tasks = comma_list(args.tasks)
    try:
        rows = run_suite(tasks, args.json, args.baselines, args.rounds, args.no_bf16, args.small, not args.no_compile)
    except SpeedupConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(format_summary(rows))
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
