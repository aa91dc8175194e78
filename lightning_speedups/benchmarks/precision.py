"""Benchmark: bf16 autocast vs fp32 train step on the demo conv net (way 9: precision on this hardware)."""

from __future__ import annotations

import copy

import torch

from lightning_speedups.benchmarks._common import BenchRow
from lightning_speedups.demo import DemoClassifier, load_digits_tensors
from lightning_speedups.measure import interleaved_timings, make_train_step, median, speed_ratio

__all__ = ["run"]


def _accuracy_after_training(dtype: torch.dtype | None, steps: int, seed: int = 0) -> float:
    """Train one model from a fixed seed for ``steps`` batches in the given precision; return val accuracy (fp32)."""
    images, labels = load_digits_tensors()
    x = (images.float() / 255.0 - 0.21) / 0.34
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(len(labels), generator=g)
    train = perm[360:]
    val = perm[:360]
    torch.manual_seed(seed)
    model = DemoClassifier(width=16)
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    for i in range(steps):
        idx = train[(i * 64) % (len(train) - 64) :][:64]
        make_train_step(model, x[idx], labels[idx], opt, dtype)()
    model.eval()
    with torch.no_grad():
        return float((model(x[val]).argmax(1) == labels[val]).float().mean())


def run(quick: bool = True) -> list[BenchRow]:
    """fp32 vs bf16-mixed: train-step ratio (interleaved medians) and accuracy after the same number of steps."""
    torch.manual_seed(0)
    base = DemoClassifier(width=16 if quick else 32)
    cand = copy.deepcopy(base)
    x = torch.randn(64, 3, 32, 32)
    y = torch.randint(0, 10, (64,))
    times = interleaved_timings(
        {"fp32": make_train_step(base, x, y), "bf16": make_train_step(cand, x, y, autocast_dtype=torch.bfloat16)},
        repeats=3 if quick else 15,
        warmup=1,
    )
    steps = 30 if quick else 200
    acc32 = _accuracy_after_training(None, steps)
    acc16 = _accuracy_after_training(torch.bfloat16, steps)
    ratio = speed_ratio(times["fp32"], times["bf16"])
    note = "this CPU has bf16 units (AMX/AVX512-BF16)" if ratio > 1.1 else "no bf16 units: emulated, slower"
    return [
        BenchRow(
            technique="precision",
            variant="bf16-mixed vs 32-true",
            metric="train step time",
            baseline=median(times["fp32"]),
            candidate=median(times["bf16"]),
            ratio=ratio,
            unit="s",
            accuracy_baseline=acc32,
            accuracy_candidate=acc16,
            note=f"{note}; accuracy after {steps} steps each",
        )
    ]


if __name__ == "__main__":  # pragma: no cover
    from lightning_speedups.benchmarks.runner import bench_main

    bench_main(run)
