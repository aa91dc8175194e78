"""A variable-length sequence classifier on real text: which stdlib package does a code paragraph come from?

Samples are the blank-line separated paragraphs (a function, a class header, an import block, a docstring) of
the stdlib files of a few packages, as bytes; the label is the package. Validation paragraphs come from other files
than the training ones. The ``Dataset`` tokenises per sample and the collate pads every batch to the longest sample
of the *data set*, as many users do; ``dataset.lengths`` holds the unpadded lengths for length-aware batching.
"""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
import torchmetrics
from torch import nn
from torch.utils.data import DataLoader, Dataset

from benchmarks.workloads._registry import Workload, register_workload
from benchmarks.workloads._stdlib_text import read_source, stdlib_package_files
from lightning_speedups.benchmarks._sequence_tasks import paragraphs

__all__ = ["PACKAGES", "PackageDataModule", "PackageSnippets", "SnippetClassifier"]

# packages with many files, present in CPython 3.10 to 3.13 (any missing from an install is left out)
PACKAGES = ("asyncio", "email", "importlib", "multiprocessing", "tkinter", "unittest", "xml")
PAD = 0  # token ids are byte + 1, so 0 is free for padding


class PackageSnippets(Dataset):
    """Code paragraphs and their package label; ``__getitem__`` tokenises one sample (bytes -> ids).

    Args:
        samples: ``(paragraph bytes, label)`` pairs.

    Attributes:
        lengths: the number of tokens of every sample (before padding).
        max_len: the longest sample, the width the collate pads to.
    """

    def __init__(self, samples: list[tuple[bytes, int]]) -> None:
        self.samples = samples
        self.lengths = [len(text) for text, _ in samples]
        self.max_len = max(self.lengths, default=1)

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, idx: int) -> tuple[torch.Tensor, int]:
        text, label = self.samples[idx]
        return torch.tensor(list(text), dtype=torch.long) + 1, label

    def collate(self, batch: list[tuple[torch.Tensor, int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """Pad to :attr:`max_len` (the data set's longest sample) with :data:`PAD`."""
        ids = torch.full((len(batch), self.max_len), PAD, dtype=torch.long)
        for row, (tokens, _) in enumerate(batch):
            ids[row, : len(tokens)] = tokens
        return ids, torch.tensor([label for _, label in batch], dtype=torch.long)


class PackageDataModule(L.LightningDataModule):
    """Paragraphs of :data:`PACKAGES`; every ``val_every``-th file of each package is validation.

    Args:
        batch_size: training batch size.
        max_len: paragraphs are cut to this many bytes.
        max_per_class: training paragraphs kept per package (the first ones), to balance the classes.
        val_every: every n-th file of a package goes to validation.
        max_val: validation paragraphs kept (evenly spaced), so a validation stays cheap.
    """

    def __init__(
        self,
        batch_size: int = 64,
        max_len: int = 128,
        max_per_class: int = 2000,
        val_every: int = 4,
        max_val: int = 1024,
    ) -> None:
        super().__init__()
        self.batch_size = batch_size
        self.max_len = max_len
        self.max_per_class = max_per_class
        self.val_every = val_every
        self.max_val = max_val
        self.packages = [p for p in PACKAGES if stdlib_package_files(p)]
        self.num_classes = len(self.packages)

    def setup(self, stage: str | None = None) -> None:
        train: list[tuple[bytes, int]] = []
        val: list[tuple[bytes, int]] = []
        for label, package in enumerate(self.packages):
            kept = 0
            for i, rel in enumerate(stdlib_package_files(package)):
                paras = [(p, label) for p in paragraphs(read_source(rel), 32, self.max_len)]
                if i % self.val_every == self.val_every - 1:
                    val += paras[: self.max_per_class // 4]
                elif kept < self.max_per_class:
                    train += paras[: self.max_per_class - kept]
                    kept += len(paras[: self.max_per_class - kept])
        stride = max(1, len(val) // self.max_val)  # every k-th, so all held-out files stay represented
        self.train_set = PackageSnippets(train)
        self.val_set = PackageSnippets(val[::stride][: self.max_val])

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train_set, self.batch_size, shuffle=True, collate_fn=self.train_set.collate)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, 256, collate_fn=self.val_set.collate)


class SnippetClassifier(L.LightningModule):
    """``nn.TransformerEncoder`` over byte tokens with a key-padding mask, masked mean pooling, linear head; AdamW.

    Logs ``train_loss``, ``val_loss`` and ``val_acc``.
    """

    def __init__(
        self, num_classes: int, d: int = 64, heads: int = 4, layers: int = 2, max_len: int = 128, lr: float = 1e-3
    ) -> None:
        super().__init__()
        self.lr = lr
        self.tok = nn.Embedding(257, d, padding_idx=PAD)
        self.pos = nn.Embedding(max_len, d)
        layer = nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.1, batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d, num_classes)
        self.val_acc = torchmetrics.classification.MulticlassAccuracy(num_classes, average="micro")

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        pad = ids == PAD
        pos = torch.arange(ids.size(1), device=ids.device)
        h = self.encoder(self.tok(ids) + self.pos(pos), src_key_padding_mask=pad)
        keep = (~pad).unsqueeze(-1).to(h.dtype)
        return self.head((h * keep).sum(1) / keep.sum(1).clamp(min=1.0))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        ids, y = batch
        loss = nn.functional.cross_entropy(self(ids), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        ids, y = batch
        logits = self(ids)
        self.val_acc(logits, y)
        self.log("val_loss", nn.functional.cross_entropy(logits, y))
        self.log("val_acc", self.val_acc, on_step=False, on_epoch=True)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=self.lr, weight_decay=0.01)


def _build_seqcls(seed: int, small: bool = False) -> tuple[L.LightningModule, L.LightningDataModule]:
    torch.manual_seed(seed)
    dm = PackageDataModule(batch_size=64, max_len=128, max_per_class=60 if small else 2000)
    return SnippetClassifier(dm.num_classes, layers=1 if small else 2, max_len=128), dm


register_workload(
    Workload(
        name="seqcls_stdlib",
        kind="transformer_cls",
        split="dev",
        metric="val_acc",
        mode="max",
        target=0.31,
        description="Which of 7 stdlib packages a code paragraph (32-128 bytes) comes from: 2-layer "
        "nn.TransformerEncoder (d 64, 4 heads, padding mask, mean pool), AdamW 1e-3, batch 64, pad-to-max 128; "
        "validation on 1024 paragraphs of held-out files (chance 0.14). Measured on Python 3.11 over the planned 318 "
        "steps: 0.30/0.31/0.32/0.30 (seed 0) and 0.24/0.24/0.31/0.31 (seed 1) at 25/50/75/100% of the run, best "
        "0.34/0.32, +-0.015 between checks. The target is the plateau, first reached at step 132 (seed 0, 42%) and "
        "210 (seed 1, 66%): seed 0 plateaus by step 80, so no target lands at 60-80% of the run in both seeds. Dev "
        "since autotune's trial budget pricing and its no-evidence rule for methods were changed after it failed "
        "this task.",
        build=_build_seqcls,
        max_epochs=3,
        val_check_interval=0.25,
    )
)
