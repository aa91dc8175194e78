"""A Hugging Face masked language model on real text, written the way users put an HF model in Lightning.

A tiny ``BertForMaskedLM`` (built from a config, no download) learns the stdlib's code paragraphs at byte level.
What makes it unlike the other text tasks, and like an HF user's code:

- batches are dicts (``input_ids``, ``attention_mask``, ``labels``) passed as ``self.model(**batch)``, and the loss
  comes from the model's ``ModelOutput``;
- the collate pads each batch to its own longest sample and masks 15% of the tokens with the global RNG, as
  ``transformers.DataCollatorForLanguageModeling`` does (80% ``[MASK]``, 10% a random token, 10% unchanged);
- ``configure_optimizers`` returns AdamW with ``transformers.get_linear_schedule_with_warmup``, stepped every step.

Validation masks are fixed once (seeded), so every validation scores the same positions.
"""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset

from benchmarks.workloads._registry import Workload, register_workload
from benchmarks.workloads._stdlib_text import stdlib_corpus
from lightning_speedups._errors import require
from lightning_speedups.benchmarks._sequence_tasks import paragraphs

__all__ = ["MaskedParagraphs", "ParagraphMLMDataModule", "HFMaskedLM", "mask_tokens"]

PAD = 0
CLS = 1
SEP = 2
MASK = 3
SPECIAL = 4  # byte b is token b + SPECIAL
VOCAB = 256 + SPECIAL
IGNORE = -100  # the label Hugging Face's loss skips


def mask_tokens(
    ids: torch.Tensor, maskable: torch.Tensor, p: float = 0.15, generator: torch.Generator | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """BERT's masking: pick ``p`` of the ``maskable`` positions as labels; of those, 80% become ``[MASK]``, 10% a
    random byte and 10% stay. Returns ``(masked input_ids, labels)`` with :data:`IGNORE` where nothing is asked."""
    picked = (torch.rand(ids.shape, generator=generator) < p) & maskable
    labels = torch.where(picked, ids, torch.full_like(ids, IGNORE))
    roll = torch.rand(ids.shape, generator=generator)
    out = torch.where(picked & (roll < 0.8), torch.full_like(ids, MASK), ids)
    random_ids = torch.randint(SPECIAL, VOCAB, ids.shape, generator=generator)
    out = torch.where(picked & (roll >= 0.8) & (roll < 0.9), random_ids, out)
    return out, labels


class MaskedParagraphs(Dataset):
    """Code paragraphs as ``[CLS] bytes [SEP]`` token ids; ``__getitem__`` tokenises one paragraph.

    Args:
        texts: the paragraphs.
        fixed_masks_seed: when given (validation), every sample's mask is drawn once from this seed and kept, and
            items carry their labels; when ``None`` (training), the collate masks each batch anew.
    """

    def __init__(self, texts: list[bytes], fixed_masks_seed: int | None = None) -> None:
        self.texts = texts
        self.lengths = [len(t) + 2 for t in texts]
        self.fixed: list[tuple[torch.Tensor, torch.Tensor]] | None = None
        if fixed_masks_seed is not None:
            gen = torch.Generator().manual_seed(fixed_masks_seed)
            self.fixed = [mask_tokens(ids, ids >= SPECIAL, generator=gen) for ids in map(self._tokens, texts)]

    @staticmethod
    def _tokens(text: bytes) -> torch.Tensor:
        return torch.tensor([CLS, *(b + SPECIAL for b in text), SEP], dtype=torch.long)

    def __len__(self) -> int:
        return len(self.texts)

    def __getitem__(self, idx: int) -> dict[str, torch.Tensor]:
        if self.fixed is not None:
            ids, labels = self.fixed[idx]
            return {"input_ids": ids, "labels": labels}
        return {"input_ids": self._tokens(self.texts[idx])}

    def collate(self, items: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        """Pad to the batch's longest item; mask training batches (items without ``labels``) with the global RNG."""
        width = max(len(item["input_ids"]) for item in items)
        ids = torch.full((len(items), width), PAD, dtype=torch.long)
        labels = torch.full((len(items), width), IGNORE, dtype=torch.long)
        for row, item in enumerate(items):
            n = len(item["input_ids"])
            ids[row, :n] = item["input_ids"]
            if "labels" in item:
                labels[row, :n] = item["labels"]
        attention_mask = (ids != PAD).long()
        if "labels" not in items[0]:
            ids, labels = mask_tokens(ids, ids >= SPECIAL)
        return {"input_ids": ids, "attention_mask": attention_mask, "labels": labels}


class ParagraphMLMDataModule(L.LightningDataModule):
    """Paragraphs (32 to ``max_len`` bytes) of the stdlib corpus; every ``val_every``-th file is validation.

    Args:
        batch_size: training batch size.
        max_len: paragraphs are cut to this many bytes.
        max_bytes: how much of the stdlib to read (see :func:`stdlib_corpus`).
        val_every: put every n-th file in the validation set.
        max_val: validation paragraphs kept (evenly spaced), so a validation stays cheap.
    """

    def __init__(
        self,
        batch_size: int = 32,
        max_len: int = 128,
        max_bytes: int = 3_000_000,
        val_every: int = 10,
        max_val: int = 256,
    ) -> None:
        super().__init__()
        self.batch_size = batch_size
        self.max_len = max_len
        self.max_bytes = max_bytes
        self.val_every = val_every
        self.max_val = max_val

    def setup(self, stage: str | None = None) -> None:
        train: list[bytes] = []
        val: list[bytes] = []
        for i, (_, data) in enumerate(stdlib_corpus(self.max_bytes)):
            (val if i % self.val_every == self.val_every - 1 else train).extend(paragraphs(data, 32, self.max_len))
        stride = max(1, len(val) // self.max_val)
        self.train_set = MaskedParagraphs(train)
        self.val_set = MaskedParagraphs(val[::stride][: self.max_val], fixed_masks_seed=1234)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(
            self.train_set, self.batch_size, shuffle=True, drop_last=True, collate_fn=self.train_set.collate
        )

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, 128, collate_fn=self.val_set.collate)


class HFMaskedLM(L.LightningModule):
    """A Hugging Face ``BertForMaskedLM`` from a tiny config, trained with AdamW and a linear warm-up schedule.

    Logs ``train_loss`` and ``val_loss`` (the masked-token cross-entropy, nats per byte).

    Args:
        hidden: hidden size; ``layers`` encoder layers of ``heads`` heads, feed-forward ``4 * hidden``.
        max_len: the longest paragraph in bytes (position embeddings cover it plus ``[CLS]`` and ``[SEP]``).
        lr: AdamW's peak learning rate.
        warmup: the fraction of the run spent warming up.
    """

    def __init__(
        self,
        hidden: int = 128,
        layers: int = 2,
        heads: int = 4,
        max_len: int = 128,
        lr: float = 1e-3,
        warmup: float = 0.06,
    ) -> None:
        super().__init__()
        transformers = require("transformers", "zoo", "The masked-LM workload")
        config = transformers.BertConfig(
            vocab_size=VOCAB,
            hidden_size=hidden,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            intermediate_size=4 * hidden,
            max_position_embeddings=max_len + 2,
            pad_token_id=PAD,
        )
        self.model = transformers.BertForMaskedLM(config)
        self.lr = lr
        self.warmup = warmup

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        loss = self.model(**batch).loss
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self.log("val_loss", self.model(**batch).loss, batch_size=len(batch["input_ids"]))

    def configure_optimizers(self) -> Any:
        transformers = require("transformers", "zoo", "The masked-LM workload")
        optimizer = torch.optim.AdamW(self.parameters(), lr=self.lr, weight_decay=0.01)
        total = int(self.trainer.estimated_stepping_batches)
        scheduler = transformers.get_linear_schedule_with_warmup(optimizer, int(self.warmup * total), total)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def _build_mlm(seed: int, small: bool = False) -> tuple[L.LightningModule, L.LightningDataModule]:
    torch.manual_seed(seed)
    # small: still more than one validation interval (50 steps) an epoch, for the bench's smoke test
    dm = ParagraphMLMDataModule(32, max_bytes=1_000_000 if small else 3_000_000, max_val=64 if small else 256)
    return HFMaskedLM(layers=1 if small else 2), dm


register_workload(
    Workload(
        name="mlm_hf_bert",
        kind="transformer_mlm",
        split="held_out",
        metric="val_loss",
        mode="min",
        target=2.88,
        description="Hugging Face BertForMaskedLM from a tiny config (2 layers, hidden 128, 4 heads, byte vocabulary "
        "of 260), dict batches padded per batch and masked 15% in the collate, AdamW 1e-3 with HF's linear warm-up "
        "(6%) and decay over the run, batch 32, on the stdlib's code paragraphs (32-128 bytes, 8,411 of them); "
        "validation on 256 paragraphs of held-out files with fixed masks (nats per masked byte). Measured over the "
        "planned 400 steps (AMD EPYC without bf16 units, 2 cores shared with a sweep): seed 0 3.19/3.11/2.99/2.92/"
        "2.89/2.86/2.85 at steps 50..250, 312, 362; seed 1 3.18/3.09/2.97/2.91/2.86/2.83/2.82. The target is the "
        "plateau's edge, first reached at step 312 (seed 0, 78%) and 250 (seed 1, 62%). Held out: added after every "
        "rule it is judged on was set.",
        build=_build_mlm,
        max_steps=400,
        val_check_interval=50,
    )
)
