"""Benchmark (mission tip 4): dense vs mask vs structural pruning: train-step ratio, accuracy after fine-tuning.

All variants start from the same briefly trained dense model, are pruned, then fine-tuned for the same number of steps
on the digits task; the step time is measured interleaved on the pruned models. Print with
``python -m lightning_speedups.benchmarks.pruning`` (add ``--full`` for the longer run).
"""

from __future__ import annotations

import copy
import sys

import torch

from lightning_speedups.benchmarks._common import BenchRow, interleaved_timings, make_train_step, median, speed_ratio
from lightning_speedups.demo import DemoClassifier, load_digits_tensors
from lightning_speedups.functional.pruning import prune_structured, prune_unstructured

__all__ = ["run"]


def _data(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    images, labels = load_digits_tensors()
    x = (images.float() / 255.0 - 0.21) / 0.34
    perm = torch.randperm(len(labels), generator=torch.Generator().manual_seed(seed))
    train, val = perm[360:], perm[:360]
    return x[train], labels[train], x[val], labels[val]


def _train(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, steps: int, lr: float, batch: int = 64) -> None:
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        idx = torch.randint(0, len(y), (batch,), generator=g)
        make_train_step(model, x[idx], y[idx], opt)()


def _accuracy(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    model.eval()
    with torch.no_grad():
        return float((model(x).argmax(1) == y).float().mean())


def run(quick: bool = True) -> list[BenchRow]:
    """Dense vs mask 50% vs structured 30/50/70%: step-time ratio (interleaved medians) and val accuracy."""
    torch.manual_seed(0)
    width, pretrain, finetune, repeats = (16, 100, 60, 3) if quick else (32, 300, 150, 10)
    xt, yt, xv, yv = _data()
    dense = DemoClassifier(width=width)
    _train(dense, xt, yt, pretrain, lr=2e-3)
    example = torch.zeros(1, 3, 32, 32)

    variants: dict[str, torch.nn.Module] = {"dense": copy.deepcopy(dense)}
    masked = copy.deepcopy(dense)
    prune_unstructured(masked, 0.5)
    variants["mask 50%"] = masked
    for amount in (0.3, 0.5, 0.7):
        model = copy.deepcopy(dense)
        prune_structured(model, example, amount)
        variants[f"structured {int(amount * 100)}%"] = model

    accuracy = {}
    for name, model in variants.items():
        _train(model, xt, yt, finetune, lr=1e-3)  # same fine-tune for every variant, dense included
        accuracy[name] = _accuracy(model, xv, yv)

    xb, yb = xt[:64], yt[:64]
    steps = {n: make_train_step(m, xb, yb, torch.optim.Adam(m.parameters())) for n, m in variants.items()}
    times = interleaved_timings(steps, repeats=repeats, warmup=1)
    rows = []
    for name in variants:
        if name == "dense":
            continue
        ratio = speed_ratio(times["dense"], times[name])
        params = sum(p.numel() for p in variants[name].parameters())
        note = f"{params:,} params; fine-tuned {finetune} steps after pruning"
        if ratio < 1.05:
            note = f"no speedup{' (masks keep dense kernels)' if name.startswith('mask') else ''}; {note}"
        rows.append(
            BenchRow(
                technique="pruning",
                variant=f"{name} vs dense (width={width})",
                metric="train step time (batch 64)",
                baseline=median(times["dense"]),
                candidate=median(times[name]),
                ratio=ratio,
                unit="s",
                accuracy_baseline=accuracy["dense"],
                accuracy_candidate=accuracy[name],
                note=note,
                extra={"pretrain_steps": pretrain, "finetune_steps": finetune, "params": params},
            )
        )
    return rows


if __name__ == "__main__":  # pragma: no cover
    from lightning_speedups.benchmarks._common import machine_info

    print(machine_info())
    for row in run(quick="--full" not in sys.argv):
        print(
            f"{row.variant:<36} {row.ratio:5.2f}x  acc {row.accuracy_baseline:.3f} -> {row.accuracy_candidate:.3f}"
            f"  ({row.note})"
        )
