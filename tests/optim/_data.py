"""Tiny deterministic data for the optim tests: fixed tensors, no shuffling, no augmentation."""

from __future__ import annotations

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset


class TinyData(L.LightningDataModule):
    """``n_batches`` training batches and one validation batch of random 3 x size x size images, in a fixed order.

    Small images keep the conv net cheap (it pools adaptively, so any size works).
    """

    def __init__(self, n_batches: int = 3, batch_size: int = 4, size: int = 8, seed: int = 0) -> None:
        super().__init__()
        self.batch_size = batch_size
        g = torch.Generator().manual_seed(seed)
        n = n_batches * batch_size
        self.x = torch.randn(n, 3, size, size, generator=g)
        self.y = torch.randint(0, 10, (n,), generator=g)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(TensorDataset(self.x, self.y), batch_size=self.batch_size, shuffle=False)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(
            TensorDataset(self.x[: self.batch_size], self.y[: self.batch_size]), batch_size=self.batch_size
        )


class LRRecorder(L.Callback):
    """Records each group's lr before every training batch and once more at the end of training."""

    def __init__(self) -> None:
        self.lrs: list[dict[str, float]] = []
        self.metrics: list[float] = []

    def _snap(self, trainer: L.Trainer) -> None:
        self.lrs.append({g["name"]: g["lr"] for g in trainer.optimizers[0].param_groups})

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:  # noqa: ANN001
        self._snap(trainer)

    def on_train_epoch_end(self, trainer, pl_module) -> None:  # noqa: ANN001
        if "val_loss" in trainer.callback_metrics:
            self.metrics.append(float(trainer.callback_metrics["val_loss"]))

    def on_train_end(self, trainer, pl_module) -> None:  # noqa: ANN001
        self._snap(trainer)
