"""The fewer-CPU-threads measurement and rule of the advisor (no timing decides a pass: the ratio is injected)."""

from __future__ import annotations

import pytest
import torch

from lightning_speedups.demo import DemoClassifier
from lightning_speedups.functional.advisor import Measurements, diagnose, fewer_threads_speedup


def _measurements(**kw):
    return Measurements(batch_size=32, compute_times=[0.01] * 5, data_waits=[0.0] * 5, **kw)


def test_threads_rule_fires_only_on_a_measured_gain_on_cpu():
    m = _measurements(torch_threads=4, fewer_threads=2, fewer_threads_speedup=2.5)
    finding = next(f for f in diagnose(m) if f.key == "cpu_threads")
    assert finding.measured and finding.score == pytest.approx(0.6)  # all compute, 1 - 1/2.5 of it saved
    assert "torch.set_num_threads(2)" in finding.fix and "2.50x faster" in finding.expected
    assert "torch uses 4 CPU threads, but 2 ran faster" in finding.title
    for quiet in (1.0, 1.04, None):  # within noise, below the rule's 5%, or not measured: no finding
        m = _measurements(torch_threads=4, fewer_threads=2, fewer_threads_speedup=quiet)
        assert "cpu_threads" not in [f.key for f in diagnose(m)]
    gpu = _measurements(torch_threads=4, fewer_threads=2, fewer_threads_speedup=2.5, device_type="cuda")
    assert "cpu_threads" not in [f.key for f in diagnose(gpu)]


def test_fewer_threads_measurement_restores_threads_and_leaves_the_model_alone():
    before = torch.get_num_threads()  # the suite runs at 1 thread (conftest); measure 2 against 1
    model = DemoClassifier(width=4)
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    try:
        torch.set_num_threads(2)
        ratio = fewer_threads_speedup(model, torch.randn(8, 3, 32, 32), repeats=2, budget_s=0.5)
        assert ratio is not None and ratio > 0 and ratio.comparison is not None
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
    assert all(torch.equal(weights[k], v) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())


def test_fewer_threads_measurement_refuses_what_it_cannot_compare():
    before = torch.get_num_threads()
    model = DemoClassifier(width=4)
    x = torch.randn(2, 3, 32, 32)
    try:
        torch.set_num_threads(2)
        assert fewer_threads_speedup(model, x, threads=2) is None  # not fewer
        assert fewer_threads_speedup(model, x, threads=0) is None
        torch.set_num_threads(1)
        assert fewer_threads_speedup(model, x) is None  # nothing fewer than one thread
    finally:
        torch.set_num_threads(before)
