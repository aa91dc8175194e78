"""Batch-size search policy, memory meter and state snapshot (``find_batch_size`` is in tests/test_tuner.py)."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from lightning_speedups._errors import SpeedupConfigError
from lightning_speedups.demo import DemoClassifier
from lightning_speedups.functional.batch_size import (
    BatchSizeSearchConfig,
    BatchSizeSearchResult,
    BatchSizeTrial,
    MemoryMeter,
    NoBatchSizeFits,
    batch_size_ladder,
    scale_lr_factor,
    search_batch_size,
    snapshot_training_state,
)


def fake(sps: dict[int, float] | None = None, oom_from: int | None = None, mem_per_sample: int = 0):
    """A measure() stub: samples/s saturating at 64 unless given, OOM at and above ``oom_from``."""
    calls: list[int] = []

    def measure(b: int) -> BatchSizeTrial:
        calls.append(b)
        if oom_from is not None and b >= oom_from:
            return BatchSizeTrial(b, status="oom")
        rate = sps[b] if sps else float(min(b, 64) * 10)
        return BatchSizeTrial(b, samples_per_s=rate, peak_memory=1000 + mem_per_sample * b)

    measure.calls = calls  # type: ignore[attr-defined]
    return measure


def test_batch_size_config_misconfiguration():
    with pytest.raises(SpeedupConfigError, match="`init_val`=64 is larger than `max_val`=32"):
        BatchSizeSearchConfig(init_val=64, max_val=32)
    with pytest.raises(SpeedupConfigError, match="`init_val`=0 is invalid"):
        BatchSizeSearchConfig(init_val=0)
    with pytest.raises(SpeedupConfigError, match="`max_val`=-4 is invalid"):
        BatchSizeSearchConfig(max_val=-4)
    with pytest.raises(SpeedupConfigError, match="`steps_per_trial`=0 is invalid"):
        BatchSizeSearchConfig(steps_per_trial=0)
    with pytest.raises(SpeedupConfigError, match="`warmup_steps`=-1 is invalid"):
        BatchSizeSearchConfig(warmup_steps=-1)
    with pytest.raises(SpeedupConfigError, match=r"`memory_budget`=0.0 is out of range.*\(0.0, 1.0\]"):
        BatchSizeSearchConfig(memory_budget=0.0)
    with pytest.raises(SpeedupConfigError, match="`memory_budget`=1.5 is out of range"):
        BatchSizeSearchConfig(memory_budget=1.5)
    with pytest.raises(SpeedupConfigError, match="`mode`='power' is not supported"):
        BatchSizeSearchConfig(mode="power")
    with pytest.raises(SpeedupConfigError, match="`min_gain`=1.0 is out of range"):
        BatchSizeSearchConfig(min_gain=1.0)


def test_ladder():
    assert batch_size_ladder(16, 100) == [16, 32, 64, 100]
    assert batch_size_ladder(16, 64) == [16, 32, 64]
    assert batch_size_ladder(16, 96, allowed=lambda b: 96 % b == 0) == [16, 32, 96]
    assert batch_size_ladder(8, 8) == [8]


def test_search_stops_at_plateau_and_prefers_smallest_within_tolerance():
    measure = fake({8: 100.0, 16: 200.0, 32: 400.0, 64: 410.0, 128: 405.0, 256: 500.0})
    cfg = BatchSizeSearchConfig(init_val=8, max_val=256, early_plateau=False, patience=2)
    result = search_batch_size(measure, cfg, batch_size_ladder(8, 256))
    assert result.stop_reason == "plateau"
    assert measure.calls == [8, 16, 32, 64, 128]  # 64 and 128 gained < 5% twice: 256 never tried
    assert result.chosen == 32  # 410 is within 5% of 400: the smaller size wins
    assert [t.batch_size for t in result.trials] == measure.calls


def test_search_early_plateau_stops_on_an_explained_small_gain():
    # a fixed plus per-sample step cost: the gains shrink (1.8, 1.61, 1.14), the model's next gain after 1.14 is
    # 1.07 (within 2 x min_gain), and 64 -> 128 gains 3%: the ladder ends at once, 256 never tried
    measure = fake({8: 100.0, 16: 180.0, 32: 290.0, 64: 330.0, 128: 340.0, 256: 345.0})
    result = search_batch_size(measure, BatchSizeSearchConfig(init_val=8, max_val=256), batch_size_ladder(8, 256))
    assert measure.calls == [8, 16, 32, 64, 128] and result.stop_reason == "plateau (gain < min_gain)"
    assert result.chosen == 64


def test_search_climbs_past_an_unexplained_flat_stretch():
    # a rise that stops dead (2x per doubling, then 2.5%): more than a fixed per-step cost explains, so the small
    # gain is no stop; after two stalls 256 is faster again (the old rule kept 32, at 0.8x of 256)
    measure = fake({8: 100.0, 16: 200.0, 32: 400.0, 64: 410.0, 128: 405.0, 256: 500.0})
    result = search_batch_size(measure, BatchSizeSearchConfig(init_val=8, max_val=256), batch_size_ladder(8, 256))
    assert measure.calls == [8, 16, 32, 64, 128, 256] and result.chosen == 256
    # flat from the first size (no rise before it): the small CNN, flat from 16 to 64, faster from 128 on
    measure = fake({16: 1000.0, 32: 1010.0, 64: 1020.0, 128: 1180.0, 256: 1300.0, 512: 1340.0, 1024: 1330.0})
    result = search_batch_size(measure, BatchSizeSearchConfig(init_val=16, max_val=1024), batch_size_ladder(16, 1024))
    assert measure.calls == [16, 32, 64, 128, 256, 512] and result.chosen == 256  # 512: an explained small gain
    # a dip (16 measured slower than 8) is not a plateau either: the ladder goes on
    measure = fake({8: 100.0, 16: 90.0, 32: 400.0, 64: 800.0, 128: 820.0, 256: 900.0})
    result = search_batch_size(measure, BatchSizeSearchConfig(init_val=8, max_val=256), batch_size_ladder(8, 256))
    assert measure.calls == [8, 16, 32, 64, 128, 256] and result.chosen == 256
    # dips after the best size end the ladder after `patience` (3) doublings without progress
    measure = fake({8: 100.0, 16: 400.0, 32: 300.0, 64: 310.0, 128: 305.0, 256: 910.0})
    result = search_batch_size(measure, BatchSizeSearchConfig(init_val=8, max_val=256), batch_size_ladder(8, 256))
    assert measure.calls == [8, 16, 32, 64, 128] and result.stop_reason == "plateau" and result.chosen == 16


def test_search_max_fit_and_sweep():
    cfg = BatchSizeSearchConfig(mode="max_fit", init_val=8, max_val=128)
    result = search_batch_size(fake(), cfg, batch_size_ladder(8, 128))
    assert result.chosen == 128 and result.stop_reason == "max_val"
    sweep = fake({8: 1.0, 16: 5.0, 32: 2.0, 64: 3.0, 128: 4.0})
    result = search_batch_size(
        sweep, BatchSizeSearchConfig(mode="sweep", init_val=8, max_val=128), batch_size_ladder(8, 128)
    )
    assert sweep.calls == [8, 16, 32, 64, 128] and result.chosen == 16


def test_search_oom_steps_back_and_bisects():
    cfg = BatchSizeSearchConfig(mode="max_fit", init_val=16, max_val=1024)
    result = search_batch_size(fake(oom_from=80), cfg, batch_size_ladder(16, 1024))
    assert result.stop_reason == "out of memory" and result.chosen == 64
    assert result.trial(128).status == "oom"
    cfg = BatchSizeSearchConfig(mode="max_fit", init_val=16, max_val=1024, refine_steps=3)
    result = search_batch_size(fake(oom_from=80), cfg, batch_size_ladder(16, 1024))
    assert 64 < result.chosen < 80  # bisection between the last good (64) and the first failure (128)
    # the very first size does not fit: halve until one does
    measure = fake(oom_from=5)
    result = search_batch_size(measure, BatchSizeSearchConfig(init_val=16), batch_size_ladder(16, 4096))
    assert measure.calls == [16, 8, 4] and result.chosen == 4
    with pytest.raises(RuntimeError, match="even batch size 1"):
        search_batch_size(fake(oom_from=1), BatchSizeSearchConfig(init_val=2), batch_size_ladder(2, 8))


def test_search_memory_budget_predicts_and_refuses():
    measure = fake(mem_per_sample=100)  # peak = 1000 + 100 * b
    cfg = BatchSizeSearchConfig(mode="max_fit", init_val=8, max_val=1024)
    result = search_batch_size(
        measure, cfg, batch_size_ladder(8, 1024), memory_budget_bytes=1000 + 100 * 40, memory_baseline=1000
    )
    assert result.chosen == 32 and result.stop_reason == "memory budget (predicted)"
    assert 64 not in measure.calls  # predicted over budget, never run
    # a measured peak over the budget marks the trial and is never chosen
    result = search_batch_size(
        fake(mem_per_sample=100),
        BatchSizeSearchConfig(mode="max_fit", init_val=64),
        [64, 128],
        memory_budget_bytes=5000,
    )
    assert result.trial(64).status == "over_budget"
    assert result.chosen == 32
    # every size runs, but over the budget: the caller learns it was only the budget (it may keep its own size)
    with pytest.raises(NoBatchSizeFits, match=r"exceeds the memory budget: every size ran, but batch 1") as err:
        search_batch_size(fake(mem_per_sample=100), BatchSizeSearchConfig(init_val=4), [4, 8], memory_budget_bytes=500)
    assert err.value.over_budget_only and [t.batch_size for t in err.value.trials] == [4, 2, 1]
    with pytest.raises(NoBatchSizeFits, match="runs out of memory") as err:
        search_batch_size(fake(oom_from=1), BatchSizeSearchConfig(init_val=2), [2, 4], memory_budget_bytes=10**9)
    assert not err.value.over_budget_only


def test_result_round_trip_and_table():
    result = search_batch_size(fake(), BatchSizeSearchConfig(init_val=8, max_val=64), batch_size_ladder(8, 64))
    again = BatchSizeSearchResult.from_dict(result.as_dict())
    assert again == result
    assert "samples/s" in result.table() and f"{result.chosen}*" in result.table()
    torch.save(result.as_dict(), "r.pt")
    assert torch.load("r.pt", weights_only=True)["chosen"] == result.chosen


def test_scale_lr_factor():
    assert scale_lr_factor(128, 32, "linear") == pytest.approx(4.0)
    assert scale_lr_factor(128, 32, "sqrt") == pytest.approx(2.0)
    assert scale_lr_factor(128, 32, None) == 1.0


def test_memory_meter_cpu_sees_a_peak():
    meter = MemoryMeter(torch.device("cpu"))
    meter.start()
    big = torch.ones(64 * 2**20 // 4)  # 64 MiB touched
    del big
    peak = meter.stop()
    assert peak >= meter.current() - 2**20
    assert peak > 32 * 2**20 and meter.capacity() > peak


def test_snapshot_restores_bitwise_also_on_error():
    model = DemoClassifier(width=4)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, 1)
    x = torch.randn(8, 3, 32, 32)
    y = torch.randint(0, 10, (8,))
    model.loss_fn(model(x), y).backward()
    opt.step()  # non-empty optimizer state
    model.backbone[0].eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    opt_before = {k: v["exp_avg"].clone() for k, v in opt.state_dict()["state"].items()}
    model.train_acc(torch.randn(4, 10), torch.randint(0, 10, (4,)))
    acc_before = model.train_acc.compute().clone()
    with pytest.raises(ValueError, match="boom"):
        with snapshot_training_state(model, [opt], [sched]):
            model.train()
            for _ in range(2):
                opt.zero_grad()
                model.loss_fn(model(torch.randn(8, 3, 32, 32)), y).backward()
                opt.step()
                sched.step()
                model.train_acc(torch.randn(8, 10), y)
            random.random(), np.random.rand()
            raise ValueError("boom")
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert all(torch.equal(opt_before[k], v["exp_avg"]) for k, v in opt.state_dict()["state"].items())
    assert opt.param_groups[0]["lr"] == 1e-2 and sched.last_epoch == 0
    assert model.backbone[0].training is False and model.head.training is True
    assert torch.equal(model.train_acc.compute(), acc_before)
    # RNG: the next draws equal a fresh snapshot-free sequence from the same state
    state = torch.get_rng_state()
    with snapshot_training_state(model):
        torch.rand(3)
    assert torch.equal(torch.get_rng_state(), state)
