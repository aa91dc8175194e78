"""What the sequence batch samplers share: length checks, seeding, DDP sharding, epochs and the resume state."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch.utils.data import Sampler

from lightning_speedups._errors import SpeedupConfigError, check_bool, check_int
from lightning_speedups.data.loader import EpochSetter, dist_rank_world

__all__ = ["SequenceBatchSampler", "check_lengths", "pad_fraction"]


def check_lengths(lengths: Sequence[int] | torch.Tensor) -> torch.Tensor:
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
    lens = check_lengths(lengths)
    check_int("multiple_of", multiple_of, 1)
    real = padded = 0
    for batch in batches:
        sizes = lens[list(batch)]
        longest = math.ceil(int(sizes.max()) / multiple_of) * multiple_of
        real += int(sizes.sum())
        padded += longest * len(batch)
    return 1.0 - real / padded if padded else 0.0


class SequenceBatchSampler(Sampler[list[int]]):
    """Seeding, DDP sharding, epochs and resume state shared by the sequence batch samplers.

    A subclass implements ``_global_batches``: the epoch's batches for all ranks, in an order where neighbours
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
        self.lengths = check_lengths(lengths)
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
        self._rank = rank
        self._world = world_size
        self.epoch = 0
        self.sampler = EpochSetter(self)  # Lightning calls batch_sampler.sampler.set_epoch(epoch)
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
        return dist_rank_world()

    def set_epoch(self, epoch: int) -> None:
        """Use epoch ``epoch``'s order at the next iteration (Lightning calls this at every epoch start)."""
        if check_int("epoch", epoch, 0) != self.epoch:
            self._consumed = 0  # a new epoch has consumed nothing yet: state_dict() must not carry the old count
        self.epoch = epoch

    def _generator(self, salt: int, epoch: int | None = None) -> torch.Generator:
        """The seeded generator of ``epoch`` (default: the current one); ``salt`` tells its uses apart."""
        gen = torch.Generator()
        gen.manual_seed(self.seed * 1_000_003 + (self.epoch if epoch is None else epoch) * 7919 + salt)
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
