"""Benchmark: fine-tuning with a frozen backbone (way 5: pretrained models and fine-tuning).

1. Train-step time of a torchvision ResNet-18 (``weights=None``: same shapes and cost as the pretrained one, no
   download) with the backbone frozen (head only) vs the whole network trained, interleaved.
2. Time-to-accuracy on a real transfer task: a DemoClassifier pretrained here on digits 0-4 is fine-tuned on 5-9,
   full fine-tuning vs :class:`FineTuneFreezing` gradual unfreezing, same run, same seed, same data.

Run: ``python -m lightning_speedups.benchmarks.finetuning [--full]``.
"""

from __future__ import annotations

import copy
import time
import warnings
from typing import Any

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_speedups.benchmarks._common import BenchRow, quiet_lightning
from lightning_speedups.demo import DemoClassifier, load_digits_tensors
from lightning_speedups.demo.data import DIGITS_MEAN, DIGITS_STD
from lightning_speedups.functional.finetuning import freeze, load_pretrained, replace_head
from lightning_speedups.measure import interleaved_timings, median, speed_ratio

__all__ = ["run", "step_ratio", "time_to_accuracy"]


def _step(model: nn.Module, x: torch.Tensor, y: torch.Tensor, opt: torch.optim.Optimizer) -> Any:
    loss_fn = nn.CrossEntropyLoss()

    def step() -> float:
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()  # frozen parameters have no gradient: Adam skips them
        return float(loss.detach())

    return step


def step_ratio(quick: bool = True) -> BenchRow:
    """Full fine-tune vs frozen-backbone train step of a ResNet-18 on 5 classes (interleaved medians)."""
    torch.manual_seed(0)
    size, batch = (48, 8) if quick else (96, 32)
    full = load_pretrained("resnet18", num_classes=5)  # weights=None: no download, same compute as pretrained
    frozen = copy.deepcopy(full)
    frozen.train()
    freeze(frozen)
    for p in frozen.fc.parameters():
        p.requires_grad_(True)
    x = torch.randn(batch, 3, size, size)
    y = torch.randint(0, 5, (batch,))
    # both optimizers hold every parameter, as FineTuneFreezing's "all groups up front" approach does
    steps = {
        "full": _step(full, x, y, torch.optim.Adam(full.parameters(), lr=1e-4)),
        "frozen": _step(frozen, x, y, torch.optim.Adam(frozen.parameters(), lr=1e-4)),
    }
    times = interleaved_timings(steps, repeats=3 if quick else 10, warmup=1)
    ratio = speed_ratio(times["full"], times["frozen"])
    total = sum(p.numel() for p in full.parameters())
    trained = sum(p.numel() for p in frozen.parameters() if p.requires_grad)
    return BenchRow(
        technique="finetune",
        variant="frozen backbone vs full fine-tune (resnet18)",
        metric="train step time",
        baseline=median(times["full"]),
        candidate=median(times["frozen"]),
        ratio=ratio,
        unit="s",
        note=(
            f"batch {batch}x3x{size}x{size}; {trained:,} of {total:,} params trained"
            + ("" if ratio > 1.05 else "; no speedup")
        ),
        extra={"times_full": times["full"], "times_frozen": times["frozen"]},
    )


def _loaders(classes: list[int], batch_size: int, seed: int) -> tuple[DataLoader, DataLoader]:
    images, labels = load_digits_tensors(32, 3, classes)
    x = (images.float() / 255.0 - DIGITS_MEAN) / DIGITS_STD
    perm = torch.randperm(len(labels), generator=torch.Generator().manual_seed(seed))
    n_val = len(labels) // 5
    tr = perm[n_val:]
    va = perm[:n_val]
    g = torch.Generator().manual_seed(seed)
    train = DataLoader(TensorDataset(x[tr], labels[tr]), batch_size=batch_size, shuffle=True, generator=g)
    return train, DataLoader(TensorDataset(x[va], labels[va]), batch_size=512)


class _Clock(L.Callback):
    """Cumulative training time (validation excluded) and validation accuracy after every epoch."""

    def __init__(self) -> None:
        self.train_time = 0.0
        self.curve: list[tuple[float, float]] = []  # (train seconds so far, val_acc)
        self._t0 = 0.0

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._t0 = time.perf_counter()

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.train_time += time.perf_counter() - self._t0  # validation runs inside the epoch: stop the clock

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.curve.append((self.train_time, float(trainer.callback_metrics["val_acc"])))
        self._t0 = time.perf_counter()


def _trainer(epochs: int, callbacks: list[L.Callback], val_every: float = 1.0) -> L.Trainer:
    return L.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=epochs,
        logger=False,
        enable_progress_bar=False,
        val_check_interval=val_every,
        enable_model_summary=False,
        enable_checkpointing=False,
        num_sanity_val_steps=0,
        callbacks=callbacks,
    )


def time_to_accuracy(quick: bool = True, target: float = 0.9) -> BenchRow:
    """Pretrain on digits 0-4, fine-tune on 5-9: full fine-tune vs gradual unfreezing, time to ``target`` val acc.

    Ratio = full time / gradual time (0 if gradual never gets there, inf if only gradual does).
    """
    from lightning_speedups.callbacks.finetuning import FineTuneFreezing

    width, pre_epochs, epochs = (8, 3, 3) if quick else (16, 4, 6)
    L.seed_everything(0, verbose=False)
    pre = DemoClassifier(num_classes=5, width=width, optimizer_config={"lr": 5e-3})
    _trainer(pre_epochs, []).fit(pre, *_loaders([0, 1, 2, 3, 4], 16, seed=0))
    pretrained = copy.deepcopy(pre.state_dict())
    results: dict[str, _Clock] = {}
    for name in ("full", "gradual"):
        L.seed_everything(1, verbose=False)
        model = DemoClassifier(num_classes=5, width=width, optimizer_config={"lr": 3e-3})
        model.load_state_dict(pretrained)
        replace_head(model, 5)
        clock = _Clock()
        cbs: list[L.Callback] = [clock]
        if name == "gradual":
            cbs.insert(0, FineTuneFreezing(unfreeze_at_epoch=1, unfreeze_every=1, lr_decay=0.5, verbose=False))
        _trainer(epochs, cbs, val_every=0.5).fit(model, *_loaders([5, 6, 7, 8, 9], 32, seed=1))
        results[name] = clock

    def reach(clock: _Clock) -> float:
        return next((t for t, acc in clock.curve if acc >= target), float("inf"))

    t_full = reach(results["full"])
    t_grad = reach(results["gradual"])
    ratio = t_full / t_grad if t_grad not in (0.0, float("inf")) else 0.0
    if t_full == float("inf") and t_grad < float("inf"):
        ratio = float("inf")
    note = f"pretrained {pre_epochs} epochs on 0-4, {epochs} epochs on 5-9, val every half epoch; train time only"
    if t_full == float("inf") or t_grad == float("inf"):
        note += f"; target {target:.0%} not reached by " + " and ".join(
            n for n, t in (("full", t_full), ("gradual", t_grad)) if t == float("inf")
        )
    elif ratio <= 1.0:
        note += "; no speedup"
    return BenchRow(
        technique="finetune",
        variant="gradual unfreezing vs full fine-tune (digits 0-4 -> 5-9)",
        metric=f"time to {target:.0%} val acc",
        baseline=t_full,
        candidate=t_grad,
        ratio=ratio,
        unit="s",
        accuracy_baseline=results["full"].curve[-1][1],
        accuracy_candidate=results["gradual"].curve[-1][1],
        note=note,
        extra={"curve_full": results["full"].curve, "curve_gradual": results["gradual"].curve},
    )


def run(quick: bool = True) -> list[BenchRow]:
    """Both measurements, same process: the step-time ratio and the time-to-accuracy ratio."""
    with quiet_lightning(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return [step_ratio(quick), time_to_accuracy(quick)]


if __name__ == "__main__":  # pragma: no cover
    from lightning_speedups.benchmarks.runner import bench_main

    bench_main(run)
