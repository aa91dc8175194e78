"""Data on the device: whole-batch loading, batched augmentation and exact dataset statistics (ways 6, 8).

- :class:`DeviceDataLoader`: the dataset as tensors on the training device, whole batches sliced per step, seeded
  shuffling, DDP sharding, usable as the return value of ``train_dataloader()``.
- :func:`to_tensors`: decode a map-style dataset once into tensors.
- :class:`BatchAugment`: per-sample random crop/flip + normalisation computed for the whole batch.
- :func:`compute_mean_std`: exact per-channel mean/std for ``v2.Normalize``.

For token sequences (ways 6, 7):

- :class:`LengthGroupedSampler`, :class:`TokenBudgetBatchSampler`, :class:`PackedBatchSampler`: batch samplers that
  group similar lengths (resumable mid-epoch, DDP-aware).
- :func:`pad_collate`: pad each batch to its own longest sample, with an ``attention_mask``.
- :func:`pack_sequences`, :func:`pack_collate`, :func:`packed_attention_mask`: documents packed into full rows,
  kept apart by ``position_ids`` that restart at every document.
"""

from lightning_speedups._registry import TechniqueInfo, register_technique
from lightning_speedups.data.augment import BatchAugment, crop_flip
from lightning_speedups.data.convert import to_tensors
from lightning_speedups.data.loader import DeviceDataLoader, resolve_device
from lightning_speedups.data.padding import (
    IGNORE_INDEX,
    PackCollate,
    PadCollate,
    SequenceLengths,
    pack_collate,
    pack_sequences,
    packed_attention_mask,
    pad_collate,
    sequence_lengths,
    token_tensor,
)
from lightning_speedups.data.samplers import (
    LengthGroupedSampler,
    PackedBatchSampler,
    TokenBudgetBatchSampler,
    pad_fraction,
)
from lightning_speedups.data.sequence_loader import SequenceLoader
from lightning_speedups.data.stats import MeanStd, compute_mean_std

__all__ = [
    "IGNORE_INDEX",
    "BatchAugment",
    "DeviceDataLoader",
    "LengthGroupedSampler",
    "MeanStd",
    "PackCollate",
    "PackedBatchSampler",
    "PadCollate",
    "SequenceLengths",
    "SequenceLoader",
    "TokenBudgetBatchSampler",
    "compute_mean_std",
    "crop_flip",
    "pack_collate",
    "pack_sequences",
    "packed_attention_mask",
    "pad_collate",
    "pad_fraction",
    "resolve_device",
    "sequence_lengths",
    "to_tensors",
    "token_tensor",
]

register_technique(
    TechniqueInfo(
        name="device_data",
        callback=None,
        functional=DeviceDataLoader,
        summary="Keep the dataset on the device, slice whole batches and augment them there (no per-sample loader).",
        ways=(6, 8),
        bench="lightning_speedups.benchmarks.data:run",
    )
)
