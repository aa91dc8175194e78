"""The demo sequence task: real Python source from the standard library, as byte tokens, in a plain LightningModule.

Samples are the top-level functions and classes of a few standard-library packages (read with ``ast`` from the
installed Python, so nothing is downloaded); the label is the package the code comes from. Lengths have a long tail
(most functions are short, a few are long), which is what makes padding every batch to the longest sample costly.
"""

from __future__ import annotations

import ast
import functools
import sysconfig
from pathlib import Path
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset

from lightning_speedups._errors import check_int

__all__ = ["PACKAGES", "StdlibCodeDataModule", "StdlibCodeDataset", "TextClassifier", "stdlib_snippets"]

PACKAGES = ("email", "json", "logging", "unittest", "xml", "http", "asyncio", "concurrent")
PAD = 0  # byte b + 1 is token b + 1; 0 is padding


@functools.lru_cache(maxsize=4)
def stdlib_snippets(max_len: int = 512, packages: tuple[str, ...] = PACKAGES) -> tuple[tuple[bytes, int], ...]:
    """``(source bytes, package index)`` of every top-level function and class of ``packages``, cut at ``max_len``."""
    root = Path(sysconfig.get_paths()["stdlib"])
    out: list[tuple[bytes, int]] = []
    for label, package in enumerate(packages):
        for path in sorted((root / package).rglob("*.py")):
            if "test" in path.parts[len(root.parts) :]:
                continue
            try:
                source = path.read_text(encoding="utf-8")
                tree = ast.parse(source)
            except (OSError, SyntaxError, UnicodeDecodeError):
                continue
            for node in tree.body:
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    text = ast.get_source_segment(source, node) or ""
                    if text:
                        out.append((text.encode("utf-8")[:max_len], label))
    return tuple(out)


class StdlibCodeDataset(Dataset):
    """Byte-token samples ``{"input_ids": LongTensor[n], "label": int}``, tokenised per sample (as users do).

    ``lengths`` holds every sample's length, so sequence batching need not read the data set to find them.
    """

    def __init__(self, snippets: tuple[tuple[bytes, int], ...]) -> None:
        self.snippets = snippets
        self.lengths = [len(text) for text, _ in snippets]

    def __len__(self) -> int:
        return len(self.snippets)

    def __getitem__(self, index: int) -> dict[str, Any]:
        text, label = self.snippets[index]
        return {"input_ids": torch.tensor(list(text), dtype=torch.long) + 1, "label": label}


def pad_to_longest_in_dataset(max_len: int) -> Any:
    """The collate many users write: every batch padded to the longest sample of the data set."""
    return functools.partial(_pad_to, max_len)


def _pad_to(length: int, samples: list[dict[str, Any]]) -> dict[str, Tensor]:
    ids = torch.full((len(samples), length), PAD, dtype=torch.long)
    for i, s in enumerate(samples):
        ids[i, : len(s["input_ids"])] = s["input_ids"]
    labels = torch.tensor([s["label"] for s in samples])
    return {"input_ids": ids, "attention_mask": (ids != PAD).long(), "label": labels}


class StdlibCodeDataModule(L.LightningDataModule):
    """Which standard-library package a function comes from; the train loader pads to the data set's longest sample.

    Args:
        batch_size: samples per batch.
        max_len: bytes kept per snippet.
        limit: keep at most this many samples (a seeded subset), for quick runs.
        seed: the train/validation split and the subset.
    """

    def __init__(self, batch_size: int = 32, max_len: int = 512, limit: int | None = None, seed: int = 0) -> None:
        super().__init__()
        self.batch_size = check_int("batch_size", batch_size, 1)
        self.max_len = check_int("max_len", max_len, 8)
        self.limit = check_int("limit", limit, 16, optional=True)
        self.seed = check_int("seed", seed)
        self.train_set: StdlibCodeDataset | None = None
        self.val_set: StdlibCodeDataset | None = None

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        snippets = stdlib_snippets(self.max_len)
        order = torch.randperm(len(snippets), generator=torch.Generator().manual_seed(self.seed)).tolist()
        if self.limit is not None:
            order = order[: self.limit]
        cut = len(order) * 9 // 10
        self.train_set = StdlibCodeDataset(tuple(snippets[i] for i in order[:cut]))
        self.val_set = StdlibCodeDataset(tuple(snippets[i] for i in order[cut:]))

    def train_dataloader(self) -> DataLoader:
        assert self.train_set is not None
        return DataLoader(
            self.train_set, batch_size=self.batch_size, shuffle=True, collate_fn=pad_to_longest_in_dataset(self.max_len)
        )

    def val_dataloader(self) -> DataLoader:
        assert self.val_set is not None
        return DataLoader(self.val_set, batch_size=64, collate_fn=pad_to_longest_in_dataset(self.max_len))


class TextClassifier(L.LightningModule):
    """A small transformer encoder over byte tokens, with a padding mask and masked mean pooling; a plain module.

    ``forward(input_ids, attention_mask=None)`` returns class logits; batches are dicts with ``input_ids``,
    ``attention_mask`` and ``label`` (what :func:`~lightning_speedups.data.pad_collate` builds).
    """

    def __init__(
        self,
        num_classes: int = len(PACKAGES),
        d_model: int = 64,
        layers: int = 2,
        heads: int = 4,
        max_len: int = 512,
        lr: float = 1e-3,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.embed = nn.Embedding(257, d_model, padding_idx=PAD)
        self.pos = nn.Embedding(max_len, d_model)
        layer = nn.TransformerEncoderLayer(d_model, heads, 2 * d_model, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, num_classes)

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        mask = attention_mask if attention_mask is not None else (input_ids != PAD).long()
        x = self.embed(input_ids) + self.pos(torch.arange(input_ids.shape[1], device=input_ids.device))
        x = self.encoder(x, src_key_padding_mask=mask == 0)
        weights = mask.unsqueeze(-1).to(x.dtype)
        return self.head((x * weights).sum(1) / weights.sum(1).clamp_min(1.0))

    def _step(self, batch: dict[str, Tensor], stage: str) -> Tensor:
        logits = self(batch["input_ids"], batch.get("attention_mask"))
        loss = F.cross_entropy(logits, batch["label"])
        acc = (logits.argmax(-1) == batch["label"]).float().mean()
        self.log(f"{stage}_loss", loss, prog_bar=stage == "val")
        self.log(f"{stage}_acc", acc, prog_bar=True, on_step=False, on_epoch=True)
        return loss

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        return self._step(batch, "train")

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        self._step(batch, "val")

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=self.hparams.lr)
