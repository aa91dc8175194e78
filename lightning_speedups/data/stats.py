"""Exact per-channel mean and standard deviation of a whole dataset, in one streaming float64 pass."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple

import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, IterableDataset, TensorDataset

from lightning_speedups._errors import SpeedupConfigError, check_choice, check_int
from lightning_speedups.data.convert import _collate
from lightning_speedups.data.loader import DeviceDataLoader

__all__ = ["MeanStd", "compute_mean_std"]


class MeanStd(NamedTuple):
    """Per-channel ``mean`` and ``std``; ``v2.Normalize(*stats)`` or ``stats.normalize()`` standardises with them."""

    mean: tuple[float, ...]
    std: tuple[float, ...]

    def normalize(self) -> Any:
        """A ``torchvision.transforms.v2.Normalize`` with these values (apply it after ``v2.ToDtype(scale=True)``)."""
        from torchvision.transforms import v2

        return v2.Normalize(list(self.mean), list(self.std))


def _input_batches(data: Any, batch_size: int, num_workers: int) -> Iterator[Tensor]:
    """Yield the input tensor (first field) of successive batches of ``data``, each of shape ``(B, C, ...)``."""
    if isinstance(data, Tensor):
        for start in range(0, data.shape[0], batch_size):
            yield data[start : start + batch_size]
        return
    if isinstance(data, DeviceDataLoader):  # its full tensors, not this rank's (possibly padded) shard
        yield from _input_batches(data.tensors[data.transform_index], batch_size, num_workers)
        return
    if type(data) is TensorDataset:
        yield from _input_batches(data.tensors[0], batch_size, num_workers)
        return
    if isinstance(data, Dataset) and not isinstance(data, IterableDataset) and hasattr(data, "__len__"):
        loader = DataLoader(data, batch_size=batch_size, num_workers=num_workers, collate_fn=_collate)
        for batch in loader:
            yield batch[0]
        return
    if isinstance(data, Iterable):  # a DataLoader or any iterable of batches
        for batch in data:
            if isinstance(batch, (tuple, list)):
                batch = batch[0]
            elif isinstance(batch, dict):
                raise SpeedupConfigError(
                    "compute_mean_std got dict batches. Allowed values: tensor batches or (images, ...) tuples."
                    " HINT: pass the image tensor or a loader of (images, ...) tuples."
                )
            if not isinstance(batch, Tensor):
                raise SpeedupConfigError(
                    f"compute_mean_std needs tensor batches, got {type(batch).__name__}. Allowed values: tensor "
                    "batches or (images, ...) tuples."
                )
            yield batch
        return
    raise SpeedupConfigError(
        f"`dataset_or_loader`={type(data).__name__} is not supported. Allowed values: a tensor (N, C, ...), a map-style"
        " dataset, a DataLoader / DeviceDataLoader or any iterable of (images, ...) batches."
    )


def compute_mean_std(
    dataset_or_loader: Any,
    correction: int = 1,
    scale: bool = True,
    batch_size: int = 1024,
    num_workers: int = 0,
) -> MeanStd:
    """Exact per-channel mean and standard deviation over every pixel of every sample, in one streaming pass.

    Each batch contributes its own float64 mean and sum of squared deviations, merged with Chan et al.'s parallel
    update, so the result equals ``x.mean(dim)`` and ``x.std(dim, correction=correction)`` of the whole set stacked in
    float64 (to ~1e-12), without holding the set in memory and without the cancellation of a sum-of-squares formula.

    ``correction=1`` (default) is torch's unbiased ``std`` (divides by ``n - 1``, ``n`` = pixels per channel);
    ``correction=0`` is the population std. With ``n`` in the millions they differ by ~``1 / (2 n)`` relatively.

    Args:
        dataset_or_loader: a tensor ``(N, C, ...)``, a map-style dataset of ``image`` or ``(image, ...)`` samples
            (``(C, ...)`` tensors, arrays or PIL images), a ``DataLoader`` / :class:`DeviceDataLoader` / any iterable of
            ``(images, ...)`` batches. The channel dimension is dimension 1 of a batch.
        correction: 1 for the unbiased std, 0 for the population std.
        scale: divide integer images by their dtype's maximum (uint8: 255), as ``v2.ToDtype(torch.float32,
            scale=True)`` does, so the values feed ``v2.Normalize`` after it; floats are never rescaled.
        batch_size: samples per step when reading a tensor or a dataset.
        num_workers: decoding workers when reading a dataset.

    Returns:
        :class:`MeanStd` ``(mean, std)``, tuples of floats, one per channel.

    Raises:
        SpeedupConfigError: an empty dataset, batches without a channel dimension or with different channel counts,
            too few values for ``correction``, or an unsupported input.

    Example::

        >>> x = torch.rand(64, 3, 8, 8)
        >>> stats = compute_mean_std(x)
        >>> torch.allclose(torch.tensor(stats.std), x.transpose(0, 1).reshape(3, -1).double().std(1).float())
        True
    """
    check_choice("correction", correction, (0, 1))
    check_int("batch_size", batch_size, 1)
    count = 0
    mean: Tensor | None = None
    m2: Tensor | None = None
    for batch in _input_batches(dataset_or_loader, batch_size, num_workers):
        if batch.ndim < 2:
            raise SpeedupConfigError(
                f"compute_mean_std needs batches of shape (B, C, ...), got {tuple(batch.shape)}. Allowed values:"
                " batches with a channel dimension. HINT: grayscale (B, H, W) batches need one: images.unsqueeze(1)."
            )
        if batch.shape[0] == 0:
            continue
        c = batch.shape[1]
        x = batch.transpose(0, 1).reshape(c, -1).to(torch.float64)
        if scale and not batch.dtype.is_floating_point and batch.dtype != torch.bool:
            x = x / torch.iinfo(batch.dtype).max
        n_b = x.shape[1]
        mean_b = x.mean(dim=1)
        m2_b = (x - mean_b[:, None]).square().sum(dim=1)
        if mean is None or m2 is None:
            mean = mean_b
            m2 = m2_b
            count = n_b
            continue
        if mean.shape[0] != c:
            raise SpeedupConfigError(
                f"compute_mean_std found batches with {mean.shape[0]} and {c} channels. Allowed values: batches with "
                "one channel count."
            )
        mean_b = mean_b.to(mean.device)
        m2_b = m2_b.to(mean.device)
        delta = mean_b - mean
        total = count + n_b
        mean = mean + delta * (n_b / total)
        m2 = m2 + m2_b + delta.square() * (count * n_b / total)
        count = total
    if mean is None or m2 is None or count == 0:
        raise SpeedupConfigError(
            "`dataset_or_loader` is empty: there is nothing to compute the mean and std of. Allowed values: data "
            "with at least one sample."
        )
    if count - correction <= 0:
        raise SpeedupConfigError(
            f"compute_mean_std got {count} value(s) per channel;"
            f" `correction`={correction} needs more than {correction}. Allowed values: correction=0, or more data."
        )
    std = (m2 / (count - correction)).sqrt()
    return MeanStd(tuple(mean.cpu().tolist()), tuple(std.cpu().tolist()))
