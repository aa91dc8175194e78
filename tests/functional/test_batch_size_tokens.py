"""The batch-size search on token sequences: trials carry real tokens, the search ranks tokens/s and says so."""

from __future__ import annotations

import pytest

from lightning_speedups.functional.batch_size import (
    BatchSizeSearchConfig,
    BatchSizeSearchResult,
    BatchSizeTrial,
    batch_size_ladder,
    search_batch_size,
)
from lightning_speedups.functional.batch_size.records import per_sample_time, unit_step_times


def test_trial_unit_and_rate():
    plain = BatchSizeTrial(32, samples_per_s=100.0)
    assert plain.unit == "samples" and plain.rate == 100.0
    tokens = BatchSizeTrial(32, samples_per_s=100.0, tokens_per_s=5000.0, step_times=[0.5], step_tokens=[2500])
    assert tokens.unit == "tokens" and tokens.rate == 5000.0
    assert unit_step_times(tokens) == [0.5 / 2500] and per_sample_time(tokens) == pytest.approx(1 / 5000)
    assert unit_step_times(plain) == [] and per_sample_time(BatchSizeTrial(4, step_times=[0.4])) == 0.1


def test_result_says_the_unit_and_round_trips():
    trials = [BatchSizeTrial(b, samples_per_s=10.0 * b, tokens_per_s=300.0 * b, step_tokens=[30 * b]) for b in (8, 16)]
    result = BatchSizeSearchResult(chosen=16, mode="throughput", trials=trials, stop_reason="max_val")
    assert result.unit == "tokens"
    table = result.table()
    assert "tokens/s" in table.splitlines()[0] and "samples/s" not in table.splitlines()[0]
    assert "4800.0" in table  # the rate column holds tokens/s
    assert "measured in real (non-pad) tokens/s" in table
    back = BatchSizeSearchResult.from_dict(result.as_dict())
    assert back.unit == "tokens" and back.trials[1].step_tokens == [480]
    samples = BatchSizeSearchResult(chosen=8, mode="throughput", trials=[BatchSizeTrial(8, 80.0)], stop_reason="x")
    assert samples.unit == "samples" and "samples/s" in samples.table() and "tokens" not in samples.table()


def test_search_ranks_tokens_not_samples():
    # samples/s keeps rising, but a larger batch pads to longer samples: real tokens/s peaks at 32
    tokens_per_s = {8: 1000.0, 16: 1800.0, 32: 3000.0, 64: 2000.0, 128: 1500.0}

    def measure(b: int) -> BatchSizeTrial:
        return BatchSizeTrial(b, samples_per_s=10.0 * b, tokens_per_s=tokens_per_s[b], step_tokens=[1])

    cfg = BatchSizeSearchConfig(init_val=8, max_val=128, patience=2)
    result = search_batch_size(measure, cfg, batch_size_ladder(8, 128))
    assert result.chosen == 32 and result.unit == "tokens"
    samples_only = search_batch_size(
        lambda b: BatchSizeTrial(b, samples_per_s=10.0 * b), cfg, batch_size_ladder(8, 128)
    )
    assert samples_only.chosen == 128 and samples_only.unit == "samples"


def test_guarded_search_times_per_token():
    # step times with per-step token counts: per-token cost falls to 32 then rises (the batches pad more)
    per_token = {8: 4e-4, 16: 2e-4, 32: 1e-4, 64: 1.5e-4, 128: 2e-4}
    tokens = 40  # real tokens per sample

    def measure(b: int) -> BatchSizeTrial:
        n = [tokens * b] * 3
        times = [per_token[b] * x for x in n]
        return BatchSizeTrial(
            b,
            samples_per_s=b / times[0],
            step_times=times,
            tokens_per_s=n[0] / times[0],
            step_tokens=n,
            elapsed_s=sum(times),
        )

    cfg = BatchSizeSearchConfig(init_val=8, max_val=128, patience=1, confirm_rounds=2)
    result = search_batch_size(measure, cfg, batch_size_ladder(8, 128))
    assert result.chosen == 32 and result.unit == "tokens"
