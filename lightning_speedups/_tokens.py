"""Counting the tokens of a training batch: the real (non-pad) ones and all the positions the model computes.

One counting rule for everything that measures in tokens (:class:`~lightning_speedups.callbacks.TokenThroughput`,
``SpeedAdvisor``'s padding finding, the batch-size finder's tokens/s). It reads a *collated* batch:

- the token ids: a 2-D ``(batch, length)`` integer tensor: the batch itself, ``batch["input_ids"]`` (or under
  ``"tokens"`` / ``"input"`` / ``"x"``), or the first item of a tuple or list;
- the real tokens, by the first rule that applies: an ``attention_mask`` of the same shape (its non-zeros; in a tuple,
  the last item when it looks like one: 0/1 values, every row padded on one side only and holding a token, as
  :func:`~lightning_speedups.data.pad_collate` puts it), else ``tokens != pad_value`` when ``pad_value`` is given,
  else ``labels != ignore_index`` (``batch["labels"]``, or a tuple's second item of the same shape), else every
  position counts.

Image batches (floating-point or 4-D tensors) hold no token ids: :func:`count_tokens` returns ``None`` for them. On a
GPU, counting costs one device synchronisation (a single ``.tolist()``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from lightning_speedups._errors import SpeedupConfigError

__all__ = ["IGNORE_INDEX", "TOKEN_KEYS", "TokenCount", "TokenCounter", "as_token_count", "count_tokens", "token_ids"]

IGNORE_INDEX = -100  # what cross_entropy skips by default, and what pad_collate pads labels with
TOKEN_KEYS = ("input_ids", "tokens", "input", "x")


@dataclass(frozen=True)
class TokenCount:
    """The tokens of one batch.

    Attributes:
        tokens: real (non-pad) tokens.
        padded: every position of the token tensor (``batch x length``): what the model computes on.
        sequences: rows of the token tensor.
        source: how ``tokens`` was counted: ``"attention_mask"``, ``"pad_value"``, ``"labels"``, ``"all"`` or
            ``"custom"`` (a user's function).
    """

    tokens: int
    padded: int
    sequences: int = 0
    source: str = "all"

    @property
    def pad_fraction(self) -> float:
        """Share of the positions that are padding (0.0 for an empty batch)."""
        return 1.0 - self.tokens / self.padded if self.padded else 0.0


def _is_ids(value: Any) -> bool:
    return (
        isinstance(value, Tensor)
        and value.dim() == 2
        and not value.is_floating_point()
        and not value.is_complex()
        and value.dtype != torch.bool
    )


def _same_shape(value: Any, ids: Tensor) -> bool:
    return isinstance(value, Tensor) and value.shape == ids.shape and not value.is_complex()


def token_ids(batch: Any) -> Tensor | None:
    """The batch's ``(batch, length)`` integer token tensor, or ``None`` when it holds none (an image batch).

    Example::

        >>> token_ids({"input_ids": torch.tensor([[5, 6, 0]])}).tolist()
        [[5, 6, 0]]
        >>> token_ids((torch.randn(2, 3, 8, 8), torch.tensor([1, 0]))) is None
        True
    """
    if isinstance(batch, Mapping):
        key = next((k for k in TOKEN_KEYS if k in batch and _is_ids(batch[k])), None)
        return None if key is None else batch[key]
    if isinstance(batch, Sequence) and not isinstance(batch, (str, bytes)):
        return batch[0] if len(batch) > 0 and _is_ids(batch[0]) else None
    return batch if _is_ids(batch) else None


def _mask_like(value: Tensor) -> Tensor:
    """The conditions under which a tuple's last item is read as a padding mask, as one 0/1 tensor."""
    m = value.long()
    binary = ((m == 0) | (m == 1)).all()
    if m.shape[1] > 1:
        right = (m[:, 1:] <= m[:, :-1]).all()  # 1 1 0 0: padded on the right
        left = (m[:, 1:] >= m[:, :-1]).all()  # 0 0 1 1: padded on the left
        one_sided = right | left
    else:
        one_sided = torch.ones((), dtype=torch.bool, device=m.device)
    nonempty = (m.sum(dim=1) > 0).all()
    return (binary & one_sided & nonempty).long()


def count_tokens(batch: Any, pad_value: int | None = None, ignore_index: int = IGNORE_INDEX) -> TokenCount | None:
    """Count the real and the padded tokens of a collated batch (the rules are in the module docstring).

    Args:
        batch: a dict (``input_ids`` / ``attention_mask`` / ``labels``), a tuple or list (token ids first; a padding
            mask last, as :func:`~lightning_speedups.data.pad_collate` builds it), or a bare token tensor.
        pad_value: the padding token id, used when the batch has no attention mask (``None``: not used).
        ignore_index: the label value that marks padding in ``labels``.

    Returns:
        A :class:`TokenCount`, or ``None`` when the batch holds no 2-D integer token tensor.

    Example::

        >>> batch = {"input_ids": torch.tensor([[5, 6, 7], [8, 0, 0]]), "attention_mask": torch.tensor([[1, 1, 1],
        ...          [1, 0, 0]])}
        >>> c = count_tokens(batch)
        >>> c.tokens, c.padded, round(c.pad_fraction, 3), c.source
        (4, 6, 0.333, 'attention_mask')
        >>> count_tokens(torch.tensor([[5, 6, 0], [7, 0, 0]]), pad_value=0).tokens
        3
    """
    ids = token_ids(batch)
    if ids is None:
        return None
    rows = int(ids.shape[0])
    padded = int(ids.numel())
    mask = labels = None
    if isinstance(batch, Mapping):
        found = batch.get("attention_mask")
        mask = found if _same_shape(found, ids) else None
        found = batch.get("labels")
        labels = found if _same_shape(found, ids) else None
    elif isinstance(batch, Sequence) and len(batch) >= 2:
        last = batch[-1]
        second = batch[1]
        if _same_shape(last, ids) and not last.is_floating_point():
            ok, real = torch.stack([_mask_like(last), (last != 0).sum()]).tolist()  # one sync for both
            if ok:
                return TokenCount(int(real), padded, rows, "attention_mask")
        if _same_shape(second, ids) and not second.is_floating_point():
            labels = second
    if mask is not None:
        return TokenCount(int((mask != 0).sum()), padded, rows, "attention_mask")
    if pad_value is not None:
        return TokenCount(int((ids != pad_value).sum()), padded, rows, "pad_value")
    if labels is not None:
        return TokenCount(int((labels != ignore_index).sum()), padded, rows, "labels")
    return TokenCount(padded, padded, rows, "all")


def as_token_count(value: Any) -> TokenCount | None:
    """What a user's ``batch_to_tokens(batch)`` returned, as a :class:`TokenCount`.

    Accepts a :class:`TokenCount`, an int (real tokens; no padding known), a pair ``(real, padded)``, or ``None``
    (not token data).

    Raises:
        SpeedupConfigError: any other value, negative counts or more real than padded tokens.

    Example::

        >>> as_token_count((6, 8)).pad_fraction
        0.25
    """
    if value is None or isinstance(value, TokenCount):
        return value
    if isinstance(value, Tensor) and value.numel() == 1:
        value = int(value)
    if isinstance(value, int) and not isinstance(value, bool):
        value = (value, value)
    ok = (
        isinstance(value, Sequence)
        and len(value) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    )
    if not ok or value[0] < 0 or value[0] > value[1]:
        raise SpeedupConfigError(
            f"`batch_to_tokens` returned {value!r}. Allowed values: an int (real tokens), a pair (real tokens, padded "
            "tokens) with 0 <= real <= padded, a TokenCount, or None (not token data)."
        )
    return TokenCount(int(value[0]), int(value[1]), 0, "custom")


@dataclass(frozen=True)
class TokenCounter:
    """A picklable ``batch -> TokenCount | None``: the user's ``batch_to_tokens`` when given, else
    :func:`count_tokens` with ``pad_value`` and ``ignore_index``."""

    pad_value: int | None = None
    ignore_index: int = IGNORE_INDEX
    batch_to_tokens: Callable[[Any], Any] | None = None

    def __call__(self, batch: Any) -> TokenCount | None:
        if self.batch_to_tokens is not None:
            return as_token_count(self.batch_to_tokens(batch))
        return count_tokens(batch, pad_value=self.pad_value, ignore_index=self.ignore_index)
