"""A tabular workload: an MLP on scikit-learn's bundled breast-cancer set (569 rows, 30 features, no download).

The ``Dataset`` standardises each row on access with the training split's statistics, as a user's
``__getitem__`` often does. The whole set is tiny, so per-step overhead (the loop, the logging, the loader)
dominates its time: the opposite end from the ResNet and GPT workloads.
"""

from __future__ import annotations

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from benchmarks.workloads._registry import Workload, register_workload
from benchmarks.workloads.images import ImageClassifier
from lightning_speedups._errors import require

__all__ = ["StandardizedRows", "TabularDataModule", "tabular_mlp"]


class StandardizedRows(Dataset):
    """Feature rows standardised per sample with given ``mean`` and ``std``; items are ``(features, label)``."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> None:
        self.x = x
        self.y = y
        self.mean = mean
        self.std = std

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, idx: int) -> tuple[torch.Tensor, torch.Tensor]:
        return (self.x[idx] - self.mean) / self.std, self.y[idx]


class TabularDataModule(L.LightningDataModule):
    """Breast-cancer rows split 70/30 (stratified by a fixed permutation of ``seed``)."""

    def __init__(
        self, batch_size: int = 16, val_fraction: float = 0.3, seed: int = 0, limit: int | None = None
    ) -> None:
        super().__init__()
        self.batch_size = batch_size
        self.val_fraction = val_fraction
        self.seed = seed
        self.limit = limit

    def setup(self, stage: str | None = None) -> None:
        datasets = require("sklearn.datasets", "demo", "The tabular workload")
        bunch = datasets.load_breast_cancer()
        x = torch.as_tensor(bunch.data, dtype=torch.float32)
        y = torch.as_tensor(bunch.target, dtype=torch.long)
        perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(self.seed))
        if self.limit is not None:
            perm = perm[: self.limit]
        n_val = int(round(len(perm) * self.val_fraction))
        val_idx = perm[:n_val]
        train_idx = perm[n_val:]
        mean = x[train_idx].mean(0)
        std = x[train_idx].std(0).clamp(min=1e-6)
        self.train_set = StandardizedRows(x[train_idx], y[train_idx], mean, std)
        self.val_set = StandardizedRows(x[val_idx], y[val_idx], mean, std)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=256)


def tabular_mlp(in_features: int = 30, hidden: int = 64, layers: int = 2, num_classes: int = 2) -> nn.Sequential:
    """An MLP with dropout: ``in -> hidden x layers -> classes``."""
    mods: list[nn.Module] = []
    prev = in_features
    for _ in range(layers):
        mods += [nn.Linear(prev, hidden), nn.ReLU(), nn.Dropout(0.2)]
        prev = hidden
    return nn.Sequential(*mods, nn.Linear(prev, num_classes))


def _build_tabular(seed: int, small: bool = False) -> tuple[L.LightningModule, L.LightningDataModule]:
    torch.manual_seed(seed)
    # the same plain module as the image tasks (cross-entropy, Adam 1e-3, val_acc): only the network differs
    data = TabularDataModule(batch_size=16, seed=seed, limit=120 if small else None)
    return ImageClassifier(tabular_mlp(), num_classes=2), data


register_workload(
    Workload(
        name="tabular_mlp",
        kind="tabular",
        split="dev",
        metric="val_acc",
        mode="max",
        target=0.975,
        description="scikit-learn breast cancer (398 train / 171 val rows, 30 features), 2x64 MLP with dropout, "
        "Adam 1e-3, batch 16, per-row standardisation in the Dataset. Measured (seed 0, AMD EPYC 2 cores shared, "
        "load ~5): 0.977 at epoch 10 after 21 s of training, plateau 0.977-0.982; too small to take a minute. Dev "
        "since the advisor's small-batch finding became a measure-first one after its fix (the throughput "
        "batch-size finder: one step an epoch) kept this task from its target.",
        build=_build_tabular,
        max_epochs=30,
        val_check_interval=1.0,
        reference_s=21.0,
    )
)
