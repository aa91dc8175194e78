"""Language-model workloads on real text (the stdlib's sources, byte level): a small GPT and a GRU.

Both are plain ``L.LightningModule`` s with AdamW and a plain ``DataLoader`` whose ``Dataset`` slices one
``block + 1`` window per sample. Train and validation text come from different files, so the metric measures
generalisation, not memory.
"""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

from benchmarks.workloads._registry import Workload, register_workload
from benchmarks.workloads._stdlib_text import stdlib_corpus
from lightning_speedups.benchmarks._sequence_tasks import CausalBlock  # the sequences bench's GPT block

__all__ = ["ByteGPT", "ByteLMDataModule", "CharGRU"]


class _Windows(Dataset):
    """Non-overlapping ``block + 1`` byte windows of one long byte string; each item is ``(input, target)``."""

    def __init__(self, data: bytes, block: int) -> None:
        self.data = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        self.block = block

    def __len__(self) -> int:
        return (len(self.data) - 1) // self.block

    def __getitem__(self, idx: int) -> tuple[torch.Tensor, torch.Tensor]:
        chunk = self.data[idx * self.block : (idx + 1) * self.block + 1].long()
        return chunk[:-1], chunk[1:]


class ByteLMDataModule(L.LightningDataModule):
    """The stdlib corpus as bytes; every ``val_every``-th file is validation text.

    Args:
        block: context length in bytes.
        batch_size: training batch size.
        max_bytes: how much of the stdlib to read (see :func:`stdlib_corpus`).
        val_every: put every n-th file in the validation set.
        val_windows: validation windows kept (the first ones, fixed), so a validation costs the same every time.
    """

    def __init__(
        self,
        block: int = 128,
        batch_size: int = 32,
        max_bytes: int = 3_000_000,
        val_every: int = 10,
        val_windows: int = 256,
    ) -> None:
        super().__init__()
        self.block = block
        self.batch_size = batch_size
        self.max_bytes = max_bytes
        self.val_every = val_every
        self.val_windows = val_windows

    def setup(self, stage: str | None = None) -> None:
        files = stdlib_corpus(self.max_bytes)
        train = b"\n".join(data for i, (_, data) in enumerate(files) if i % self.val_every != self.val_every - 1)
        val = b"\n".join(data for i, (_, data) in enumerate(files) if i % self.val_every == self.val_every - 1)
        self.train_set = _Windows(train, self.block)
        val_set = _Windows(val, self.block)
        self.val_set = torch.utils.data.Subset(val_set, range(min(self.val_windows, len(val_set))))

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True, drop_last=True)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=64)


class _LMBase(L.LightningModule):
    """Cross-entropy next-byte loss, logged as ``train_loss`` and ``val_loss`` (nats per byte), AdamW."""

    def __init__(self, lr: float, weight_decay: float) -> None:
        super().__init__()
        self.lr = lr
        self.weight_decay = weight_decay

    def _loss(self, batch: Any) -> torch.Tensor:
        x, y = batch
        logits = self(x)
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = self._loss(batch)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.log("val_loss", self._loss(batch))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=self.lr, weight_decay=self.weight_decay)


class ByteGPT(_LMBase):
    """A byte-level GPT: token + learned position embeddings, ``layers`` blocks, tied output head."""

    def __init__(
        self,
        layers: int = 4,
        d: int = 128,
        heads: int = 4,
        block: int = 128,
        lr: float = 1e-3,
        weight_decay: float = 0.1,
    ) -> None:
        super().__init__(lr, weight_decay)
        self.tok = nn.Embedding(256, d)
        self.pos = nn.Embedding(block, d)
        self.blocks = nn.Sequential(*(CausalBlock(d, heads) for _ in range(layers)))
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, 256, bias=False)
        self.head.weight = self.tok.weight  # weight tying, as GPT-2 does

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(x.size(1), device=x.device)
        return self.head(self.ln_f(self.blocks(self.tok(x) + self.pos(pos))))


class CharGRU(_LMBase):
    """A byte-level GRU language model: embedding, ``layers`` GRU layers, linear head."""

    def __init__(self, d: int = 64, hidden: int = 256, layers: int = 1, lr: float = 3e-3) -> None:
        super().__init__(lr, weight_decay=0.0)
        self.emb = nn.Embedding(256, d)
        self.rnn = nn.GRU(d, hidden, num_layers=layers, batch_first=True)
        self.head = nn.Linear(hidden, 256)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.rnn(self.emb(x))
        return self.head(out)


def _build_gpt(seed: int, small: bool = False) -> tuple[L.LightningModule, L.LightningDataModule]:
    torch.manual_seed(seed)
    dm = ByteLMDataModule(block=128, batch_size=32, max_bytes=200_000 if small else 3_000_000, val_windows=64)
    return ByteGPT(layers=1 if small else 4), dm


def _build_gru(seed: int, small: bool = False) -> tuple[L.LightningModule, L.LightningDataModule]:
    torch.manual_seed(seed)
    dm = ByteLMDataModule(block=128, batch_size=32, max_bytes=200_000 if small else 3_000_000, val_windows=64)
    return CharGRU(hidden=64 if small else 256), dm


register_workload(
    Workload(
        name="gpt_stdlib",
        kind="transformer_lm",
        split="dev",
        metric="val_loss",
        mode="min",
        target=3.0,
        description="Byte-level GPT (4 layers, d 128, 4 heads, block 128, causal SDPA, tied head), AdamW 1e-3, "
        "batch 32, on ~2.6 MB of stdlib sources; validation on 64 windows of held-out files (nats/byte). Measured "
        "(seed 0, AMD EPYC 2 cores shared, load 3-7): 4.06/3.35/3.05 at steps 50/100/150, 0.6-2 s a step; the target "
        "lies just past step 150 (about 100 s at 0.6 s a step), the 300-step plateau was not measured. Dev since "
        "autotune's trial budget pricing and its no-evidence rule for methods were changed after it failed this task.",
        build=_build_gpt,
        max_steps=300,
        val_check_interval=50,
    )
)
register_workload(
    Workload(
        name="gru_stdlib",
        kind="recurrent",
        split="dev",
        metric="val_loss",
        mode="min",
        target=1.85,
        description="Byte-level GRU language model (embedding 64, one GRU layer of 256, linear head), AdamW 3e-3, "
        "batch 32, block 128, on the same stdlib corpus as gpt_stdlib (nats/byte on held-out files). Measured (seed 0, "
        "AMD EPYC 2 cores shared, load ~4): 2.63/2.29/2.11/1.96/1.86/1.80/1.76 at steps 50..350; 1.86 after 103 s.",
        build=_build_gru,
        max_steps=400,
        val_check_interval=50,
        reference_s=103.0,
    )
)
