"""The batch-size search under seeded timing noise: a simulated throughput curve, no training (issue 15).

``measure`` is the search's injectable timing: here it runs a trial the way ``run_trial`` does (timed steps until
``steps_per_trial`` steps, ``trial_samples`` samples or ``trial_time`` seconds) on a simulated clock, each step
costing ``step_time(b) * (1 +- jitter)``, times 3 one step in ``outlier_every``.
"""

from __future__ import annotations

import warnings

import pytest

from lightning_speedups._errors import SpeedupConfigError
from lightning_speedups.functional.batch_size import (
    BatchSizeSearchConfig,
    BatchSizeSearchResult,
    batch_size_ladder,
    search_batch_size,
)
from tests.helpers import simulated_trials

CURVES = {
    # fixed cost per step + per sample, and a CPU-cache penalty that makes very large batches slower again
    "peaked": lambda b: 0.02 + 0.001 * b + 2e-7 * b * b,
    # fixed + per-sample cost only: samples/s saturates, the best size is the largest
    "saturating": lambda b: 0.05 + 0.001 * b,
}
NOISE = {"uniform-30pct": (0.3, 10**9), "outlier-1-in-5": (0.1, 5)}
LADDER = batch_size_ladder(16, 2048)


def simulated(seed: int, curve: str, jitter: float, outlier_every: int, cfg: BatchSizeSearchConfig):
    """A seeded ``measure(b)`` on ``curve`` and its clock."""
    return simulated_trials(seed, CURVES[curve], jitter, outlier_every, cfg)


def noise_free_rate(curve: str, b: int) -> float:
    return b / CURVES[curve](b)


def within_10pct(curve: str, noise: str, confirm_rounds: int = 3, seeds: int = 100) -> int:
    cfg = BatchSizeSearchConfig(init_val=16, max_val=2048, confirm_rounds=confirm_rounds, confirm_budget=None)
    best = max(noise_free_rate(curve, b) for b in LADDER)
    good = 0
    for seed in range(seeds):
        measure, _clock = simulated(seed, curve, *NOISE[noise], cfg)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # an untrusted (warned) choice must not happen without a time limit
            result = search_batch_size(measure, cfg, LADDER)
        good += noise_free_rate(curve, result.chosen) >= 0.9 * best
    return good


@pytest.mark.parametrize("noise", list(NOISE))
@pytest.mark.parametrize("curve", list(CURVES))
def test_batch_size_choice_holds_under_noise(curve, noise):
    # the chosen size's noise-free samples/s is within 10% of the noise-free best in at least 95 of 100 seeds
    assert within_10pct(curve, noise) >= 95


@pytest.mark.parametrize("noise", list(NOISE))
@pytest.mark.parametrize("curve", list(CURVES))
def test_batch_size_default_confirm_budget_holds_under_noise(curve, noise):
    # the default budget on the final re-measurement (2x the first pass) keeps >= 95 of 100 seeds within 10% of the
    # best, costs no more simulated time than the unbounded search, and every choice it could not confirm is warned
    best = max(noise_free_rate(curve, b) for b in LADDER)
    good = 0
    spent = {None: [], 2.0: []}
    for seed in range(100):
        for budget in (None, 2.0):
            cfg = BatchSizeSearchConfig(init_val=16, max_val=2048, confirm_budget=budget)
            measure, clock = simulated(seed, curve, *NOISE[noise], cfg)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                result = search_batch_size(measure, cfg, LADDER)
            spent[budget].append(clock())
            assert result.trusted == (not any("timing cannot be trusted" in str(w.message) for w in caught))
            if budget is not None:
                good += noise_free_rate(curve, result.chosen) >= 0.9 * best
                assert result.final.get("rounds", 0) <= 3 * cfg.confirm_rounds
    assert good >= 95
    assert sorted(spent[2.0])[50] <= sorted(spent[None])[50]


def test_batch_size_confirm_budget_bounds_the_final_check():
    # budget 0.5: the final check may take half the first pass; too few rounds fit -> warned, smaller size kept
    cfg = BatchSizeSearchConfig(init_val=16, max_val=2048, confirm_budget=0.5)
    for seed in range(20):
        measure, _clock = simulated(seed, "saturating", 0.3, 10**9, cfg)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = search_batch_size(measure, cfg, LADDER)
        if not result.trusted:
            break
    else:
        raise AssertionError("a budget of half the first pass never ran out under 30% noise")
    message = next(str(w.message) for w in caught if "cannot be trusted" in str(w.message))
    assert "`confirm_budget`=0.5 x the first pass's" in message and "HINT: raise `confirm_budget`" in message
    assert result.chosen == min(result.final.get("sizes") or [result.chosen])
    with pytest.raises(SpeedupConfigError, match=r"`confirm_budget`=0 is out of range.*HINT: a multiple of the first"):
        BatchSizeSearchConfig(confirm_budget=0)


def test_batch_size_single_trial_rule_fails_under_noise():
    # the same search deciding from single trials (no re-measurement) stops on noise: the guard is what passes
    assert within_10pct("saturating", "uniform-30pct", confirm_rounds=1) < 80


def test_batch_size_noise_evidence_and_round_trip():
    cfg = BatchSizeSearchConfig(init_val=16, max_val=2048)
    measure, _clock = simulated(3, "peaked", 0.3, 10**9, cfg)
    result = search_batch_size(measure, cfg, LADDER)
    assert result.trusted and result.final["rounds"] >= cfg.confirm_rounds and result.remeasured
    sizes = result.final["sizes"]
    assert result.chosen in sizes and set(result.final["median_samples_per_s"]) == set(sizes)
    for b in sizes:
        lo, hi = result.final["spread_samples_per_s"][b]
        assert lo <= result.final["median_samples_per_s"][b] <= hi
    lo, mid, hi = result.final["ratio_vs_baseline"][sizes[1]]
    assert lo <= mid <= hi
    assert all({"sizes", "verdict", "median_ratio", "rounds"} <= set(d) for d in result.decisions)
    assert "interleaved rounds" in result.table() and result.note
    assert [t.batch_size for t in result.trials] == sorted({t.batch_size for t in result.trials})  # first pass only
    assert BatchSizeSearchResult.from_dict(result.as_dict()) == result


def test_batch_size_quiet_machine_needs_few_remeasurements():
    # 2% jitter: a clear dip is decided from the measured step noise, without re-measuring both sizes
    cfg = BatchSizeSearchConfig(init_val=16, max_val=2048)
    measure, _clock = simulated(0, "peaked", 0.02, 10**9, cfg)
    result = search_batch_size(measure, cfg, LADDER)
    assert result.chosen in (128, 256) and result.trusted
    assert any("step_noise" in d for d in result.decisions)


def test_batch_size_bad_time_budget_and_untrusted_timing():
    with pytest.raises(SpeedupConfigError, match=r"`search_time`=0 is out of range.*HINT: seconds for the whole"):
        BatchSizeSearchConfig(search_time=0)
    with pytest.raises(SpeedupConfigError, match="`search_time`=-1.0 is out of range"):
        BatchSizeSearchConfig(search_time=-1.0)
    with pytest.raises(SpeedupConfigError, match="`confirm_rounds`=0 is invalid. Allowed values: a positive integer"):
        BatchSizeSearchConfig(confirm_rounds=0)
    with pytest.raises(SpeedupConfigError, match="`confirm_top`=1 is invalid. Allowed values: an integer >= 2"):
        BatchSizeSearchConfig(confirm_top=1)
    with pytest.raises(SpeedupConfigError, match="`confidence`=1.0 is out of range"):
        BatchSizeSearchConfig(confidence=1.0)
    # every trial eats the budget: the ladder stops, the final re-measurement does not fit -> warned, conservative
    cfg = BatchSizeSearchConfig(init_val=16, max_val=2048, search_time=0.6, confirm_budget=None)
    measure, _clock = simulated(1, "peaked", 0.3, 10**9, cfg)
    with pytest.warns(UserWarning, match="timing cannot be trusted.*interleaved rounds fit in `search_time`=0.6"):
        result = search_batch_size(measure, cfg, LADDER)
    assert result.stop_reason == "search_time" and not result.trusted
    assert result.chosen == min(result.final.get("sizes") or [result.chosen])
    assert "kept the smallest near-best size" in result.note
