"""Batch samplers for token sequences: batches of similar lengths, so little of each batch is padding.

- :class:`LengthGroupedSampler`: a fixed number of samples per batch, grouped by length (Hugging Face's
  ``group_by_length``: shuffle, cut into groups of many batches, sort each group by length, cut into batches).
- :class:`TokenBudgetBatchSampler`: as many samples as fit ``max_tokens`` padded tokens (fairseq's ``max_tokens``:
  sort by length with random ties, fill batches greedily, shuffle the batches).
- :class:`PackedBatchSampler`: as many documents as fill ``rows`` rows of ``block_size`` tokens when packed.

All three yield lists of indices (use them as ``DataLoader(batch_sampler=...)``), are seeded (epoch ``e`` draws from
``(seed, e)``, the same on every rank), shard themselves under DDP (ranks take turns over batches of neighbouring
lengths, so one step costs about the same on every rank, and every rank gets the same number of batches), and resume
mid-epoch: :meth:`state_dict` / :meth:`load_state_dict` carry the epoch and the batches already consumed, and the next
iteration of that epoch skips them. :class:`~lightning_speedups.SequenceBatching` saves that state in the checkpoint.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from lightning_speedups._errors import SpeedupConfigError, check_bool, check_int
from lightning_speedups.data._sampler_base import SequenceBatchSampler, pad_fraction

__all__ = ["LengthGroupedSampler", "PackedBatchSampler", "TokenBudgetBatchSampler", "pad_fraction"]

# samples per sorted group, in batches: large enough that neighbours in a group have nearly equal lengths, small
# enough that a group spans a small part of the data set (Hugging Face's mega_batch_mult is 50)
_GROUP_BATCHES = 50


class LengthGroupedSampler(SequenceBatchSampler):
    """Batches of ``batch_size`` samples of similar length, the groups in a random order.

    Each epoch shuffles the indices, cuts them into groups of ``group_batches * batch_size``, sorts every group by
    length and cuts it into batches; the batches (in steps of one per rank) are then shuffled. Neighbouring lengths
    share a batch, so a batch padded to its longest sample is mostly real tokens, while the epoch still sees the
    samples in a new random grouping (the Hugging Face Trainer's ``group_by_length``). With ``shuffle=False`` the
    whole data set is sorted by length and the batches come shortest first.

    Args:
        lengths: one length (tokens) per sample of the dataset.
        batch_size: samples per batch.
        shuffle: a new random grouping and batch order every epoch.
        seed: seeds the order; epoch ``e`` uses ``(seed, e)``.
        group_batches: batches per sorted group: larger groups pad less but mix the data set less (rounded up to a
            multiple of the world size, so no DDP step spans two groups).
        drop_last: drop the last batch when it is smaller than ``batch_size``.
        rank, world_size: explicit sharding (both or neither); default: torch.distributed's, else ``0, 1``.

    Raises:
        SpeedupConfigError: empty or non-positive ``lengths``, ``batch_size`` or ``group_batches`` < 1, or a bad
            ``rank``/``world_size``.

    Example::

        >>> sampler = LengthGroupedSampler([5, 1, 4, 2, 8, 3], batch_size=2, shuffle=False)
        >>> list(sampler)
        [[1, 3], [5, 2], [0, 4]]
    """

    def __init__(
        self,
        lengths: Sequence[int] | torch.Tensor,
        batch_size: int,
        *,
        shuffle: bool = True,
        seed: int = 0,
        group_batches: int = _GROUP_BATCHES,
        drop_last: bool = False,
        rank: int | None = None,
        world_size: int | None = None,
    ) -> None:
        super().__init__(lengths, shuffle=shuffle, seed=seed, rank=rank, world_size=world_size)
        self.batch_size = check_int("batch_size", batch_size, 1)
        self.group_batches = check_int("group_batches", group_batches, 1)
        self.drop_last = check_bool("drop_last", drop_last)

    def _global_batches(self, generator: torch.Generator) -> list[list[int]]:
        if not self.shuffle:
            order = self._order_by_length(generator).tolist()
        else:
            perm = torch.randperm(len(self.lengths), generator=generator)
            # whole DDP steps per group: a step straddling two groups would pair a group's longest batch with the
            # next group's shortest, one rank waiting on the other
            world = self.rank_world()[1]
            group = math.ceil(self.group_batches / world) * world * self.batch_size
            order = []
            for start in range(0, len(perm), group):
                chunk = perm[start : start + group]
                order.extend(chunk[torch.sort(self.lengths[chunk], stable=True).indices].tolist())
        batches = [order[i : i + self.batch_size] for i in range(0, len(order), self.batch_size)]
        if self.drop_last and batches and len(batches[-1]) < self.batch_size:
            batches.pop()
        return batches

    def extra_repr(self) -> str:
        return f"batch_size={self.batch_size}, {super().extra_repr()}"


class TokenBudgetBatchSampler(SequenceBatchSampler):
    """Batches whose padded size (longest length x count) stays within ``max_tokens``.

    Short samples come many to a batch and long ones few, so every step costs about the same. Each epoch sorts the
    indices by length (equal lengths in a random order), fills batches greedily in that order and shuffles the
    batches (fairseq's ``max_tokens`` batching); the number of batches is the same every epoch.

    Args:
        lengths: one length (tokens) per sample.
        max_tokens: the padded tokens a batch may hold.
        shuffle: a new batch order (and grouping of equal lengths) every epoch.
        seed: seeds the order.
        multiple_of: the collate pads to a multiple of this (see :func:`pad_collate`); the budget counts it.
        max_batch_size: at most this many samples per batch (``None``: no limit).
        rank, world_size: explicit sharding (both or neither).

    Raises:
        SpeedupConfigError: ``max_tokens`` below the longest sample (naming its index and length), or bad arguments.

    Example::

        >>> sampler = TokenBudgetBatchSampler([5, 1, 4, 2, 8, 3], max_tokens=8, shuffle=False)
        >>> list(sampler)
        [[1, 3], [5, 2], [0], [4]]
    """

    def __init__(
        self,
        lengths: Sequence[int] | torch.Tensor,
        max_tokens: int,
        *,
        shuffle: bool = True,
        seed: int = 0,
        multiple_of: int = 1,
        max_batch_size: int | None = None,
        rank: int | None = None,
        world_size: int | None = None,
    ) -> None:
        super().__init__(lengths, shuffle=shuffle, seed=seed, rank=rank, world_size=world_size)
        self.max_tokens = check_int("max_tokens", max_tokens, 1)
        self.multiple_of = check_int("multiple_of", multiple_of, 1)
        self.max_batch_size = check_int("max_batch_size", max_batch_size, 1, optional=True)
        longest = int(torch.argmax(self.lengths))
        need = self._padded(int(self.lengths[longest]))
        if need > self.max_tokens:
            raise SpeedupConfigError(
                f"`max_tokens`={max_tokens} is below sample {longest}, of length {int(self.lengths[longest])}"
                f"{f' (padded to {need})' if need != int(self.lengths[longest]) else ''}. Allowed values: an integer "
                f">= {need}. HINT: truncate long samples, or raise the budget."
            )

    def _padded(self, length: int) -> int:
        return math.ceil(length / self.multiple_of) * self.multiple_of

    def _global_batches(self, generator: torch.Generator) -> list[list[int]]:
        order = self._order_by_length(generator)
        sizes = self.lengths[order].tolist()
        batches: list[list[int]] = []
        current: list[int] = []
        cap = self.max_batch_size or len(sizes)
        for idx, size in zip(order.tolist(), sizes):
            # sorted ascending: the new sample is the batch's longest
            if current and (self._padded(size) * (len(current) + 1) > self.max_tokens or len(current) >= cap):
                batches.append(current)
                current = []
            current.append(idx)
        if current:
            batches.append(current)
        return batches

    def extra_repr(self) -> str:
        return f"max_tokens={self.max_tokens}, {super().extra_repr()}"


class PackedBatchSampler(SequenceBatchSampler):
    """Batches of documents that fill ``rows`` rows of ``block_size`` tokens once packed (see :func:`pack_sequences`).

    Each batch starts with the longest document left and adds the shortest ones while the total fits
    ``rows * block_size`` (documents longer than the whole budget are cut into rows by the collate, which then fills
    the rows with almost no padding). Equal lengths are taken in a seeded random order and the batches are shuffled,
    so the number of batches depends only on the lengths: it is the same every epoch, as Lightning expects.

    Args:
        lengths: one length (tokens) per document.
        block_size: tokens per packed row.
        rows: rows per batch (the batch size of the packed tensors).
        shuffle, seed, rank, world_size: as for :class:`LengthGroupedSampler`.

    Example::

        >>> sampler = PackedBatchSampler([5, 1, 4, 2, 8, 3], block_size=4, rows=2, shuffle=False)
        >>> list(sampler)
        [[4], [0, 1, 3], [2, 5]]
    """

    def __init__(
        self,
        lengths: Sequence[int] | torch.Tensor,
        block_size: int,
        rows: int,
        *,
        shuffle: bool = True,
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
    ) -> None:
        super().__init__(lengths, shuffle=shuffle, seed=seed, rank=rank, world_size=world_size)
        self.block_size = check_int("block_size", block_size, 1)
        self.rows = check_int("rows", rows, 1)

    def _global_batches(self, generator: torch.Generator) -> list[list[int]]:
        budget = self.block_size * self.rows
        order = self._order_by_length(generator).tolist()
        sizes = {i: int(n) for i, n in zip(order, self.lengths[order].tolist())}
        batches: list[list[int]] = []
        lo, hi = 0, len(order) - 1
        while lo <= hi:  # the longest document left, then the shortest ones while they fit
            current, used = [order[hi]], sizes[order[hi]]
            hi -= 1
            while lo <= hi and used + sizes[order[lo]] <= budget:
                current.append(order[lo])
                used += sizes[order[lo]]
                lo += 1
            batches.append(current)
        return batches

    def extra_repr(self) -> str:
        return f"block_size={self.block_size}, rows={self.rows}, {super().extra_repr()}"
