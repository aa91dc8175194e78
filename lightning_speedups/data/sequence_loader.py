"""A training loader over token sequences: a ``DataLoader`` with one of the sequence batch samplers, wrapped.

Lightning injects a ``DistributedSampler`` into every ``DataLoader`` under DDP by re-building it around a new sampler,
which a length-aware batch sampler cannot take. :class:`SequenceLoader` is not a ``DataLoader`` (as
:class:`~lightning_speedups.data.DeviceDataLoader` is not), so Lightning leaves it alone; its batch sampler shards
itself over the ranks and exposes ``sampler.set_epoch``, which Lightning's fit loop calls at every epoch start.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from torch.utils.data import DataLoader

from lightning_speedups.data._sampler_base import SequenceBatchSampler

__all__ = ["SequenceLoader"]


class SequenceLoader:
    """Iterate ``dataset`` in the batches of ``batch_sampler``, collated by ``collate_fn``.

    Args:
        dataset: a map-style dataset of token samples.
        batch_sampler: a :class:`~lightning_speedups.data.LengthGroupedSampler`,
            :class:`~lightning_speedups.data.TokenBudgetBatchSampler` or
            :class:`~lightning_speedups.data.PackedBatchSampler`.
        collate_fn: e.g. :func:`~lightning_speedups.data.pad_collate` or :func:`~lightning_speedups.data.pack_collate`.
        **loader_kwargs: passed to the inner ``DataLoader`` (``num_workers``, ``pin_memory``, ...).

    Example::

        >>> import torch
        >>> from lightning_speedups.data import LengthGroupedSampler, pad_collate
        >>> data = [torch.arange(1, n + 1) for n in (3, 1, 2, 5)]
        >>> loader = SequenceLoader(data, LengthGroupedSampler([3, 1, 2, 5], 2, shuffle=False), pad_collate(0, 1))
        >>> [tuple(b["input_ids"].shape) for b in loader]
        [(2, 2), (2, 5)]
    """

    def __init__(
        self,
        dataset: Any,
        batch_sampler: SequenceBatchSampler,
        collate_fn: Callable[[list[Any]], Any],
        **loader_kwargs: Any,
    ) -> None:
        self.dataset = dataset
        self.batch_sampler = batch_sampler
        self.collate_fn = collate_fn
        self.loader_kwargs = dict(loader_kwargs)
        self._loader = DataLoader(dataset, batch_sampler=batch_sampler, collate_fn=collate_fn, **loader_kwargs)

    @property
    def sampler(self) -> Any:
        """What Lightning calls ``set_epoch`` on at every epoch start."""
        return self.batch_sampler.sampler

    @property
    def num_workers(self) -> int:
        return self._loader.num_workers

    def set_epoch(self, epoch: int) -> None:
        self.batch_sampler.set_epoch(epoch)

    def __len__(self) -> int:
        return len(self.batch_sampler)

    def __iter__(self) -> Iterator[Any]:
        return iter(self._loader)

    def __repr__(self) -> str:
        return f"SequenceLoader({self.batch_sampler!r}, collate_fn={self.collate_fn!r})"
