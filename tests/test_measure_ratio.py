"""Single A/B decisions through measure.compare (issue 15): the CPU bf16 probe, the recipes' layout/precision check
and the advisor's expected gains are conservative within noise and carry their evidence. Seeded noise, no timing."""

from __future__ import annotations

import random
import warnings

import pytest
import torch

import lightning_speedups.settings as S
from lightning_speedups import recipes
from lightning_speedups.demo import DemoClassifier
from lightning_speedups.functional import advisor as F
from lightning_speedups.functional.advisor import Measurements, diagnose
from lightning_speedups.measure import MeasuredRatio, compare, describe_ratio, measured_ratio, ratio_evidence
from tests.test_measure_decisions import _noisy

NOISE = {"uniform-30pct": (0.3, 10**9), "outlier-1-in-5": (0.1, 5)}
# what `cpu_bf16_speed_ratio` asks of the probe (and `cpu_bf16_is_fast` checks): clearly 30% faster, within 3 s
BF16_PROBE = dict(min_gain=0.3, budget_s=3.0, min_rounds=5)


def _bf16_decision(seed: int, bf16_cost: float, noise: str) -> float:
    """The probe's ratio for a simulated fp32 step of 20 ms and a bf16 step of ``bf16_cost`` x that."""
    fns, clock = _noisy(seed, {"base": 0.02, "cand": 0.02 * bf16_cost}, *NOISE[noise])
    return measured_ratio(fns["base"], fns["cand"], clock=clock, seed=seed, **BF16_PROBE)


@pytest.mark.parametrize("noise", list(NOISE))
@pytest.mark.parametrize(
    "bf16_cost, want",
    [(0.5, "bf16"), (1.0, "fp32"), (0.9, "fp32"), (10.0, "slow")],
    ids=["bf16-2x-faster", "same", "bf16-1.1x-faster", "bf16-10x-slower"],
)
def test_bf16_probe_decision_holds_under_noise(bf16_cost, want, noise):
    # the decision is within 10% of the noise-free best (fp32 when bf16 gains < 30%) in at least 95 of 100 seeds
    right = 0
    for seed in range(100):
        ratio = _bf16_decision(seed, bf16_cost, noise)
        # `cpu_bf16_is_fast` / the "bf16 is slower" warning
        fast = ratio > 1.3
        slow = ratio < 1.0
        right += {"bf16": fast, "fp32": not fast, "slow": slow and not fast}[want]
    assert right >= 95


def test_cpu_bf16_probe_asks_for_a_confidence_bound(monkeypatch):
    seen = {}

    def fake(model, x, **kw):
        seen.update(kw)
        return MeasuredRatio(1.0)

    monkeypatch.setattr(S, "bf16_autocast_speedup", fake)
    S.cpu_bf16_speed_ratio.cache_clear()
    try:
        assert S.cpu_bf16_speed_ratio() == 1.0 and not S.cpu_bf16_is_fast()
    finally:
        S.cpu_bf16_speed_ratio.cache_clear()
    assert seen["min_gain"] == BF16_PROBE["min_gain"] and seen["budget_s"] == BF16_PROBE["budget_s"]
    assert seen["repeats"] == BF16_PROBE["min_rounds"]


def test_settings_reason_carries_the_evidence(monkeypatch):
    monkeypatch.setattr(S, "cpu_bf16_speed_ratio", lambda: _bf16_decision(0, 0.5, "uniform-30pct"))
    monkeypatch.setattr(S, "_cuda_device_count", lambda: 0)
    monkeypatch.setattr(S, "_torch_xla_installed", lambda: False)
    monkeypatch.setattr(S, "_mps_available", lambda: False)
    s = S.explain_trainer_settings()
    assert s.kwargs["precision"] == "bf16-mixed"
    assert "interval" in s.reasons["precision"] and "rounds" in s.reasons["precision"]
    monkeypatch.setattr(S, "cpu_bf16_speed_ratio", lambda: _bf16_decision(0, 1.0, "uniform-30pct"))
    s = S.explain_trainer_settings()
    assert s.kwargs["precision"] == "32-true" and "was not measurably faster than fp32" in s.reasons["precision"]
    assert "within noise" in s.reasons["precision"]


def test_measured_ratio_is_conservative_and_carries_evidence():
    fns, clock = _noisy(1, {"base": 0.02, "cand": 0.01}, jitter=0.05, outlier_every=10**9)
    r = measured_ratio(fns["base"], fns["cand"], clock=clock)
    lo, hi = r.interval
    assert isinstance(r, float) and float(r) == lo and lo <= r.median <= hi and r.trials >= 5
    assert ratio_evidence(r)["median_ratio"] == pytest.approx(r.median, abs=1e-3) and "interval" in describe_ratio(r)
    fns, clock = _noisy(1, {"base": 0.02, "cand": 0.02})
    same = measured_ratio(fns["base"], fns["cand"], clock=clock)
    assert same == 1.0 and same.interval[0] <= 1.0 <= same.interval[1] and "within noise" in describe_ratio(same)
    fns, clock = _noisy(1, {"base": 0.02, "cand": 0.2}, jitter=0.05, outlier_every=10**9)
    slow = measured_ratio(fns["base"], fns["cand"], clock=clock)
    assert slow == slow.interval[1] < 1.0
    fns, clock = _noisy(1, {"base": 1.0, "cand": 0.1})
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the caller's report says it, not a warning naming measured_ratio's internals
        untrusted = measured_ratio(fns["base"], fns["cand"], clock=clock, budget_s=2.0)
    assert untrusted == 1.0 and "too few rounds" in describe_ratio(untrusted)
    assert ratio_evidence(1.5) == {} and describe_ratio(None) == ""  # plain numbers (mocked probes) have none


def _fake_steps(monkeypatch, seed: int, cost: dict[str, float], noise: str):
    """Replace the recipes' train steps with seeded simulated ones; returns the simulated clock."""
    rng = random.Random(seed)
    now = [0.0]
    jitter, outlier_every = NOISE[noise]

    def make_train_step(model, x, y, autocast_dtype=None):
        name = (
            "channels_last" if x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous() else "nchw"
        ) + ("+bf16" if autocast_dtype is not None else "+fp32")

        def step() -> None:
            t = cost[name] * (1.0 + rng.uniform(-jitter, jitter))
            now[0] += t * 3.0 if rng.random() < 1.0 / outlier_every else t

        return step

    monkeypatch.setattr("lightning_speedups.measure.make_train_step", make_train_step)
    return lambda: now[0]


@pytest.mark.parametrize("noise", list(NOISE))
def test_recipe_layout_precision_probe_holds_under_noise(monkeypatch, noise):
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3))
    example = torch.randn(1, 3, 8, 8)
    same = {"nchw+fp32": 0.02, "channels_last+fp32": 0.02, "nchw+bf16": 0.02, "channels_last+bf16": 0.02}
    faster_cl = {**same, "channels_last+fp32": 0.01, "channels_last+bf16": 0.04}
    conservative = picked_cl = 0
    for seed in range(100):
        clock = _fake_steps(monkeypatch, seed, same, noise)
        cl, precision, _r = recipes.measure_cpu_layout_and_precision(model, example, batch_size=2, clock=clock)
        conservative += (cl, precision) == (False, "32-true")
        clock = _fake_steps(monkeypatch, seed, faster_cl, noise)
        cl, precision, _r = recipes.measure_cpu_layout_and_precision(model, example, batch_size=2, clock=clock)
        picked_cl += (cl, precision) == (True, "32-true")
    assert conservative >= 95 and picked_cl >= 95


def test_recipe_probe_reports_evidence(monkeypatch):
    clock = _fake_steps(
        monkeypatch,
        0,
        {"nchw+fp32": 0.02, "channels_last+fp32": 0.02, "nchw+bf16": 0.01, "channels_last+bf16": 0.01},
        "uniform-30pct",
    )
    cl, precision, ratios = recipes.measure_cpu_layout_and_precision(
        DemoClassifier(width=4), torch.randn(1, 3, 8, 8), batch_size=2, clock=clock
    )
    assert (cl, precision) == (False, "bf16-mixed")  # both bf16 variants tie: the one without channels_last
    assert ratios["nchw+fp32"] == 1.0 and ratios["nchw+bf16"] > 1.1 and ratios["nchw+bf16"].trials >= 3
    assert "interval" in describe_ratio(ratios["channels_last+fp32"])


def test_advisor_expected_gains_carry_evidence_and_stay_conservative():
    fns, clock = _noisy(0, {"base": 0.02, "cand": 0.01}, jitter=0.05, outlier_every=10**9)
    measured = measured_ratio(fns["base"], fns["cand"], clock=clock, min_gain=0.02)
    m = Measurements(
        batch_size=32, compute_times=[0.01] * 5, data_waits=[0.0] * 5, has_conv=True, channels_last_speedup=measured
    )
    cl = {f.key: f for f in diagnose(m)}["channels_last"]
    assert cl.measured and cl.evidence["measurement"]["rounds"] >= 5 and "interval" in cl.expected
    fns, clock = _noisy(0, {"base": 0.02, "cand": 0.02})
    m.channels_last_speedup = measured_ratio(fns["base"], fns["cand"], clock=clock, min_gain=0.02)
    cl = {f.key: f for f in diagnose(m)}["channels_last"]
    assert cl.score == 0.0 and "no gain on this machine" in cl.expected and "within noise" in cl.expected
    # the real micro-measurements return measured ratios with their evidence
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU())
    s = F.channels_last_speedup(model, torch.randn(2, 3, 8, 8), repeats=2, budget_s=1.0)
    assert isinstance(s, MeasuredRatio) and s.trials >= 2 and compare is not None
