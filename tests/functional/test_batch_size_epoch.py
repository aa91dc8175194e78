"""The batch-size search ranks sizes by the cost of a whole epoch: without ``drop_last`` an epoch ends with a partial
batch whose per-sample cost is higher (on 1438 digits, batch 1024 is a step of 1024 and one of 414)."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from lightning_speedups.callbacks.batch_size.loaders import epoch_samples
from lightning_speedups.functional.batch_size import (
    BatchSizeSearchConfig,
    BatchSizeTrial,
    batch_size_ladder,
    search_batch_size,
)
from lightning_speedups.functional.batch_size.curve import epoch_factor, interpolate_per_sample

N = 1438


def _per_sample(b: float) -> float:  # a fixed cost per step plus a cost per sample
    return 0.1 / b + 0.001


def test_interpolation_is_exact_for_fixed_plus_per_sample_cost():
    measured = {b: _per_sample(b) for b in (16, 64, 256)}
    for b in (24, 32, 100, 200):
        assert interpolate_per_sample(measured, b) == pytest.approx(_per_sample(b))
    assert interpolate_per_sample(measured, 8) == pytest.approx(_per_sample(8))  # extrapolated below the smallest
    assert interpolate_per_sample(measured, 1024) == measured[256]  # above the largest: the largest's
    assert interpolate_per_sample({}, 32) != interpolate_per_sample({}, 32)  # nan without measurements


def test_epoch_factor_prices_the_partial_last_batch():
    expected = (1024 * _per_sample(1024) + 414 * _per_sample(414)) / (N * _per_sample(1024))
    assert epoch_factor(N, 1024, _per_sample) == pytest.approx(expected) and expected > 1.03
    assert epoch_factor(N, N, _per_sample) == 1.0  # one full batch per epoch
    assert epoch_factor(1024, 256, _per_sample) == 1.0  # divisible: no partial batch
    assert epoch_factor(None, 1024, _per_sample) == 1.0  # unknown length (or drop_last)


def _measure(b: int) -> BatchSizeTrial:
    step = _per_sample(b) * b  # noise-free: three identical steps
    return BatchSizeTrial(b, b / step, 0, "ok", [step] * 3, 3 * step)


def test_search_counts_the_partial_batch_only_when_the_epoch_keeps_it():
    cfg = BatchSizeSearchConfig(init_val=16, max_val=4096)
    ladder = batch_size_ladder(16, N)
    # full batches: 1438 is only 2.6% faster than 1024, so the smaller size is kept (within min_gain)
    assert search_batch_size(_measure, cfg, ladder).chosen == 1024
    # a whole epoch: 1024 pays a 414-sample step, 6.5% slower than one step of 1438
    result = search_batch_size(_measure, cfg, ladder, epoch_samples=N)
    assert result.chosen == N
    assert f"ranked by the cost of a whole {N}-sample epoch" in result.note and "1024: 414 samples" in result.note


def test_epoch_samples_follows_drop_last():
    data = TensorDataset(torch.zeros(10, 1))
    assert epoch_samples(None, DataLoader(data, batch_size=4), 10) == 10
    assert epoch_samples(None, DataLoader(data, batch_size=4, drop_last=True), 10) is None
    assert epoch_samples(None, DataLoader(data, batch_size=4), None) is None
