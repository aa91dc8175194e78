"""Keep a whole (small or medium) dataset as tensors on one device and serve whole-batch slices from it.

The per-sample ``DataLoader`` path (``__getitem__`` + transforms + ``collate`` per sample, then a host-to-device copy)
is often the bottleneck for datasets that fit in memory. The CIFAR-10 speed records (airbench) instead keep the data
on the GPU and index whole batches at once; :class:`DeviceDataLoader` does that and behaves like a ``DataLoader`` for
Lightning (``len``, ``set_epoch``, DDP sharding).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import Tensor

from lightning_speedups._errors import SpeedupConfigError, check_callable, check_int

__all__ = ["DeviceDataLoader", "EpochSetter", "dist_rank_world", "resolve_device"]

DeviceLike = torch.device | str | int | Any

_DEVICE_ALLOWED = "None, a torch.device, str or int, a LightningModule, a LightningDataModule or a Trainer"


def resolve_device(device: DeviceLike) -> torch.device | None:
    """Turn ``device`` into a ``torch.device``; Lightning objects are read now (call it as late as possible).

    Args:
        device: ``None`` (returns ``None``), a ``torch.device``/``str``/``int``, a ``LightningModule`` (its
            ``.device``), a ``Trainer`` (``strategy.root_device``) or a ``LightningDataModule`` (its trainer's root
            device).

    Returns:
        The device, or ``None`` when ``device`` is ``None``.

    Raises:
        SpeedupConfigError: for anything else, or a DataModule not attached to a trainer.
    """
    if device is None or isinstance(device, torch.device):
        return device
    if isinstance(device, (str, int)):
        try:
            return torch.device(device)
        except (RuntimeError, TypeError) as err:
            raise SpeedupConfigError(
                f"`device`={device!r} is not a valid torch device. Allowed values: {_DEVICE_ALLOWED}."
            ) from err
    import lightning.pytorch as pl

    if isinstance(device, pl.LightningModule):
        return device.device
    if isinstance(device, pl.Trainer):
        return device.strategy.root_device
    if isinstance(device, pl.LightningDataModule):
        if device.trainer is None:
            raise SpeedupConfigError(
                "`device` is a LightningDataModule that is not attached to a Trainer yet. Allowed values: a"
                " datamodule attached to a Trainer, or a torch.device. HINT: build the loader inside"
                " `train_dataloader()`, or pass `device=self.trainer.strategy.root_device`."
            )
        return device.trainer.strategy.root_device
    raise SpeedupConfigError(f"`device`={device!r} is not supported. Allowed values: {_DEVICE_ALLOWED}.")


def dist_rank_world() -> tuple[int, int]:
    """``(rank, world_size)`` from torch.distributed when it is initialised, else ``(0, 1)``."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


class EpochSetter:
    """What Lightning finds as ``loader.sampler`` (or ``batch_sampler.sampler``): it calls ``set_epoch`` at the start
    of every epoch, which this passes on to the loader or sampler that owns it."""

    def __init__(self, loader: Any) -> None:
        self._loader = loader

    def set_epoch(self, epoch: int) -> None:
        self._loader.set_epoch(epoch)


class DeviceDataLoader:
    """Iterate over tensors that live on one device, slicing whole batches (no per-sample ``collate``).

    Each epoch draws one seeded permutation (the same on every rank), splits it into ``world_size`` disjoint shards
    (rank ``r`` takes positions ``r, r + world_size, ...``) and yields batches of that rank's shard as tuples of
    tensors, with ``transform`` applied to the inputs (tensor ``transform_index``) of each batch.

    Under DDP every rank must run the same number of steps, so shards have equal length: with ``drop_last=False``
    the permutation is padded by wrapping around (a few samples appear twice per epoch when ``len(dataset)`` is not
    divisible by ``world_size``, exactly like ``DistributedSampler``); with ``drop_last=True`` the tail is dropped
    instead, and so is the last incomplete batch.

    Lightning only injects a ``DistributedSampler`` into real ``DataLoader``s; this loader shards itself, reading
    rank and world size from ``torch.distributed`` when it is initialised (or from ``rank``/``world_size``). It
    exposes ``sampler.set_epoch`` so Lightning's fit loop sets the epoch; outside Lightning, every new iteration
    moves on to the next epoch unless you call :meth:`set_epoch`.

    Args:
        *tensors: tensors with the same first dimension (e.g. images and labels), or one tuple of them (e.g. the
            output of :func:`to_tensors`).
        batch_size: samples per batch (per rank).
        shuffle: draw a new permutation each epoch.
        drop_last: drop the shard's last incomplete batch (and the remainder that does not split over the ranks).
        seed: seeds the permutations; epoch ``e`` uses a generator seeded from ``(seed, e)``, on the CPU, so the order
            does not depend on the device.
        device: where the tensors should live. ``None`` keeps them where they are (Lightning then moves each batch);
            a ``torch.device``/``str``; or a ``LightningModule``/``LightningDataModule``/``Trainer`` whose training
            device is read lazily at the first iteration (pass ``device=self`` inside ``train_dataloader()``). The
            tensors are moved once, not per batch.
        transform: optional callable applied to each batch's inputs on the device (e.g. :class:`BatchAugment`).
        transform_index: which tensor ``transform`` is applied to.
        rank, world_size: explicit sharding (both or neither); default: from ``torch.distributed``, else ``0, 1``.

    Raises:
        SpeedupConfigError: no tensors, tensors of different lengths, ``batch_size`` <= 0, a batch larger than a shard
            with ``drop_last=True``, a bad rank/world size, or a transform that rejects the inputs' shape.

    Example::

        >>> x, y = torch.randn(10, 3, 8, 8), torch.arange(10)
        >>> loader = DeviceDataLoader(x, y, batch_size=4, seed=0)
        >>> len(loader), [tuple(b[0].shape) for b in loader]
        (3, [(4, 3, 8, 8), (4, 3, 8, 8), (2, 3, 8, 8)])
    """

    def __init__(
        self,
        *tensors: Tensor,
        batch_size: int = 256,
        shuffle: bool = True,
        drop_last: bool = False,
        seed: int = 0,
        device: DeviceLike = None,
        transform: Callable[[Tensor], Tensor] | None = None,
        transform_index: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
    ) -> None:
        if not tensors:
            raise SpeedupConfigError(
                "`tensors` is empty. Allowed values: one or more tensors. HINT: pass the data: "
                "`DeviceDataLoader(images, labels)`."
            )
        if len(tensors) == 1 and isinstance(tensors[0], (tuple, list)):
            tensors = tuple(tensors[0])
        if not all(isinstance(t, Tensor) for t in tensors):
            kinds = [type(t).__name__ for t in tensors]
            raise SpeedupConfigError(
                f"`tensors` must all be torch.Tensor, got {kinds}. Allowed values: torch.Tensor. HINT: decode a "
                "dataset first with `to_tensors()`."
            )
        lengths = [t.shape[0] if t.ndim > 0 else None for t in tensors]
        if None in lengths or len(set(lengths)) != 1:
            raise SpeedupConfigError(
                f"`tensors` must have the same length (first dimension), got lengths {lengths}. Allowed values: "
                "tensors with equal first dimensions."
            )
        check_int("batch_size", batch_size, 1)
        check_int("transform_index", transform_index, -len(tensors), len(tensors) - 1)
        check_callable("transform", transform, "a callable(batch) -> batch", optional=True)
        if (rank is None) != (world_size is None):
            raise SpeedupConfigError(
                f"`rank`={rank!r} and `world_size`={world_size!r} must be given together. Allowed values: both, or"
                " neither (to read them from torch.distributed)."
            )
        self.tensors: tuple[Tensor, ...] = tuple(tensors)
        self.num_samples = int(lengths[0])  # type: ignore[arg-type]
        if self.num_samples == 0:
            raise SpeedupConfigError(
                "`tensors` are empty (length 0): there is nothing to load. Allowed values: tensors with samples."
            )
        self.batch_size = batch_size
        self.shuffle = bool(shuffle)
        self.drop_last = bool(drop_last)
        self.seed = int(seed)
        self.transform = transform
        self.transform_index = transform_index
        self._device_spec = device
        self._rank = rank
        self._world_size = world_size
        self._epoch = 0
        self.sampler = EpochSetter(self)  # Lightning's `_set_sampler_epoch` looks for `loader.sampler.set_epoch`
        self.batch_sampler = None  # read by Lightning's `_is_dataloader_shuffled` next to `sampler`
        self._check_shard(*self._rank_world())  # again at len()/iter(), once a DDP world size is known
        check = getattr(transform, "check_input", None)
        if callable(check):
            check(self.tensors[transform_index])
        if isinstance(device, (torch.device, str, int)) and not isinstance(device, bool):
            self._move(resolve_device(device))  # Lightning objects are resolved lazily, at the first iteration

    # ------------------------------------------------------------------ sharding
    def _rank_world(self) -> tuple[int, int]:
        if self._world_size is not None:
            rank = self._rank
            world = self._world_size
            if not isinstance(world, int) or world < 1 or not isinstance(rank, int) or not 0 <= rank < world:
                raise SpeedupConfigError(
                    f"`rank`={rank!r}, `world_size`={world!r} are invalid. Allowed values: integers with"
                    " 0 <= rank < world_size."
                )
            return rank, world
        return dist_rank_world()

    def _shard_size(self, world: int) -> int:
        return self.num_samples // world if self.drop_last else math.ceil(self.num_samples / world)

    def _check_shard(self, rank: int, world: int) -> None:
        shard = self._shard_size(world)
        if self.drop_last and self.batch_size > shard:
            raise SpeedupConfigError(
                f"`batch_size`={self.batch_size} is larger than the {shard} samples of each of the {world} shard(s)"
                f" with `drop_last=True`, so there would be no batch at all. Allowed values: a batch_size <= {shard},"
                " or drop_last=False."
            )
        if shard == 0:
            raise SpeedupConfigError(
                f"{self.num_samples} samples cannot be sharded over `world_size`={world} with `drop_last=True`. "
                f"Allowed values: a world_size <= {self.num_samples}, or drop_last=False."
            )

    @property
    def rank(self) -> int:
        """This process's shard index (resolved now)."""
        return self._rank_world()[0]

    @property
    def world_size(self) -> int:
        """Number of shards (resolved now)."""
        return self._rank_world()[1]

    @property
    def epoch(self) -> int:
        """The epoch whose order the next iteration uses."""
        return self._epoch

    def set_epoch(self, epoch: int) -> None:
        """Use the order of ``epoch`` for the next iteration (Lightning calls it at the start of each epoch)."""
        self._epoch = int(epoch)

    def shard_indices(self, epoch: int | None = None) -> Tensor:
        """The sample indices this rank visits in ``epoch`` (default: the next epoch), in order, on the CPU."""
        rank, world = self._rank_world()
        self._check_shard(rank, world)
        epoch = self._epoch if epoch is None else int(epoch)
        n = self.num_samples
        if self.shuffle:
            g = torch.Generator().manual_seed((self.seed * 0x9E3779B1 + epoch) % (2**63))
            order = torch.randperm(n, generator=g)
        else:
            order = torch.arange(n)
        total = self._shard_size(world) * world
        if total > n:  # pad by wrapping around so every rank gets the same number of samples
            order = torch.cat([order, order.repeat(math.ceil((total - n) / n))[: total - n]])
        return order[:total][rank::world]

    # ------------------------------------------------------------------ device
    @property
    def device(self) -> torch.device:
        """Where the tensors are now."""
        return self.tensors[0].device

    def _move(self, device: torch.device | None) -> None:
        if device is not None and any(t.device != device for t in self.tensors):
            self.tensors = tuple(t.to(device) for t in self.tensors)

    def to(self, device: DeviceLike) -> DeviceDataLoader:
        """Move the tensors to ``device`` once (in place) and return ``self``."""
        self._device_spec = device
        self._move(resolve_device(device))
        return self

    # ------------------------------------------------------------------ iteration
    def __len__(self) -> int:
        rank, world = self._rank_world()
        self._check_shard(rank, world)  # Lightning asks for len() before the first step: fail there, not mid-epoch
        shard = self._shard_size(world)
        return shard // self.batch_size if self.drop_last else math.ceil(shard / self.batch_size)

    def __iter__(self) -> Iterator[tuple[Tensor, ...]]:
        # a generator: Lightning calls `iter()` once just to check iterability, which must not consume an epoch
        self._move(resolve_device(self._device_spec))
        idx = self.shard_indices()
        self._epoch += 1
        tensors = self.tensors
        contiguous = not self.shuffle and self.world_size == 1
        idx = idx.to(tensors[0].device)
        steps = len(self)
        for b in range(steps):
            start = b * self.batch_size
            if contiguous:  # no shuffle, one shard: batches are views, no copy at all
                batch = [t[start : start + self.batch_size] for t in tensors]
            else:
                sel = idx[start : start + self.batch_size]
                batch = [t.index_select(0, sel) for t in tensors]
            if self.transform is not None:
                batch[self.transform_index] = self.transform(batch[self.transform_index])
            yield tuple(batch)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(num_samples={self.num_samples}, batch_size={self.batch_size},"
            f" shuffle={self.shuffle}, drop_last={self.drop_last}, seed={self.seed}, device={self.device},"
            f" transform={self.transform!r})"
        )
