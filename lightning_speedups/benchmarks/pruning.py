"""Benchmark: dense vs mask vs structural pruning: train-step ratio, accuracy after fine-tuning.

All variants start from the same dense model (trained briefly with a cosine schedule), are pruned one-shot, then every
variant -- the dense one included -- is fine-tuned for the same number of steps with the same cosine schedule on the
digits task (32x32 images, width-32 demo CNN, whose 50% pruned channel counts 16/32/64 stay multiples of 8). The step
time is measured interleaved on the fine-tuned models at torch's default threads and again on 1 thread. Print with
``python -m lightning_speedups.benchmarks.pruning`` (add ``--full`` for the longer run).
"""

from __future__ import annotations

import copy
import math

import torch

from lightning_speedups.benchmarks._common import BenchRow
from lightning_speedups.demo import DemoClassifier, load_digits_tensors
from lightning_speedups.functional.pruning import prune_structured, prune_unstructured
from lightning_speedups.measure import interleaved_timings, make_train_step, median, speed_ratio, torch_threads

__all__ = ["run"]


def _data(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    images, labels = load_digits_tensors()
    x = (images.float() / 255.0 - 0.21) / 0.34
    perm = torch.randperm(len(labels), generator=torch.Generator().manual_seed(seed))
    train = perm[360:]
    val = perm[:360]
    return x[train], labels[train], x[val], labels[val]


def _train(
    model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, steps: int, lr: float, batch: int = 32, seed: int = 1
) -> None:
    """``steps`` Adam steps on random batches, LR decayed from ``lr`` to 0 on a cosine."""
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5 * (1.0 + math.cos(math.pi * min(s, steps) / steps)))
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        idx = torch.randint(0, len(y), (batch,), generator=g)
        make_train_step(model, x[idx], y[idx], opt)()
        sched.step()


def _accuracy(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    model.eval()
    with torch.no_grad():
        return float((model(x).argmax(1) == y).float().mean())


def _step_times(
    variants: dict[str, torch.nn.Module], x: torch.Tensor, y: torch.Tensor, repeats: int, threads: int | None
) -> dict[str, list[float]]:
    """Interleaved train-step times of every variant, on ``threads`` torch threads (``None`` = unchanged)."""
    with torch_threads(threads):
        steps = {n: make_train_step(m, x, y, torch.optim.Adam(m.parameters(), lr=1e-5)) for n, m in variants.items()}
        return interleaved_timings(steps, repeats=repeats, warmup=1)


def run(quick: bool = True) -> list[BenchRow]:
    """Dense vs mask 50% vs structured 50% (full mode adds 30/70%): step-time ratio and val accuracy.

    Quick mode (about 15 s on 2 idle cores) times at torch's default threads only; full mode also on 1 thread.
    """
    # long: a benchmark script: one measurement after another, read top to bottom
    torch.manual_seed(0)
    width = 32
    pretrain, finetune, lr, repeats = (80, 60, 3e-3, 3) if quick else (150, 150, 2e-3, 10)
    xt, yt, xv, yv = _data()
    dense = DemoClassifier(width=width)
    _train(dense, xt, yt, pretrain, lr=3e-3)
    pretrained_acc = _accuracy(dense, xv, yv)
    example = torch.zeros(1, 3, 32, 32)

    variants: dict[str, torch.nn.Module] = {"dense": copy.deepcopy(dense)}
    masked = copy.deepcopy(dense)
    prune_unstructured(masked, 0.5)
    variants["mask 50%"] = masked
    for amount in (0.5,) if quick else (0.3, 0.5, 0.7):
        model = copy.deepcopy(dense)
        prune_structured(model, example, amount, importance="l2")
        variants[f"structured {int(amount * 100)}%"] = model

    accuracy = {}
    for name, model in variants.items():
        _train(model, xt, yt, finetune, lr=lr, seed=2)  # same fine-tune for every variant, dense included
        accuracy[name] = _accuracy(model, xv, yv)

    xb = xt[:64]
    yb = yt[:64]
    threads = torch.get_num_threads()
    times = _step_times(variants, xb, yb, repeats, None)
    times_1 = times if threads == 1 or quick else _step_times(variants, xb, yb, repeats, 1)
    rows = []
    for name in variants:
        if name == "dense":
            continue
        ratio = speed_ratio(times["dense"], times[name])
        ratio_1 = speed_ratio(times_1["dense"], times_1[name])
        params = sum(p.numel() for p in variants[name].parameters())
        note = f"{params:,} params; {finetune} fine-tune steps for dense and pruned alike"
        if times_1 is not times:
            note = f"1 thread: {ratio_1:.2f}x; {note}"
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
                extra={
                    "pretrain_steps": pretrain,
                    "pretrained_accuracy": pretrained_acc,
                    "finetune_steps": finetune,
                    "finetune_lr": lr,
                    "params": params,
                    "threads": threads,
                    "ratio_1_thread": ratio_1 if times_1 is not times or threads == 1 else None,
                },
            )
        )
    return rows


if __name__ == "__main__":  # pragma: no cover
    from lightning_speedups.benchmarks.runner import bench_main

    bench_main(run)
