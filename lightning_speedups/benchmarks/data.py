"""Benchmark: data on the device (DeviceDataLoader + BatchAugment) vs a DataLoader with per-sample v2 transforms.

Same data (generated CIFAR-shaped shapes, uint8 3x32x32), same augmentation (pad-4 random crop, horizontal flip,
normalise), batch 256. Measured, interleaved (A B A B ...): samples/s of the data pipeline alone (one epoch), and
samples/s of a full train step (forward, backward, Adam) of the demo model fed by each pipeline. The accuracy cost is
measured in full mode by training the same small model for two epochs with each pipeline (mean of two seeds).

Run: ``python -m lightning_speedups.benchmarks.data`` (add ``--full`` for the longer run, ``--threads N`` to set
torch's intra-op threads: on a machine shared with other jobs, 1 thread avoids OpenMP threads waiting on each other).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch.utils.data import DataLoader

from lightning_speedups.benchmarks._common import BenchRow
from lightning_speedups.measure import interleaved_timings, median, speed_ratio, torch_threads

__all__ = ["run"]

# the ShapesDataModule's normalisation
_MEAN = [0.5] * 3
_STD = [0.25] * 3


def _pipelines(n: int, batch_size: int, seed: int = 0) -> dict[str, Callable[[], Iterable[Any]]]:
    """Factories of one epoch's batches for each data path, all over the same images; ``seed``: order/augmentation."""
    from lightning_speedups.data import BatchAugment, DeviceDataLoader
    from lightning_speedups.demo import ShapesDataModule, ShapesDataset
    from lightning_speedups.demo.data import _TransformDataset

    ds = ShapesDataset(n=n, seed=0)
    per_sample = _TransformDataset(ds.images, ds.labels, ShapesDataModule().transforms(train=True))
    baseline = DataLoader(per_sample, batch_size=batch_size, shuffle=True, num_workers=0)

    def device_loader(**aug: Any) -> DeviceDataLoader:
        transform = BatchAugment(padding=4, hflip=0.5, mean=_MEAN, std=_STD, seed=seed, **aug) if aug else None
        return DeviceDataLoader(ds.images, ds.labels, batch_size=batch_size, seed=seed, transform=transform)

    pipes: dict[str, Callable[[], Iterable[Any]]] = {
        "dataloader+v2": lambda: baseline,
        "device": lambda: device_loader(),
        "device+vectorized": lambda: device_loader(backend="vectorized"),
    }
    try:
        import kornia  # noqa: F401

        pipes["device+kornia"] = lambda: device_loader(backend="kornia")
    except ImportError:
        pass
    return pipes


def _consume(loader: Iterable[Any], limit: int | None = None) -> int:
    seen = 0
    for i, (x, _) in enumerate(loader):
        if limit is not None and i >= limit:
            break
        seen += x.shape[0]
    return seen


def _with_threads(threads: int, fn: Callable[[], Any]) -> Callable[[], Any]:
    def wrapped() -> Any:
        with torch_threads(threads):
            return fn()

    return wrapped


def _train_accuracy(loader: Iterable[Any], val: tuple[torch.Tensor, torch.Tensor], epochs: int, seed: int) -> float:
    from lightning_speedups.demo import DemoClassifier

    torch.manual_seed(seed)
    model = DemoClassifier(width=8)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(epochs):
        for x, y in loader:
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    model.eval()
    with torch.no_grad():
        x, y = val
        xv = (x.float() / 255 - 0.5) / 0.25
        return float((model(xv).argmax(1) == y).float().mean())


def _pipeline_rows(pipes: dict[str, Callable[[], Iterable[Any]]], n: int, repeats: int) -> list[BenchRow]:
    """The data pipelines alone, one full epoch each, against ``dataloader+v2``. The batched path also runs at 1
    intra-op thread (the per-sample path is single-threaded anyway: its tensors are below torch's parallel grain),
    which shows what a machine shared with other jobs does to spinning OpenMP threads."""
    rows: list[BenchRow] = []
    fns: dict[str, Callable[[], Any]] = {name: (lambda f=factory: _consume(f())) for name, factory in pipes.items()}
    fns["device+vectorized, 1 thread"] = _with_threads(1, fns["device+vectorized"])
    times = interleaved_timings(fns, repeats=repeats, warmup=1)
    base = times["dataloader+v2"]
    threads = torch.get_num_threads()
    for name in fns:
        if name == "dataloader+v2":
            continue
        note = "data only (no model)"
        note += "; no augmentation: upper bound" if name == "device" else ""
        note += "" if "1 thread" in name else f"; {threads} thread(s)"
        rows.append(
            BenchRow(
                technique="device_data",
                variant=f"pipeline: {name}",
                metric="samples/s",
                baseline=n / median(base),
                candidate=n / median(times[name]),
                ratio=speed_ratio(base, times[name]),
                unit="samples/s",
                note=note,
            )
        )
    return rows


def run(quick: bool = True) -> list[BenchRow]:
    """Measure the data pipelines and the train step fed by them; return one row per candidate.

    Args:
        quick: about 15 s on 2 cores (2048 images, 3 repeats); ``False`` uses 4096 images, 5 repeats and also
            measures the accuracy after one training epoch with each pipeline.

    Returns:
        :class:`BenchRow` s; ``ratio`` = candidate samples/s / baseline samples/s.
    """
    # long: a benchmark script: one measurement after another, read top to bottom
    n, repeats, width, steps = (2048, 3, 8, 2) if quick else (4096, 5, 16, 6)
    batch_size = 256
    pipes = _pipelines(n, batch_size)
    rows = _pipeline_rows(pipes, n, repeats)

    # 2) a full train step of the demo model, fed by the baseline and by the fastest device pipeline
    from lightning_speedups.demo import DemoClassifier

    torch.manual_seed(0)
    model = DemoClassifier(width=width)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    def train(factory: Callable[[], Iterable[Any]]) -> None:
        for i, (x, y) in enumerate(factory()):
            if i >= steps:
                break
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()

    cand = "device+vectorized"
    step_times = interleaved_timings(
        {"dataloader+v2": lambda: train(pipes["dataloader+v2"]), cand: lambda: train(pipes[cand])},
        repeats=repeats,
        warmup=1,
    )
    acc_base = acc_cand = None
    note = f"DemoClassifier(width={width}), {steps} steps of batch {batch_size}, Adam"
    if not quick:
        from lightning_speedups.demo import ShapesDataset

        val = ShapesDataset(n=1024, seed=12345)
        seeds = (0, 1)
        epochs = 2
        accs: dict[str, list[float]] = {"dataloader+v2": [], cand: []}
        for seed in seeds:  # one-epoch accuracies are noisy: average over seeds (model init, order, augmentation)
            for name in accs:
                loader = _pipelines(n, batch_size, seed=seed)[name]()
                accs[name].append(_train_accuracy(loader, (val.images, val.labels), epochs, seed))
        acc_base = sum(accs["dataloader+v2"]) / len(seeds)
        acc_cand = sum(accs[cand]) / len(seeds)
        note += f"; accuracy: DemoClassifier(width=8), {epochs} epochs, mean of {len(seeds)} seeds"
    samples = steps * batch_size
    rows.append(
        BenchRow(
            technique="device_data",
            variant=f"train step: {cand}",
            metric="samples/s",
            baseline=samples / median(step_times["dataloader+v2"]),
            candidate=samples / median(step_times[cand]),
            ratio=speed_ratio(step_times["dataloader+v2"], step_times[cand]),
            unit="samples/s",
            accuracy_baseline=acc_base,
            accuracy_candidate=acc_cand,
            note=note,
        )
    )
    return rows


if __name__ == "__main__":  # pragma: no cover
    from lightning_speedups.benchmarks.runner import bench_main

    bench_main(run)
