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
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch.utils.data import Sampler

from lightning_speedups._errors import SpeedupConfigError, check_bool, check_int

__all__ = ["LengthGroupedSampler", "PackedBatchSampler", "TokenBudgetBatchSampler", "pad_fraction"]

# samples per sorted group, in batches: large enough that neighbours in a group have nearly equal lengths, small
# enough that a group spans a small part of the data set (Hugging Face's mega_batch_mult is 50)
_GROUP_BATCHES = 50


def _check_lengths(lengths: Sequence[int] | torch.Tensor) -> torch.Tensor:
    try:
        raw = torch.as_tensor(lengths)
        # a float or bool dtype would be truncated silently by a cast to long (1.7 -> 1): refuse it instead
        if raw.numel() and (raw.is_floating_point() or raw.is_complex() or raw.dtype == torch.bool):
            raise TypeError(f"dtype {raw.dtype}")
    except (TypeError, ValueError, RuntimeError) as err:
        raise SpeedupConfigError(
            f"`lengths` of type {type(lengths).__name__} is not a sequence of integers. Allowed values: a list or 1-D "
            "tensor with one length (in tokens) per sample."
        ) from err
    out = raw.long()
    if out.dim() != 1 or out.numel() == 0:
        raise SpeedupConfigError(
            f"`lengths` has shape {tuple(out.shape)}. Allowed values: a non-empty list or 1-D tensor, one length per "
            "sample."
        )
    if bool((out < 1).any()):
        bad = int(torch.nonzero(out < 1)[0])
        raise SpeedupConfigError(
            f"`lengths`[{bad}]={int(out[bad])} is not a sequence length. Allowed values: integers >= 1."
        )
    return out


def pad_fraction(
    lengths: Sequence[int] | torch.Tensor, batches: Sequence[Sequence[int]], multiple_of: int = 1
) -> float:
    """Share of the padded tokens of ``batches`` that are padding (each batch padded to its longest sample).

    Example::

        >>> pad_fraction([2, 4, 4, 8], [[0, 1], [2, 3]])
        0.25
    """
    lens = _check_lengths(lengths)
    check_int("multiple_of", multiple_of, 1)
    real = padded = 0
    for batch in batches:
        sizes = lens[list(batch)]
        longest = math.ceil(int(sizes.max()) / multiple_of) * multiple_of
        real += int(sizes.sum())
        padded += longest * len(batch)
    return 1.0 - real / padded if padded else 0.0


def _dist_rank_world() -> tuple[int, int]:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


class _EpochSetter:
    """What Lightning finds as ``batch_sampler.sampler``: it calls its ``set_epoch`` at the start of every epoch."""

    def __init__(self, owner: _SequenceBatchSampler) -> None:
        self._owner = owner

    def set_epoch(self, epoch: int) -> None:
        self._owner.set_epoch(epoch)


class _SequenceBatchSampler(Sampler[list[int]]):
    """Seeding, DDP sharding, epochs and resume state shared by the sequence batch samplers.

    A subclass implements :meth:`_global_batches`: the epoch's batches for all ranks, in an order where neighbours
    have similar lengths. This class deals them out: steps of ``world_size`` neighbouring batches, the steps in a
    seeded random order (when ``shuffle``), rank ``r`` taking the ``r``-th batch of each step. When the batches do
    not split evenly over the ranks, the last step is completed with the first batches (a few samples appear twice
    per epoch, as with ``DistributedSampler``), so every rank runs the same number of steps.
    """

    def __init__(
        self,
        lengths: Sequence[int] | torch.Tensor,
        *,
        shuffle: bool = True,
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
    ) -> None:
        self.lengths = _check_lengths(lengths)
        self.shuffle = check_bool("shuffle", shuffle)
        self.seed = check_int("seed", seed)
        if (rank is None) != (world_size is None):
            raise SpeedupConfigError(
                f"`rank`={rank!r} and `world_size`={world_size!r} must be given together. Allowed values: both "
                "integers, or both None (read from torch.distributed)."
            )
        if world_size is not None:
            check_int("world_size", world_size, 1)
            check_int("rank", rank, 0, world_size - 1)
        self._rank, self._world = rank, world_size
        self.epoch = 0
        self.sampler = _EpochSetter(self)  # Lightning calls batch_sampler.sampler.set_epoch(epoch)
        self._consumed = 0  # batches of this epoch yielded so far (this rank)
        self._skip: tuple[int, int] | None = None  # (epoch, batches) to skip at the next iteration, after a resume
        self._plan: tuple[int, int, int, list[list[int]]] | None = None  # (epoch, rank, world, batches) cache

    # ------------------------------------------------------------------ what subclasses define
    def _global_batches(self, generator: torch.Generator) -> list[list[int]]:
        raise NotImplementedError

    # ------------------------------------------------------------------ epochs and ranks
    def rank_world(self) -> tuple[int, int]:
        """``(rank, world_size)``: the ones given, else torch.distributed's, else ``(0, 1)``."""
        if self._world is not None:
            assert self._rank is not None
            return self._rank, self._world
        return _dist_rank_world()

    def set_epoch(self, epoch: int) -> None:
        """Use epoch ``epoch``'s order at the next iteration (Lightning calls this at every epoch start)."""
        if check_int("epoch", epoch, 0) != self.epoch:
            self._consumed = 0  # a new epoch has consumed nothing yet: state_dict() must not carry the old count
        self.epoch = epoch

    def _generator(self, salt: int) -> torch.Generator:
        gen = torch.Generator()
        gen.manual_seed(self.seed * 1_000_003 + self.epoch * 7919 + salt)
        return gen

    def batches(self) -> list[list[int]]:
        """This rank's batches for the current epoch (a list of index lists), computed once per epoch."""
        rank, world = self.rank_world()
        if self._plan is not None and self._plan[:3] == (self.epoch, rank, world):
            return self._plan[3]
        batches = self._global_batches(self._generator(0))
        steps = [batches[i : i + world] for i in range(0, len(batches), world)]
        if steps and len(steps[-1]) < world:  # complete the last step so every rank runs the same number of steps
            steps[-1] = steps[-1] + [batches[j % len(batches)] for j in range(world - len(steps[-1]))]
        if self.shuffle:
            steps = [steps[i] for i in torch.randperm(len(steps), generator=self._generator(1)).tolist()]
        mine = [step[rank] for step in steps]
        self._plan = (self.epoch, rank, world, mine)
        return mine

    def __len__(self) -> int:
        return len(self.batches())

    def __iter__(self) -> Iterator[list[int]]:
        batches = self.batches()
        start = 0
        if self._skip is not None:
            epoch, done = self._skip
            self._skip = None
            if epoch == self.epoch:
                start = min(done, len(batches))
        self._consumed = start
        for batch in batches[start:]:
            self._consumed += 1
            yield list(batch)

    # ------------------------------------------------------------------ resume
    def state_dict(self, consumed: int | None = None) -> dict[str, Any]:
        """Plain-data state: seed, epoch and the batches of this epoch already consumed.

        Args:
            consumed: batches the training loop has consumed this epoch; default: the batches this sampler has
                yielded, which runs ahead of the loop when a DataLoader prefetches (workers, Lightning's fetcher).
        """
        return {
            "seed": self.seed,
            "epoch": self.epoch,
            "consumed": self._consumed if consumed is None else int(consumed),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume: the next iteration of epoch ``state["epoch"]`` skips its first ``state["consumed"]`` batches."""
        for key in ("seed", "epoch", "consumed"):
            if key not in state:
                raise SpeedupConfigError(
                    f"`state` has no {key!r}. Allowed values: a dict from `state_dict()` with 'seed', 'epoch' and "
                    "'consumed'."
                )
        self.seed = int(state["seed"])
        self.epoch = int(state["epoch"])
        self._plan = None
        self._consumed = max(int(state["consumed"]), 0)  # a state_dict() before the next iteration keeps the skip
        self._skip = (self.epoch, self._consumed) if self._consumed > 0 else None

    # ------------------------------------------------------------------ helpers for subclasses
    def _order_by_length(self, generator: torch.Generator) -> torch.Tensor:
        """All indices sorted by length, equal lengths in a random order (a stable sort of a random permutation)."""
        if not self.shuffle:
            return torch.sort(self.lengths, stable=True).indices
        perm = torch.randperm(len(self.lengths), generator=generator)
        return perm[torch.sort(self.lengths[perm], stable=True).indices]

    def extra_repr(self) -> str:
        return f"samples={len(self.lengths)}, shuffle={self.shuffle}, seed={self.seed}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.extra_repr()})"


class LengthGroupedSampler(_SequenceBatchSampler):
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


class TokenBudgetBatchSampler(_SequenceBatchSampler):
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


class PackedBatchSampler(_SequenceBatchSampler):
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
