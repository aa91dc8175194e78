"""Collating token sequences: pad each batch to its own longest sample, or pack documents into full rows.

- :func:`pad_collate`: dynamic padding (to the batch's longest sample, rounded up to ``multiple_of``) with an
  ``attention_mask``; ``labels`` are padded with -100 so the loss skips them.
- :func:`pack_sequences`: documents packed into rows of ``block_size`` tokens with ``position_ids`` that restart at
  every document and the boundaries (``cu_seqlens``), so an attention that honours them never lets one document see
  another; :func:`packed_attention_mask` builds that block-diagonal causal mask for SDPA.
- :func:`pack_collate`: :func:`pack_sequences` as a ``collate_fn``.
- :func:`sequence_lengths`: every sample's length, read once from the dataset and cached.
"""

from __future__ import annotations

import math
import time
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from torch.utils.data import default_collate

from lightning_speedups._errors import SpeedupConfigError, check_bool, check_int
from lightning_speedups._tokens import IGNORE_INDEX, TOKEN_KEYS
from lightning_speedups.data._sampler_base import check_lengths

__all__ = [
    "IGNORE_INDEX",
    "PadCollate",
    "PackCollate",
    "SequenceLengths",
    "pack_collate",
    "pack_sequences",
    "packed_attention_mask",
    "pad_collate",
    "sequence_lengths",
    "token_tensor",
]


def _int_list(value: Any) -> bool:
    """A list of Python ints: token ids as a Hugging Face tokenizer returns them (``tokenizer(text)["input_ids"]``)."""
    return isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value)


def _as_tokens(value: Any) -> Tensor | None:
    """``value`` as a 1-D integer tensor: a tensor as it is, a list of ints or a 1-D integer NumPy array converted
    (``None``: it holds no token ids)."""
    if isinstance(value, Tensor):
        return value if value.dim() == 1 and not value.is_floating_point() else None
    if _int_list(value):
        return torch.tensor(value, dtype=torch.long)
    if type(value).__module__ == "numpy" and getattr(value, "ndim", None) == 1 and value.dtype.kind in "iu":
        return torch.from_numpy(value).long()
    return None


def token_tensor(sample: Any) -> Tensor:
    """The 1-D integer token tensor of a sample: the sample itself, ``sample["input_ids"]`` or ``sample[0]``.

    Token ids may also be a list of ints or a 1-D integer NumPy array (what a Hugging Face tokenizer or
    ``datasets.Dataset`` returns); they come back as a tensor.

    Raises:
        SpeedupConfigError: the sample holds no token ids where they are looked for.

    Example::

        >>> token_tensor({"input_ids": [101, 7, 102], "attention_mask": [1, 1, 1]}).tolist()
        [101, 7, 102]
    """
    found = _as_tokens(sample) if isinstance(sample, (Tensor, list)) else None  # the sample itself, scanned once
    if found is None and isinstance(sample, Mapping):
        key = next((k for k in TOKEN_KEYS if k in sample), None)
        found = _as_tokens(sample[key]) if key is not None else None
    elif found is None and isinstance(sample, Sequence) and not isinstance(sample, str) and len(sample) > 0:
        found = _as_tokens(sample[0])  # a tuple (or a list whose first item is not an int) holds them first
    if found is None:
        raise SpeedupConfigError(
            f"a sample of type {type(sample).__name__} holds no token tensor. Allowed values: a 1-D integer tensor or "
            f"list of ints, a dict with one under {' / '.join(map(repr, TOKEN_KEYS))}, or a tuple whose first item is "
            "one. HINT: sequence batching is for token data; image data keeps the default collate."
        )
    return found


def _round_up(n: int, multiple: int) -> int:
    return math.ceil(n / multiple) * multiple


def _pad_stack(seqs: Sequence[Tensor], length: int, value: int) -> Tensor:
    out = seqs[0].new_full((len(seqs), length), value)
    for i, seq in enumerate(seqs):
        out[i, : len(seq)] = seq
    return out


@dataclass(frozen=True)
class PadCollate:
    """A picklable ``collate_fn`` that pads each batch to its longest sample; built by :func:`pad_collate`."""

    pad_value: int = 0
    multiple_of: int = 8
    label_pad_value: int = IGNORE_INDEX
    tuple_mask: bool = True

    def __post_init__(self) -> None:
        check_int("pad_value", self.pad_value)
        check_int("multiple_of", self.multiple_of, 1)
        check_int("label_pad_value", self.label_pad_value)
        check_bool("tuple_mask", self.tuple_mask)

    def __call__(self, samples: Sequence[Any]) -> Any:
        if not samples:
            raise SpeedupConfigError("`samples` is empty. Allowed values: a non-empty list of samples.")
        tokens = [token_tensor(s) for s in samples]
        lengths = [len(t) for t in tokens]
        longest = _round_up(max(lengths), self.multiple_of)
        mask = torch.zeros(len(samples), longest, dtype=torch.long)
        for i, n in enumerate(lengths):
            mask[i, :n] = 1
        input_ids = _pad_stack(tokens, longest, self.pad_value)
        first = samples[0]
        if isinstance(first, Tensor) or _int_list(first):
            return {"input_ids": input_ids, "attention_mask": mask}
        if isinstance(first, Mapping):
            key = next(k for k in TOKEN_KEYS if k in first)
            out: dict[str, Any] = {"input_ids": input_ids, "attention_mask": mask}
            for name in first:
                if name in (key, "attention_mask"):
                    continue
                out[name] = self._field([s[name] for s in samples], lengths, longest, name == "labels")
            return out
        rest = [self._field([s[j] for s in samples], lengths, longest, True) for j in range(1, len(first))]
        return (input_ids, *rest, mask) if self.tuple_mask else (input_ids, *rest)

    def _field(self, values: list[Any], lengths: list[int], longest: int, is_label: bool) -> Any:
        """A per-token field (1-D, as long as the tokens; a tensor or a list of ints) is padded; anything else goes to
        ``default_collate``."""
        rows = [v if isinstance(v, Tensor) and v.dim() == 1 else _as_tokens(v) for v in values]
        if all(r is not None and len(r) == n for r, n in zip(rows, lengths)):
            return _pad_stack(rows, longest, self.label_pad_value if is_label else self.pad_value)
        return default_collate(values)


def pad_collate(
    pad_value: int = 0, multiple_of: int = 8, *, label_pad_value: int = IGNORE_INDEX, tuple_mask: bool = True
) -> PadCollate:
    """A ``collate_fn`` that pads each batch to its own longest sample (rounded up to ``multiple_of``).

    From samples that are 1-D token tensors, dicts (tokens under ``input_ids``) or tuples (tokens first), it builds
    ``input_ids`` of shape ``(batch, longest)`` and an ``attention_mask`` (1 for real tokens, 0 for padding). Other
    fields pass through: per-token ones (1-D, as long as the sample's tokens) are padded too, ``labels`` (and, in
    tuples, every per-token field after the tokens) with ``label_pad_value`` so ``cross_entropy`` skips them; the
    rest go through ``default_collate``. Dicts come back as dicts with the two keys first; tuples come back as
    ``(input_ids, *other fields, attention_mask)``, or with ``tuple_mask=False`` as ``(input_ids, *other fields)``
    (the arity a ``training_step`` that unpacks ``x, y = batch`` expects); bare tensors as a dict.

    Args:
        pad_value: the token id used for padding.
        multiple_of: the padded length is rounded up to this (8 suits tensor cores and vector units).
        label_pad_value: the value per-token labels are padded with.
        tuple_mask: append the ``attention_mask`` to tuple batches.

    Raises:
        SpeedupConfigError: ``multiple_of`` < 1, or (when called) samples without a token tensor.

    Example::

        >>> collate = pad_collate(multiple_of=4)
        >>> samples = [{"input_ids": torch.tensor([5, 6]), "label": 1}, {"input_ids": torch.tensor([7]), "label": 0}]
        >>> batch = collate(samples)
        >>> batch["input_ids"].tolist(), batch["attention_mask"].tolist(), batch["label"].tolist()
        ([[5, 6, 0, 0], [7, 0, 0, 0]], [[1, 1, 0, 0], [1, 0, 0, 0]], [1, 0])
    """
    return PadCollate(
        pad_value=pad_value, multiple_of=multiple_of, label_pad_value=label_pad_value, tuple_mask=tuple_mask
    )


def pack_sequences(
    sequences: Sequence[Sequence[int] | Tensor], block_size: int, *, pad_value: int = 0
) -> dict[str, Tensor]:
    """Pack documents into rows of ``block_size`` tokens, with the boundaries an attention needs to keep them apart.

    Documents are laid end to end; a row that is full continues in the next one (the cut part starts at position 0
    there, as a new segment), and the last row is padded with ``pad_value``. Nothing else is wasted.

    Returns:
        A dict of tensors:

        - ``input_ids``: ``(rows, block_size)``.
        - ``labels``: ``input_ids`` with ``IGNORE_INDEX`` at padding and at the first token of every segment, so a
          model that shifts labels never learns to predict one document from the end of another.
        - ``position_ids``: ``(rows, block_size)``, restarting at 0 at every segment (padding counts on as one more).
        - ``document_ids``: ``(rows, block_size)``, the index of the segment each token belongs to within its row.
        - ``cu_seqlens``: ``int32``, the cumulative segment lengths over the flattened rows (``0, ..., rows *
          block_size``), the form variable-length attention kernels take; ``max_seqlen``: the longest segment.

    Raises:
        SpeedupConfigError: ``block_size`` < 1, no documents, or an empty document.

    Example::

        >>> out = pack_sequences([[1, 2, 3], [4, 5], [6, 7, 8, 9]], block_size=4)
        >>> out["input_ids"].tolist()
        [[1, 2, 3, 4], [5, 6, 7, 8], [9, 0, 0, 0]]
        >>> out["position_ids"].tolist()
        [[0, 1, 2, 0], [0, 0, 1, 2], [0, 0, 1, 2]]
    """
    check_int("block_size", block_size, 1)
    docs = [torch.as_tensor(s, dtype=torch.long).reshape(-1) for s in sequences]
    if not docs:
        raise SpeedupConfigError("`sequences` is empty. Allowed values: a non-empty list of token sequences.")
    empty = next((i for i, d in enumerate(docs) if d.numel() == 0), None)
    if empty is not None:
        raise SpeedupConfigError(f"`sequences`[{empty}] is empty. Allowed values: sequences of at least one token.")
    flat = torch.cat(docs)
    total = flat.numel()
    rows = math.ceil(total / block_size)
    size = rows * block_size
    input_ids = torch.full((size,), pad_value, dtype=torch.long)
    input_ids[:total] = flat
    # a segment starts at every document start and every row start; the padding is one more segment
    starts = torch.zeros(size, dtype=torch.bool)
    doc_starts = torch.cumsum(torch.tensor([0] + [d.numel() for d in docs[:-1]]), 0)
    starts[doc_starts] = True
    starts[::block_size] = True
    if total < size:
        starts[total] = True
    seg = torch.cumsum(starts.long(), 0) - 1
    seg_start = torch.nonzero(starts).flatten()
    position_ids = torch.arange(size) - seg_start[seg]
    labels = input_ids.clone()
    labels[starts] = IGNORE_INDEX
    labels[total:] = IGNORE_INDEX
    row_first_seg = seg.view(rows, block_size)[:, :1]
    bounds = torch.cat([seg_start, torch.tensor([size])])
    return {
        "input_ids": input_ids.view(rows, block_size),
        "labels": labels.view(rows, block_size),
        "position_ids": position_ids.view(rows, block_size),
        "document_ids": seg.view(rows, block_size) - row_first_seg,
        "cu_seqlens": bounds.to(torch.int32),
        "max_seqlen": torch.tensor(int((bounds[1:] - bounds[:-1]).max())),
    }


def packed_attention_mask(position_ids: Tensor, causal: bool = True) -> Tensor:
    """The boolean ``(batch, 1, L, L)`` mask (``True`` = may attend) that keeps packed documents apart, for SDPA.

    A new document starts wherever the position does not go up by one (the rule Hugging Face's masking uses), so
    the ``position_ids`` of :func:`pack_sequences` are enough. Pass it as ``attn_mask`` to
    ``F.scaled_dot_product_attention`` (with ``is_causal=False``: the mask is causal already when ``causal``).

    Example::

        >>> packed_attention_mask(torch.tensor([[0, 1, 0]]))[0, 0].int().tolist()
        [[1, 0, 0], [1, 1, 0], [0, 0, 1]]
    """
    if position_ids.dim() != 2:
        raise SpeedupConfigError(
            f"`position_ids` has shape {tuple(position_ids.shape)}. Allowed values: a (batch, length) tensor."
        )
    first = position_ids[:, :1] - 1
    doc = (torch.diff(position_ids, prepend=first, dim=-1) != 1).cumsum(-1)
    mask = doc.unsqueeze(-1) == doc.unsqueeze(-2)
    if causal:
        length = position_ids.shape[-1]
        mask = mask & torch.ones(length, length, dtype=torch.bool, device=position_ids.device).tril()
    return mask.unsqueeze(1)


@dataclass(frozen=True)
class PackCollate:
    """A picklable ``collate_fn`` that packs a batch's documents into rows; built by :func:`pack_collate`."""

    block_size: int
    pad_value: int = 0
    keys: tuple[str, ...] = ("input_ids", "labels", "position_ids")

    def __post_init__(self) -> None:
        check_int("block_size", self.block_size, 1)
        check_int("pad_value", self.pad_value)
        allowed = ("input_ids", "labels", "position_ids", "document_ids", "cu_seqlens", "max_seqlen")
        bad = [k for k in self.keys if k not in allowed]
        if bad or not self.keys:
            raise SpeedupConfigError(f"`keys`={self.keys!r} is not supported. Allowed values: a subset of {allowed}.")

    def __call__(self, samples: Sequence[Any]) -> dict[str, Tensor]:
        packed = pack_sequences([token_tensor(s) for s in samples], self.block_size, pad_value=self.pad_value)
        return {k: packed[k] for k in self.keys}


def pack_collate(
    block_size: int, pad_value: int = 0, keys: Sequence[str] = ("input_ids", "labels", "position_ids")
) -> PackCollate:
    """:func:`pack_sequences` as a ``collate_fn``: each batch of documents becomes full rows of ``block_size``.

    ``keys`` picks what the batch holds; the default is what a Hugging Face causal LM takes for padding-free
    training (no ``attention_mask``: it reads the boundaries from ``position_ids``). HF does so only without a KV
    cache: call it with ``use_cache=False`` or set ``model.config.use_cache = False``, else (the config default
    ``True``, in train mode too) it attends across documents.
    """
    return PackCollate(block_size=block_size, pad_value=pad_value, keys=tuple(keys))


@dataclass(frozen=True)
class SequenceLengths:
    """The samples' lengths and how long reading them took (``seconds`` is 0.0 when they came from the cache)."""

    lengths: list[int]
    seconds: float
    source: str  # "argument", "dataset.lengths", "cache" or "read"


_CACHE: weakref.WeakKeyDictionary[Any, list[int]] = weakref.WeakKeyDictionary()


def sequence_lengths(dataset: Any, lengths: Sequence[int] | None = None) -> SequenceLengths:
    """Every sample's length in tokens: ``lengths`` when given, the dataset's ``lengths`` attribute, or read once.

    Reading indexes every sample once (its per-sample work included), so the result is cached per dataset object.

    Raises:
        SpeedupConfigError: ``lengths`` whose count differs from the dataset's, a dataset without ``len``, or
            samples without a token tensor.
    """
    try:
        size = len(dataset)
    except TypeError as err:
        raise SpeedupConfigError(
            f"`dataset` of type {type(dataset).__name__} has no length. Allowed values: a map-style dataset."
        ) from err
    source = "argument"
    if lengths is None and getattr(dataset, "lengths", None) is not None:
        lengths = dataset.lengths
        source = "dataset.lengths"
    if lengths is not None:
        values = check_lengths(lengths).tolist()
        if len(values) != size:
            raise SpeedupConfigError(
                f"`lengths` has {len(values)} entries but the dataset has {size} samples. Allowed values: one length "
                "per sample."
            )
        return SequenceLengths(values, 0.0, source)
    try:
        cached = _CACHE.get(dataset)
    except TypeError:  # not weak-referenceable
        cached = None
    if cached is not None and len(cached) == size:
        return SequenceLengths(cached, 0.0, "cache")
    start = time.perf_counter()
    values = [len(token_tensor(dataset[i])) for i in range(size)]
    seconds = time.perf_counter() - start
    try:
        _CACHE[dataset] = values
    except TypeError:
        pass
    return SequenceLengths(values, seconds, "read")
