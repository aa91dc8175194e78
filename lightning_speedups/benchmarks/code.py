"""Benchmark: code-level speedups. channels_last vs contiguous (NCHW), and torch.compile (inductor) vs eager.

* channels_last: the same conv net (``DemoClassifier``) and batch, one copy converted with ``apply_channels_last`` and
  fed channels_last inputs; interleaved train steps (forward, backward, Adam). Outputs are compared (the layout does
  not change the math); full mode also trains both for one epoch on the digits and reports the accuracy.
* torch.compile: the same model compiled in place (``compile_model``, inductor, mode="default") vs eager. The compile
  time (first step minus a steady step) is reported separately from the steady-state step time. Quick mode compiles
  a small MLP (a conv net with BatchNorm takes about a minute to compile on 2 CPU cores); full mode also compiles
  the conv net.

Run: ``python -m lightning_speedups.benchmarks.code`` (``--full`` for the longer run; ``--threads N`` to set torch's
intra-op threads).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable

import torch
from torch import nn

from lightning_speedups.benchmarks._common import BenchRow
from lightning_speedups.measure import interleaved_timings, median, speed_ratio

__all__ = ["run", "run_channels_last", "run_compile"]


def _stepper(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> Callable[[int], None]:
    """``fn(n)`` runs ``n`` train steps (forward, backward, Adam) of ``model`` on one fixed batch."""
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    def fn(steps: int) -> None:
        for _ in range(steps):
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()

    return fn


def _digits_accuracy(model: nn.Module, channels_last: bool, epochs: int = 1, batch_size: int = 64) -> float:
    """Train ``model`` on 80% of the digits (fixed order) and return its accuracy on the rest."""
    from lightning_speedups.demo import load_digits_tensors

    images, labels = load_digits_tensors(size=32, channels=3)
    x_all = (images.float() / 255 - 0.3053) / 0.3235
    g = torch.Generator().manual_seed(0)
    perm = torch.randperm(len(x_all), generator=g)
    n_train = int(0.8 * len(perm))
    tr = perm[:n_train]
    va = perm[n_train:]
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(epochs):
        for i in range(0, n_train - batch_size + 1, batch_size):
            idx = tr[i : i + batch_size]
            loss = nn.functional.cross_entropy(model(x_all[idx].contiguous(memory_format=fmt)), labels[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    model.eval()
    with torch.no_grad():
        pred = model(x_all[va].contiguous(memory_format=fmt)).argmax(1)
    return float((pred == labels[va]).float().mean())


def run_channels_last(quick: bool = True) -> list[BenchRow]:
    """channels_last vs contiguous train step of ``DemoClassifier`` (quick: width 16, batch 64; full: width 32).

    Returns:
        One row (train step, samples/s; full mode adds an inference row and the digits accuracy of both).
    """
    # long: a benchmark script: one measurement after another, read top to bottom
    from lightning_speedups.demo import DemoClassifier
    from lightning_speedups.functional.channels_last import apply_channels_last

    width, batch, repeats, steps = (16, 64, 5, 2) if quick else (32, 128, 9, 3)
    torch.manual_seed(0)
    base = DemoClassifier(width=width)
    cand = copy.deepcopy(base)
    apply_channels_last(cand)
    x = torch.randn(batch, 3, 32, 32)
    y = torch.randint(0, 10, (batch,))
    x_cl = x.contiguous(memory_format=torch.channels_last)
    with torch.no_grad():
        diff = float((base.eval()(x) - cand.eval()(x_cl)).abs().max())
    base.train()
    cand.train()
    step_base = _stepper(base, x, y)
    step_cand = _stepper(cand, x_cl, y)
    times = interleaved_timings(
        {"nchw": lambda: step_base(steps), "nhwc": lambda: step_cand(steps)}, repeats=repeats, warmup=1
    )
    acc_base = acc_cand = None
    note = f"DemoClassifier(width={width}), batch {batch}, fwd+bwd+Adam; max |output diff| {diff:.1e}"
    if not quick:
        torch.manual_seed(1)
        fresh = DemoClassifier(width=8)
        fresh_cl = copy.deepcopy(fresh)
        apply_channels_last(fresh_cl)
        acc_base = _digits_accuracy(fresh, channels_last=False, epochs=3)
        acc_cand = _digits_accuracy(fresh_cl, channels_last=True, epochs=3)
        note += "; accuracy: digits, 3 epochs, width 8, same init and order"
    else:
        note += " (same math: accuracy measured in full mode)"
    samples = batch * steps
    rows = [
        BenchRow(
            technique="channels_last",
            variant="train step: channels_last vs NCHW",
            metric="samples/s",
            baseline=samples / median(times["nchw"]),
            candidate=samples / median(times["nhwc"]),
            ratio=speed_ratio(times["nchw"], times["nhwc"]),
            unit="samples/s",
            accuracy_baseline=acc_base,
            accuracy_candidate=acc_cand,
            note=note,
            extra={"max_output_diff": diff, "width": width, "batch": batch},
        )
    ]
    if not quick:
        base.eval()
        cand.eval()

        def infer(model: nn.Module, inp: torch.Tensor) -> Callable[[], None]:
            def fn() -> None:
                with torch.inference_mode():
                    for _ in range(steps):
                        model(inp)

            return fn

        t = interleaved_timings({"nchw": infer(base, x), "nhwc": infer(cand, x_cl)}, repeats=repeats, warmup=1)
        rows.append(
            BenchRow(
                technique="channels_last",
                variant="inference: channels_last vs NCHW",
                metric="samples/s",
                baseline=samples / median(t["nchw"]),
                candidate=samples / median(t["nhwc"]),
                ratio=speed_ratio(t["nchw"], t["nhwc"]),
                unit="samples/s",
                note=f"DemoClassifier(width={width}), batch {batch}, eval, inference_mode",
            )
        )
    return rows


def _compile_row(name: str, make: Callable[[], nn.Module], x: torch.Tensor, repeats: int, steps: int) -> BenchRow:
    from lightning_speedups.functional.compile import compile_model

    torch.manual_seed(0)
    eager = make()
    compiled = copy.deepcopy(eager)
    y = torch.randint(0, 10, (x.shape[0],))
    compile_model(compiled)  # inductor, mode="default"
    start = time.perf_counter()
    out = compiled(x)  # compiles the forward ...
    nn.functional.cross_entropy(out, y).backward()  # ... and, lazily, the backward
    first = time.perf_counter() - start
    diff = float((eager(x) - out).detach().abs().max())  # same weights: the compiled kernels' numerical difference
    # zero_grad drops the grads above
    step_eager = _stepper(eager, x, y)
    step_compiled = _stepper(compiled, x, y)
    times = interleaved_timings(
        {"eager": lambda: step_eager(steps), "compiled": lambda: step_compiled(steps)}, repeats=repeats, warmup=1
    )
    compile_s = max(first - median(times["compiled"]) / steps, 0.0)
    samples = x.shape[0] * steps
    base_t = median(times["eager"])
    cand_t = median(times["compiled"])
    break_even = compile_s / max(base_t / steps - cand_t / steps, 1e-12) if base_t > cand_t else float("inf")
    return BenchRow(
        technique="compile",
        variant=f"train step: inductor vs eager ({name})",
        metric="samples/s",
        baseline=samples / base_t,
        candidate=samples / cand_t,
        ratio=speed_ratio(times["eager"], times["compiled"]),
        unit="samples/s",
        note=(
            f"{name}, batch {x.shape[0]}, fwd+bwd+Adam (optimizer eager); compile {compile_s:.1f} s"
            + (f", pays off after ~{break_even:.0f} steps" if break_even != float("inf") else ", never pays off")
            + f"; max |output diff| {diff:.1e}"
        ),
        extra={"compile_seconds": compile_s, "break_even_steps": break_even},
    )


def run_compile(quick: bool = True) -> list[BenchRow]:
    """Compiled (inductor) vs eager steady-state train step, compile time reported separately.

    Quick mode compiles ``DemoMLP(hidden=(256,))`` (about 10 s on 2 cores with a cold cache); full mode also
    compiles ``DemoClassifier(width=16)`` (about a minute, BatchNorm in training mode makes many kernels).
    """
    from lightning_speedups.demo import DemoClassifier, DemoMLP

    repeats, steps = (5, 3) if quick else (9, 5)
    x = torch.randn(64, 3, 32, 32)
    rows = [_compile_row("DemoMLP(hidden=(256,))", lambda: DemoMLP(hidden=(256,)), x, repeats, steps)]
    if not quick:
        rows.append(_compile_row("DemoClassifier(width=16)", lambda: DemoClassifier(width=16), x, repeats, steps))
    return rows


def run(quick: bool = True) -> list[BenchRow]:
    """Both benchmarks of this module (channels_last, then torch.compile)."""
    return run_channels_last(quick) + run_compile(quick)


if __name__ == "__main__":  # pragma: no cover
    from lightning_speedups.benchmarks.runner import bench_main

    bench_main(run)
