"""Data on the device: whole-batch loading, batched augmentation and exact dataset statistics (mission tips 6, 8).

- :class:`DeviceDataLoader`: the dataset as tensors on the training device, whole batches sliced per step, seeded
  shuffling, DDP sharding, usable as the return value of ``train_dataloader()``.
- :func:`to_tensors`: decode a map-style dataset once into tensors.
- :class:`BatchAugment`: per-sample random crop/flip + normalisation computed for the whole batch.
- :func:`compute_mean_std`: exact per-channel mean/std for ``v2.Normalize``.
"""

from lightning_speedups._registry import TechniqueInfo, register_technique
from lightning_speedups.data.augment import BatchAugment, crop_flip
from lightning_speedups.data.convert import to_tensors
from lightning_speedups.data.loader import DeviceDataLoader, resolve_device
from lightning_speedups.data.stats import MeanStd, compute_mean_std

__all__ = [
    "BatchAugment",
    "DeviceDataLoader",
    "MeanStd",
    "compute_mean_std",
    "crop_flip",
    "resolve_device",
    "to_tensors",
]

register_technique(
    TechniqueInfo(
        name="device_data",
        callback=None,
        functional=DeviceDataLoader,
        summary="Keep the dataset on the device, slice whole batches and augment them there (no per-sample loader).",
        mission_tip="6, 8",
        bench="lightning_speedups.benchmarks.data:run",
    )
)
