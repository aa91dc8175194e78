"""The sequence batching benchmark's tasks: real, long-tailed text that ships with Python, and two tiny models.

- :func:`snippet_task`: what is a paragraph of Python code (a function, a class, a docstring or comment, other code)?
  Samples are the blank-line separated paragraphs of the standard library's top-level modules and of a few of its
  packages (tests left out), as bytes (token = byte + 1, 0 = padding), cut at ``max_len``; most are short, a few are
  long (see :func:`length_stats`). The kinds are balanced; train and validation are a seeded split.
- :class:`SnippetClassifier`: ``nn.TransformerEncoder`` (batch_first, ``src_key_padding_mask``), masked mean pooling.
- :func:`classifier_strategies`, :func:`lm_strategies`: the ways to batch them, each a function from the epoch to
  that epoch's batches of indices, and a ``collate_fn``.
- :func:`lm_documents`: the same paragraphs, long ones cut into pieces of at most ``block_size``.
- :class:`ByteGPT`: a causal byte-level GPT of :class:`CausalBlock` s on SDPA; positions come from ``position_ids``,
  so packed rows (positions restarting at every document) and padded rows run through the same code. The workload
  suite's GPT (``benchmarks/workloads/text_lm.py``) and text tasks reuse the block and :func:`paragraphs`.

Everything is deterministic for one Python install: files are read in sorted path order.
"""

from __future__ import annotations

import math
import pathlib
import sysconfig
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import Dataset

from lightning_speedups._tokens import count_tokens
from lightning_speedups.data import (
    LengthGroupedSampler,
    PackedBatchSampler,
    TokenBudgetBatchSampler,
    pack_collate,
    pad_collate,
)

__all__ = [
    "BASELINE",
    "KINDS",
    "PACKAGES",
    "ByteGPT",
    "CausalBlock",
    "SnippetClassifier",
    "SnippetTask",
    "Snippets",
    "classifier_strategies",
    "collated",
    "length_stats",
    "lm_documents",
    "lm_loss",
    "lm_strategies",
    "packed_pad_fraction",
    "paragraph_kind",
    "paragraphs",
    "real_tokens",
    "snippet_task",
    "token_budget",
]

# stdlib packages read besides the top-level modules (any missing from an install is skipped)
PACKAGES = (
    "asyncio",
    "concurrent",
    "email",
    "http",
    "importlib",
    "json",
    "logging",
    "multiprocessing",
    "tkinter",
    "unittest",
    "urllib",
    "xml",
)
KINDS = ("function", "class", "docstring or comment", "other code")
PAD = 0  # token ids are byte + 1, so 0 is free for padding
VOCAB = 257
_MIN_BYTES = 16  # shorter paragraphs are a closing bracket or a lone comment


def _stdlib() -> pathlib.Path:
    return pathlib.Path(sysconfig.get_paths()["stdlib"])


@lru_cache(maxsize=64)
def _package_files(package: str) -> tuple[pathlib.Path, ...]:
    """The package's ``.py`` files in sorted order, without its tests."""
    root = _stdlib() / package
    files = [p for p in root.rglob("*.py") if not {"test", "tests"} & set(p.relative_to(root).parts[:-1])]
    return tuple(sorted(files))


class Snippets(Dataset):
    """Token sequences with an integer label; ``__getitem__`` returns ``(tokens, label)``.

    Attributes:
        lengths: every sample's length in tokens (what the length-aware samplers read).
    """

    def __init__(self, texts: Sequence[bytes], labels: Sequence[int]) -> None:
        self.tokens = [torch.frombuffer(bytearray(t), dtype=torch.uint8).long() + 1 for t in texts]
        self.labels = [int(y) for y in labels]
        self.lengths = [len(t) for t in self.tokens]

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, idx: int) -> tuple[Tensor, int]:
        return self.tokens[idx], self.labels[idx]


@dataclass
class SnippetTask:
    """The classification task: train/validation sets, the cut length and the class names."""

    train: Snippets
    val: Snippets
    max_len: int
    classes: tuple[str, ...]


def _files() -> list[pathlib.Path]:
    root = _stdlib()
    return sorted(root.glob("*.py")) + [f for package in PACKAGES for f in _package_files(package)]


def paragraphs(data: bytes, min_len: int, max_len: int | None) -> list[bytes]:
    r"""The blank-line separated paragraphs of ``data`` with at least ``min_len`` non-blank bytes, cut at ``max_len``.

    Example::

        >>> paragraphs(b"def f():\n    pass\n\n)\n\nclass A:\n    x = 1\n", min_len=4, max_len=8)
        [b'def f():', b'class A:']
    """
    out = []
    for para in data.split(b"\n\n"):
        para = para.strip(b"\n")
        if len(para.strip()) >= min_len:
            out.append(para[:max_len])
    return out


@lru_cache(maxsize=1)
def _all_paragraphs() -> tuple[bytes, ...]:
    """Every paragraph of :func:`_files`, uncut, in file order (read once per process)."""
    return tuple(para for path in _files() for para in paragraphs(path.read_bytes(), _MIN_BYTES, None))


def paragraph_kind(paragraph: bytes) -> int:
    """The label: what a paragraph starts with (an index into :data:`KINDS`)."""
    text = paragraph.lstrip()
    if text.startswith((b"def ", b"async def ", b"@")):
        return 0
    if text.startswith(b"class "):
        return 1
    if text.startswith((b"#", b'"""', b"'''", b'r"""')):
        return 2
    return 3


def snippet_task(max_len: int = 512, per_class: int = 700, val_per_class: int = 100, seed: int = 0) -> SnippetTask:
    """Paragraphs of the stdlib labelled by :func:`paragraph_kind`, ``per_class + val_per_class`` of each kind.

    The kinds are balanced by a seeded draw; the label is learnable from the first bytes and from the words of the
    paragraph, so a tiny transformer learns it within a few hundred steps.

    Raises:
        ValueError: a kind has fewer paragraphs than asked for in this Python.
    """
    by_kind: list[list[bytes]] = [[] for _ in KINDS]
    for para in _all_paragraphs():
        by_kind[paragraph_kind(para)].append(para[:max_len])
    gen = torch.Generator().manual_seed(seed)
    train: list[tuple[bytes, int]] = []
    val: list[tuple[bytes, int]] = []
    need = per_class + val_per_class
    for label, paras in enumerate(by_kind):
        if len(paras) < need:
            raise ValueError(f"the stdlib has {len(paras)} {KINDS[label]!r} paragraphs; {need} are needed")
        pick = torch.randperm(len(paras), generator=gen)[:need].tolist()
        train += [(paras[i], label) for i in pick[:per_class]]
        val += [(paras[i], label) for i in pick[per_class:]]
    order = torch.randperm(len(train), generator=gen).tolist()  # kinds interleaved, not in blocks
    train = [train[i] for i in order]
    return SnippetTask(
        train=Snippets([t for t, _ in train], [y for _, y in train]),
        val=Snippets([t for t, _ in val], [y for _, y in val]),
        max_len=max_len,
        classes=KINDS,
    )


def length_stats(lengths: Sequence[int], max_len: int, multiple_of: int = 1) -> dict[str, float]:
    """Median, p90, p99, mean and max length, the share cut at ``max_len``, and the pad fraction of pad-to-max."""
    xs = sorted(int(n) for n in lengths)

    def pct(p: float) -> float:
        return float(xs[min(len(xs) - 1, math.ceil(p * len(xs)) - 1)])

    width = math.ceil(max(xs) / multiple_of) * multiple_of
    return {
        "samples": float(len(xs)),
        "median": pct(0.5),
        "p90": pct(0.9),
        "p99": pct(0.99),
        "mean": sum(xs) / len(xs),
        "max": float(xs[-1]),
        "at_limit": sum(n >= max_len for n in xs) / len(xs),
        "pad_to_max": 1.0 - sum(xs) / (width * len(xs)),
    }


def lm_documents(block_size: int, max_docs: int, seed: int = 0) -> list[Tensor]:
    """The paragraphs :func:`snippet_task` reads, as token tensors, long ones cut into ``block_size`` pieces.

    A seeded draw of ``max_docs`` pieces, so every batching strategy trains on the same tokens.
    """
    paras = _all_paragraphs()
    # (paragraph, start) of every piece; a next-token loss needs at least two tokens
    pieces = [
        (p, start)
        for p, para in enumerate(paras)
        for start in range(0, len(para), block_size)
        if len(para) - start >= 2
    ]
    pick = torch.randperm(len(pieces), generator=torch.Generator().manual_seed(seed))[:max_docs]
    out = []
    for i in pick.tolist():
        p, start = pieces[i]
        piece = paras[p][start : start + block_size]
        out.append(torch.frombuffer(bytearray(piece), dtype=torch.uint8).long() + 1)
    return out


# ------------------------------------------------------------------------------------------ batching strategies
Batches = list[list[int]]
Strategies = dict[str, tuple[Callable[[int], Batches], Any]]  # name -> (epoch -> batches of indices, collate_fn)
BASELINE = "pad-to-max"


def _random_batches(n: int, batch_size: int, seed: int) -> Callable[[int], Batches]:
    def epoch(e: int) -> Batches:
        perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed * 1000 + e))
        return [b.tolist() for b in perm.split(batch_size)]

    return epoch


def _from_sampler(sampler: Any) -> Callable[[int], Batches]:
    def epoch(e: int) -> Batches:
        sampler.set_epoch(e)  # what Lightning's fit loop does at every epoch start
        return list(sampler)

    return epoch


def token_budget(lengths: Sequence[int], batch_size: int, max_len: int, multiple_of: int = 8) -> int:
    """``batch_size`` x the mean length, so a step sees as many real tokens as a fixed-size batch on average."""
    longest = math.ceil(max_len / multiple_of) * multiple_of
    return max(round(batch_size * sum(lengths) / len(lengths)), longest)


def classifier_strategies(lengths: Sequence[int], batch_size: int, max_len: int, seed: int) -> Strategies:
    """The classifier's four ways to batch, the baseline (every batch padded to ``max_len``) first."""
    n = len(lengths)
    bs = batch_size
    budget = token_budget(lengths, bs, max_len)
    return {
        BASELINE: (_random_batches(n, bs, seed), pad_collate(multiple_of=max_len)),  # rounds every batch up to max_len
        "dynamic padding": (_random_batches(n, bs, seed), pad_collate()),
        "length-grouped": (_from_sampler(LengthGroupedSampler(lengths, bs, seed=seed)), pad_collate()),
        "token budget": (
            _from_sampler(TokenBudgetBatchSampler(lengths, budget, seed=seed, multiple_of=8)),
            pad_collate(),
        ),
    }


def lm_strategies(lengths: Sequence[int], batch_size: int, block_size: int, seed: int) -> Strategies:
    """Per-document padding (random or length-grouped batches of ``batch_size``) and packing into rows of
    ``block_size``, as many rows as hold the real tokens of an average padded batch."""
    rows = max(1, round(batch_size * sum(lengths) / len(lengths) / block_size))
    packed = PackedBatchSampler(lengths, block_size, rows, seed=seed)
    return {
        "per-document padding, random batches": (_random_batches(len(lengths), batch_size, seed), pad_collate()),
        "per-document padding, length-grouped": (
            _from_sampler(LengthGroupedSampler(lengths, batch_size, seed=seed)),
            pad_collate(),
        ),
        "packing": (_from_sampler(packed), pack_collate(block_size)),
    }


def packed_pad_fraction(lengths: Sequence[int], batches: Batches, block_size: int) -> float:
    """The share of padding in the rows that :func:`~lightning_speedups.data.pack_collate` makes of ``batches``."""
    real = [sum(lengths[i] for i in b) for b in batches]
    return 1.0 - sum(real) / sum(math.ceil(r / block_size) * block_size for r in real)


def collated(dataset: Any, collate: Any, batch: Sequence[int]) -> Any:
    """One batch, as a ``DataLoader`` with ``num_workers=0`` makes it."""
    return collate([dataset[i] for i in batch])


def real_tokens(batch: Any) -> int:
    """The non-pad tokens of a collated batch, counted as TokenThroughput counts them."""
    count = count_tokens(batch, pad_value=PAD)
    assert count is not None, "a sequence batch holds a token tensor"
    return count.tokens


# ------------------------------------------------------------------------------------------ models
class SnippetClassifier(nn.Module):
    """Byte embeddings + learned positions, ``nn.TransformerEncoder`` with a key-padding mask, masked mean pooling.

    ``forward(input_ids, attention_mask)`` returns the logits; padding never reaches the pooled vector, so a batch
    padded to 512 and the same batch padded to its longest sample give the same logits.
    """

    def __init__(self, num_classes: int, max_len: int, d: int = 64, heads: int = 4, layers: int = 2) -> None:
        super().__init__()
        self.tok = nn.Embedding(VOCAB, d, padding_idx=PAD)
        self.pos = nn.Embedding(max_len, d)
        layer = nn.TransformerEncoderLayer(d, heads, 2 * d, dropout=0.0, batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, num_classes)

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        keep = attention_mask.bool()
        pos = torch.arange(input_ids.shape[1], device=input_ids.device)
        h = self.encoder(self.tok(input_ids) + self.pos(pos), src_key_padding_mask=~keep)
        w = keep.unsqueeze(-1).to(h.dtype)
        return self.head(self.norm((h * w).sum(1) / w.sum(1).clamp(min=1.0)))


class CausalBlock(nn.Module):
    """Pre-norm transformer block with causal ``scaled_dot_product_attention`` (nanoGPT's layout)."""

    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.ln2 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: Tensor, attn_mask: Tensor | None = None) -> Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        # no mask: plain causal; a packed row: the block-diagonal causal mask (packed_attention_mask)
        att = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=attn_mask is None)
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


class ByteGPT(nn.Module):
    """A tiny causal GPT over bytes; ``forward(input_ids, position_ids, attn_mask=None)`` returns the logits."""

    def __init__(self, block_size: int, d: int = 64, heads: int = 4, layers: int = 2) -> None:
        super().__init__()
        self.tok = nn.Embedding(VOCAB, d)
        self.pos = nn.Embedding(block_size, d)
        self.blocks = nn.ModuleList(CausalBlock(d, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, VOCAB, bias=False)

    def forward(self, input_ids: Tensor, position_ids: Tensor, attn_mask: Tensor | None = None) -> Tensor:
        x = self.tok(input_ids) + self.pos(position_ids)
        for block in self.blocks:
            x = block(x, attn_mask)
        return self.head(self.ln(x))


def lm_loss(logits: Tensor, labels: Tensor) -> Tensor:
    """Next-token cross-entropy: position ``t`` predicts ``labels[t + 1]`` (``-100`` is skipped)."""
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1))


def describe(stats: dict[str, Any]) -> str:
    """One line: ``median 129, p90 471, p99 512, max 512 tokens (mean 186); 9% at the limit; pad-to-max pads 64%``."""
    return (
        f"median {stats['median']:.0f}, p90 {stats['p90']:.0f}, p99 {stats['p99']:.0f}, max {stats['max']:.0f} "
        f"tokens (mean {stats['mean']:.0f}); {stats['at_limit']:.0%} at the limit; pad-to-max pads "
        f"{stats['pad_to_max']:.0%}"
    )
