"""measure.compare: decisions that hold under seeded noise (an injectable clock and a jitter model)."""

from __future__ import annotations

import math
import random

import pytest

from lightning_speedups import SpeedupConfigError
from lightning_speedups.measure import compare, median_interval


def _noisy(seed: int, costs: dict[str, float], jitter: float = 0.3, outlier_every: int = 5):
    """Callables that advance a simulated clock by cost * (1 +- jitter), with a 3x outlier one call in N."""
    now = [0.0]
    rng = random.Random(seed)

    def clock() -> float:
        return now[0]

    def make(cost: float):
        def fn() -> None:
            t = cost * (1.0 + rng.uniform(-jitter, jitter))
            now[0] += t * 3.0 if rng.random() < 1.0 / outlier_every else t

        return fn

    return {name: make(cost) for name, cost in costs.items()}, clock


@pytest.mark.parametrize("jitter,outlier_every", [(0.3, 10**9), (0.1, 5)], ids=["uniform-30pct", "outlier-1-in-5"])
def test_compare_picks_a_real_gain_under_noise(jitter, outlier_every):
    picked = 0
    for seed in range(100):
        fns, clock = _noisy(seed, {"base": 1.0, "fast": 0.7, "same": 1.0}, jitter, outlier_every)
        result = compare(fns, "base", min_gain=0.05, budget_s=300.0, clock=clock, seed=seed)
        picked += result.winner == "fast"
        assert result.winner != "same"
    assert picked >= 95  # within 10% of the noise-free best in at least 95% of the seeds


def test_compare_keeps_the_baseline_when_within_noise():
    wrong = 0
    for seed in range(200):
        fns, clock = _noisy(seed, {"base": 1.0, "cand": 1.0})
        result = compare(fns, "base", min_gain=0.05, budget_s=100.0, clock=clock, seed=seed)
        wrong += result.winner != "base"
        if result.winner == "base" and not result.separated:
            assert "within noise" in result.note
    assert wrong <= 5  # at most 2.5% false gains


def test_compare_prefers_the_conservative_among_ties_and_reports_evidence():
    fns, clock = _noisy(0, {"base": 1.0, "a": 0.5, "b": 0.5}, jitter=0.05, outlier_every=10**9)
    result = compare(fns, "base", budget_s=60.0, clock=clock, prefer=["b", "a"])
    assert result.winner == "b" and "within noise of each other" in result.note
    assert result.trials >= 5 and set(result.medians) == {"base", "a", "b"} and result.gain == pytest.approx(2, 0.1)
    lo, mid, hi = result.ratios["b"]
    assert lo <= mid <= hi and result.spread["base"][0] <= result.medians["base"] <= result.spread["base"][1]


def test_compare_bad_input_and_budget():
    fns, clock = _noisy(0, {"base": 1.0, "cand": 1.0})
    with pytest.raises(SpeedupConfigError, match="`budget_s`=0 is out of range"):
        compare(fns, "base", budget_s=0)
    with pytest.raises(SpeedupConfigError, match="`baseline`='fp32' is not supported. Allowed values: 'base', 'cand'"):
        compare(fns, "fp32")
    with pytest.warns(UserWarning, match="timing cannot be trusted.*only 1 of 5 rounds"):
        result = compare(fns, "base", budget_s=3.0, clock=clock)  # every round hits the budget: conservative choice
    assert result.winner == "base" and not result.separated and result.trials == 1
    assert all(math.isnan(v) for v in median_interval([]))
    assert median_interval([3.0, 1.0, 2.0]) == (1.0, 3.0)  # too few samples for 95%: the full range


def test_compare_stops_once_a_borderline_candidate_cannot_change_the_winner():
    # "border" sits on the 10% threshold, so its interval never settles; "fast" (2.5x) clearly beats both. The
    # decision is settled once border's interval lies wholly below fast's: the budget is not spent on it
    for seed in range(20):
        fns, clock = _noisy(seed, {"base": 1.0, "border": 1 / 1.1, "fast": 0.4}, jitter=0.1, outlier_every=10**9)
        result = compare(fns, "base", min_gain=0.1, budget_s=500.0, clock=clock, seed=seed)
        assert result.winner == "fast" and result.separated and result.elapsed_s < 50.0
        lo, _mid, hi = result.ratios["border"]
        assert hi < result.ratios["fast"][0]
    # without the clear winner the same borderline candidate keeps the rounds going until the budget or max_rounds
    fns, clock = _noisy(0, {"base": 1.0, "border": 1 / 1.1}, jitter=0.1, outlier_every=10**9)
    slow = compare(fns, "base", min_gain=0.1, budget_s=500.0, clock=clock)
    assert slow.trials > 20
