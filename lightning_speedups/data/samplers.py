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
import warnings
from collections.abc import Sequence

import torch

from lightning_speedups._errors import SpeedupConfigError, check_bool, check_int, check_range
from lightning_speedups.data._sampler_base import SequenceBatchSampler, pad_fraction

__all__ = ["LengthGroupedSampler", "PackedBatchSampler", "TokenBudgetBatchSampler", "pad_fraction"]

# the padded-token share "auto" keeps each epoch below: random batches of long-tailed lengths pad 30-50% of their
# tokens, a data set sorted whole about 1%
MAX_PAD_FRACTION = 0.05
# "auto" asks the padding plus this many standard errors to stay below the bound, so that other epochs do too
PAD_SIGMAS = 3.0
SIMULATED_SAMPLES = 2**17
POOLED_GROUPS = 16


class LengthGroupedSampler(SequenceBatchSampler):
    """Batches of ``batch_size`` samples of similar length, the groups in a random order.

    Each epoch shuffles the indices, cuts them into groups of ``group_batches * batch_size``, sorts every group by
    length and cuts it into batches; the batches (in steps of one per rank) are then shuffled. Neighbouring lengths
    share a batch, so a batch padded to its longest sample is mostly real tokens, while the epoch still sees the
    samples in a new random grouping (the Hugging Face Trainer's ``group_by_length``). With ``shuffle=False`` the
    whole data set is sorted by length and the batches come shortest first.

    ``group_batches="auto"`` (the default) sizes the groups from the lengths: the smallest group (the most random
    batches) whose epochs pad at most ``max_pad_fraction`` of their tokens, found by building the first epochs'
    batches of this ``seed`` for group sizes 1, 2, 4, ... batches, then bisecting between the last two (the whole
    data set sorted when no smaller group meets it, with a warning when not even that does on 16 batches or more: a
    small data set with a long tail). A fixed number of batches per group (Hugging Face's ``mega_batch_mult`` is 50)
    pads more the longer the tail: on log-normal lengths (median 37 tokens, a tail to 512) groups of 50
    batches pad 11-12% of the tokens, while "auto" picks groups of about 130 batches and pads 4.4% (the simulated
    numbers are in docs/techniques/sequence_batching.md). The choice depends only on the lengths, the batch size,
    the seed and the world size, so every rank and a resumed run make the same one (:attr:`group_size`).

    Args:
        lengths: one length (tokens) per sample of the dataset.
        batch_size: samples per batch.
        shuffle: a new random grouping and batch order every epoch.
        seed: seeds the order; epoch ``e`` uses ``(seed, e)``.
        group_batches: batches per sorted group, or ``"auto"``: larger groups pad less but mix the data set less
            (rounded up to a multiple of the world size, so no DDP step spans two groups).
        drop_last: drop the last batch when it is smaller than ``batch_size``.
        rank, world_size: explicit sharding (both or neither); default: torch.distributed's, else ``0, 1``.
        max_pad_fraction: with ``group_batches="auto"``, the share of an epoch's padded tokens that may be padding,
            in ``(0, 1)``.

    Raises:
        SpeedupConfigError: empty or non-positive ``lengths``, ``batch_size`` < 1, ``group_batches`` neither
            ``"auto"`` nor an integer >= 1, ``max_pad_fraction`` outside ``(0, 1)``, or a bad ``rank``/``world_size``.

    Example::

        >>> sampler = LengthGroupedSampler([5, 1, 4, 2, 8, 3], batch_size=2, shuffle=False)
        >>> list(sampler)
        [[1, 3], [5, 2], [0, 4]]
        >>> LengthGroupedSampler([4] * 64, batch_size=8).group_size  # equal lengths: any grouping, the most random
        1
    """

    def __init__(
        self,
        lengths: Sequence[int] | torch.Tensor,
        batch_size: int,
        *,
        shuffle: bool = True,
        seed: int = 0,
        group_batches: int | str = "auto",
        drop_last: bool = False,
        rank: int | None = None,
        world_size: int | None = None,
        max_pad_fraction: float = MAX_PAD_FRACTION,
    ) -> None:
        super().__init__(lengths, shuffle=shuffle, seed=seed, rank=rank, world_size=world_size)
        self.batch_size = check_int("batch_size", batch_size, 1)
        if group_batches != "auto":
            check_int("group_batches", group_batches, 1, hint="or 'auto' to size the groups from the lengths")
        self.group_batches = group_batches
        self.drop_last = check_bool("drop_last", drop_last)
        self.max_pad_fraction = check_range(
            "max_pad_fraction", max_pad_fraction, 0.0, 1.0, low_inclusive=False, high_inclusive=False
        )
        self._auto: dict[tuple[int, int], int] = {}  # (seed, world) -> the group size "auto" found

    @property
    def group_size(self) -> int:
        """The batches per sorted group this epoch uses (``group_batches``, or what ``"auto"`` found for this seed and
        world size), before the rounding up to a multiple of the world size."""
        if self.group_batches != "auto":
            return int(self.group_batches)
        world = self.rank_world()[1]
        key = (self.seed, world)
        if key not in self._auto:
            self._auto[key] = self._auto_group(world)
        return self._auto[key]

    def _auto_group(self, world: int) -> int:
        """The smallest group (in batches) whose epochs pad at most ``max_pad_fraction``: on simulated epochs of this
        seed (their first ``SIMULATED_SAMPLES``), the most any of them pads plus ``PAD_SIGMAS`` standard errors. An
        epoch's padding is a sum over its groups, so the spread of the groups' padding (pooled over the simulated
        epochs: at least ``POOLED_GROUPS`` groups, and two epochs) says how much another epoch's may differ."""
        # a long data set is judged on the first SIMULATED_SAMPLES of each permutation: its first groups, a random
        # sample of the epoch's (a group cut short there pads more, so the estimate errs toward larger groups)
        perms: dict[int, torch.Tensor] = {}
        whole = math.ceil(len(self.lengths) / self.batch_size)

        def perm(epoch: int) -> torch.Tensor:
            if epoch not in perms:
                gen = self._generator(0, epoch=epoch)
                perms[epoch] = torch.randperm(len(self.lengths), generator=gen)[:SIMULATED_SAMPLES]
            return perms[epoch]

        def fits(g: int) -> bool:
            samples = self._group_samples(g, world)
            groups = math.ceil(min(len(self.lengths), SIMULATED_SAMPLES) / samples)
            epochs = 1 if groups == 1 else max(2, math.ceil(POOLED_GROUPS / groups))  # one group: only ties vary
            worst = 0.0
            scale = 0.0
            wastes = []
            for epoch in range(epochs):
                tokens, wasted, full_groups = self._waste(self._grouped(perm(epoch), g, world), samples)
                if tokens + wasted:
                    worst = max(worst, wasted / (tokens + wasted))
                    scale = max(scale, tokens / (tokens + wasted) ** 2)  # padding tokens -> padded share
                wastes.append(full_groups)
            pooled = torch.cat(wastes)
            error = float(pooled.std()) * math.sqrt(groups) * scale if len(pooled) > 1 else 0.0
            return worst + PAD_SIGMAS * error <= self.max_pad_fraction

        # low: a size known not to fit (0: none yet), high: the one to try
        low = 0
        high = 1
        while not fits(high):
            if high >= whole:
                if whole >= POOLED_GROUPS:  # a few batches (a test, a toy set): too few to group, nothing to say
                    self._warn_unreachable(perm(0), whole, world)
                return whole
            low = high
            high = min(2 * high, whole)
        while high - low > max(1, high // 8):  # bisect to within an eighth: the most random group that still fits
            mid = (low + high) // 2
            low, high = (low, mid) if fits(mid) else (mid, high)
        return high

    def _warn_unreachable(self, perm: torch.Tensor, whole: int, world: int) -> None:
        fraction = self._padding(self._grouped(perm, whole, world), self._group_samples(whole, world))
        warnings.warn(
            f"LengthGroupedSampler: even the whole data set sorted by length pads {fraction:.1%} of the tokens at "
            f"`batch_size`={self.batch_size}, more than `max_pad_fraction`={self.max_pad_fraction}: it is sorted whole "
            "(the batches still come in a random order), the least padding batches of a fixed size allow. HINT: "
            "TokenBudgetBatchSampler fills batches by tokens and pads less on a long tail; a smaller batch_size pads "
            "less too.",
            stacklevel=4,
        )

    def _group_samples(self, group: int, world: int) -> int:
        # whole DDP steps per group: a step straddling two groups would pair a group's longest batch with the next
        # group's shortest, one rank waiting on the other
        return math.ceil(group / world) * world * self.batch_size

    def _grouped(self, perm: torch.Tensor, group: int, world: int) -> torch.Tensor:
        """``perm`` cut into groups of ``group`` batches (whole DDP steps), each sorted by length (stable)."""
        groups = torch.arange(len(perm)) // self._group_samples(group, world)
        key = groups * (int(self.lengths.max()) + 1) + self.lengths[perm]
        return perm[torch.sort(key, stable=True).indices]

    def _waste(self, order: torch.Tensor, group_samples: int) -> tuple[float, float, torch.Tensor]:
        """The real and the padding tokens of the batches cut from ``order`` (each padded to its longest sample), and
        the padding tokens of each full group of ``group_samples`` samples (the last group may be smaller)."""
        lens = self.lengths[order]
        full = len(lens) // self.batch_size * self.batch_size
        rows = lens[:full].view(-1, self.batch_size)
        real = rows.sum(dim=1)
        waste = rows.max(dim=1).values * self.batch_size - real
        if full < len(lens) and not self.drop_last:  # the last, smaller batch
            rest = lens[full:]
            real = torch.cat([real, rest.sum().view(1)])
            waste = torch.cat([waste, (rest.max() * len(rest) - rest.sum()).view(1)])
        if len(real) == 0:
            return 0.0, 0.0, torch.zeros(0, dtype=torch.float64)
        per = group_samples // self.batch_size  # batches per group
        group = torch.arange(len(waste)) // per
        per_group = torch.zeros(int(group[-1]) + 1, dtype=torch.float64).scatter_add_(0, group, waste.double())
        return float(real.sum()), float(waste.sum()), per_group[: len(waste) // per]

    def _padding(self, order: torch.Tensor, group_samples: int) -> float:
        """The padded-token share of the batches cut from ``order``."""
        tokens, wasted, _groups = self._waste(order, group_samples)
        return wasted / (tokens + wasted) if tokens + wasted else 0.0

    def _global_batches(self, generator: torch.Generator) -> list[list[int]]:
        if not self.shuffle:
            order = self._order_by_length(generator).tolist()
        else:
            perm = torch.randperm(len(self.lengths), generator=generator)
            order = self._grouped(perm, self.group_size, self.rank_world()[1]).tolist()
        batches = [order[i : i + self.batch_size] for i in range(0, len(order), self.batch_size)]
        if self.drop_last and batches and len(batches[-1]) < self.batch_size:
            batches.pop()
        return batches

    def extra_repr(self) -> str:
        return f"batch_size={self.batch_size}, group_batches={self.group_batches!r}, {super().extra_repr()}"


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
        lo = 0
        hi = len(order) - 1
        while lo <= hi:  # the longest document left, then the shortest ones while they fit
            current = [order[hi]]
            used = sizes[order[hi]]
            hi -= 1
            while lo <= hi and used + sizes[order[lo]] <= budget:
                current.append(order[lo])
                used += sizes[order[lo]]
                lo += 1
            batches.append(current)
        return batches

    def extra_repr(self) -> str:
        return f"block_size={self.block_size}, rows={self.rows}, {super().extra_repr()}"
