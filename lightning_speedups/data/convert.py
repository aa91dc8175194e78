"""Decode a map-style dataset once into tensors, so training can index whole batches instead of single samples."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, IterableDataset, TensorDataset

from lightning_speedups._errors import SpeedupConfigError, check_int
from lightning_speedups.data.loader import DeviceLike, resolve_device

__all__ = ["to_tensors"]

_PROGRESS_AUTO_MIN = 10_000  # show a progress bar by default from this many samples on


def _field_to_tensor(value: Any) -> Tensor:
    if isinstance(value, Tensor):
        return value
    if isinstance(value, np.ndarray):
        return torch.from_numpy(value)
    if isinstance(value, (bool, int, float, np.generic)):
        return torch.as_tensor(value)
    if type(value).__module__.startswith("PIL."):
        from torchvision.transforms.v2.functional import pil_to_tensor

        return pil_to_tensor(value)  # uint8 (C, H, W), like v2.PILToTensor
    raise SpeedupConfigError(
        f"to_tensors cannot turn a sample field of type {type(value).__name__} into a tensor. Allowed values:"
        " tensors, numpy arrays, PIL images or numbers (or tuples of them)."
    )


def _collate(samples: list[Any]) -> tuple[Tensor, ...]:
    rows = [tuple(s) if isinstance(s, (tuple, list)) else (s,) for s in samples]
    width = len(rows[0])
    if any(len(r) != width for r in rows):
        raise SpeedupConfigError(
            "to_tensors needs every sample to have the same number of fields. Allowed values: samples with one "
            "field count."
        )
    fields = []
    for i in range(width):
        parts = [_field_to_tensor(r[i]) for r in rows]
        shapes = {tuple(p.shape) for p in parts}
        if len(shapes) != 1:
            raise SpeedupConfigError(
                f"to_tensors found samples of different shapes {sorted(shapes)} in field {i}. Allowed values: one"
                " shape per field. HINT: add deterministic transforms that give one size (e.g. v2.Resize +"
                " v2.CenterCrop)."
            )
        fields.append(torch.stack(parts))
    return tuple(fields)


def _progress(total: int, enabled: bool, desc: str) -> Any:
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="sample", leave=False)


def to_tensors(
    dataset: Dataset | Sequence[Any],
    batch_size: int = 256,
    num_workers: int = 0,
    device: DeviceLike = None,
    progress: bool | None = None,
    desc: str = "to_tensors",
) -> tuple[Tensor, ...]:
    """Decode every sample of a map-style ``dataset`` once and stack each field into one tensor.

    Give it the dataset with only its *deterministic* transforms (decode, resize, ``PILToTensor``): the random
    augmentation then runs per batch on the device (:class:`BatchAugment`). The output is preallocated after the
    first batch, so peak memory is the result plus one batch. Decoding runs through a ``DataLoader`` (``num_workers``
    processes decode in parallel).

    Args:
        dataset: map-style dataset (``__len__`` + ``__getitem__``); samples are a tensor / array / PIL image / number
            or a tuple of them (e.g. ``(image, label)``).
        batch_size: samples decoded per step.
        num_workers: ``DataLoader`` worker processes for decoding.
        device: where to put the result (see :class:`DeviceDataLoader`); ``None`` keeps the CPU.
        progress: show a tqdm progress bar; ``None`` shows it from 10,000 samples on.
        desc: progress bar label.

    Returns:
        One tensor per sample field, e.g. ``(images, labels)``; PIL images become uint8 ``(N, C, H, W)``.

    Raises:
        SpeedupConfigError: an empty or iterable-style dataset, ``batch_size`` <= 0, samples of different shapes or
            of unsupported types.

    Example::

        >>> from lightning_speedups.demo import ShapesDataset
        >>> images, labels = to_tensors(ShapesDataset(n=100))
        >>> tuple(images.shape), labels.dtype
        ((100, 3, 32, 32), torch.int64)
    """
    if isinstance(dataset, IterableDataset) or not hasattr(dataset, "__len__") or not hasattr(dataset, "__getitem__"):
        raise SpeedupConfigError(
            f"`dataset`={type(dataset).__name__} is not a map-style dataset (needs __len__ and __getitem__). Allowed"
            " values: a map-style dataset."
        )
    check_int("batch_size", batch_size, 1)
    n = len(dataset)
    if n == 0:
        raise SpeedupConfigError(
            "`dataset` is empty: there is nothing to decode. Allowed values: a dataset with at least one sample."
        )
    target = resolve_device(device)
    if type(dataset) is TensorDataset:  # already tensors: nothing to decode
        return tuple(t if target is None else t.to(target) for t in dataset.tensors)

    loader: Iterator[tuple[Tensor, ...]] = iter(
        DataLoader(dataset, batch_size=batch_size, shuffle=False, num_workers=num_workers, collate_fn=_collate)  # type: ignore[arg-type]
    )
    bar = _progress(n, n >= _PROGRESS_AUTO_MIN if progress is None else bool(progress), desc)
    out: list[Tensor] = []
    filled = 0
    try:
        for batch in loader:
            if not out:
                out = [torch.empty((n, *f.shape[1:]), dtype=f.dtype) for f in batch]
            if len(batch) != len(out) or any(f.shape[1:] != o.shape[1:] for f, o in zip(batch, out)):
                raise SpeedupConfigError(
                    "to_tensors found samples of different shapes or field counts across batches. Allowed values:"
                    " one shape per field. HINT: add deterministic transforms that give one size (e.g. v2.Resize +"
                    " v2.CenterCrop)."
                )
            k = batch[0].shape[0]
            for f, o in zip(batch, out):
                o[filled : filled + k] = f
            filled += k
            if bar is not None:
                bar.update(k)
    finally:
        if bar is not None:
            bar.close()
    return tuple(o if target is None else o.to(target) for o in out)
