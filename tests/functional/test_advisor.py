"""Pure advisor logic: findings from mocked measurements, the report formats, the micro-measurements."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from lightning_speedups._errors import SpeedupConfigError
from lightning_speedups.functional.advisor import (
    AdvisorReport,
    AdvisorThresholds,
    Measurements,
    OptimizerMeasurement,
    bf16_autocast_speedup,
    channels_last_speedup,
    diagnose,
    fused_optimizer_speedup,
)


def _m(compute: float, wait: float, n: int = 10, **kw) -> Measurements:
    kw.setdefault("batch_size", 128)
    kw.setdefault("loader_kind", "DataLoader")
    kw.setdefault("num_workers", 0)
    return Measurements(compute_times=[compute] * n, data_waits=[wait] * n, **kw)


def _keys(findings) -> list[str]:
    return [f.key for f in findings]


def test_advisor_misconfiguration():
    with pytest.raises(SpeedupConfigError, match="`data_wait`=1.5 is out of range"):
        AdvisorThresholds(data_wait=1.5)
    with pytest.raises(SpeedupConfigError, match="`data_wait_note`=0.5 is out of range.*must not exceed `data_wait`"):
        AdvisorThresholds(data_wait_note=0.5, data_wait=0.2)
    with pytest.raises(SpeedupConfigError, match="`small_batch`=0 is out of range. Allowed values: an integer >= 1"):
        AdvisorThresholds(small_batch=0)


def test_advisor_functional_data_bound():
    m = _m(compute=0.010, wait=0.030)
    assert m.data_wait_share == pytest.approx(0.75)
    assert m.samples_per_s == pytest.approx(128 / 0.040)
    findings = diagnose(m)
    top = findings[0]
    assert top.key == "data_bound" and top.severity == "high"
    assert top.score == pytest.approx(0.75)
    assert "DeviceDataLoader" in top.fix and "num_workers" in top.fix
    assert top.evidence["data_wait_ms"] == pytest.approx(30.0)
    assert "4.0x" in top.expected  # Amdahl bound 1 / (1 - 0.75)
    assert "num_workers_zero" not in _keys(findings)  # folded into data_bound, not reported twice


def test_advisor_functional_compute_bound():
    findings = diagnose(_m(compute=0.050, wait=0.0005))
    assert "data_bound" not in _keys(findings)
    assert "num_workers_zero" not in _keys(findings)  # 1% waiting: not worth a note
    # a middle case is only a low-severity note about num_workers=0
    mid = diagnose(_m(compute=0.050, wait=0.005))
    assert "data_bound" not in _keys(mid)
    assert [f.severity for f in mid if f.key == "num_workers_zero"] == ["low"]


def test_advisor_functional_bf16_on_slow_cpu():
    m = _m(0.1, 0.0, precision="bf16-mixed", cpu_bf16_fast=False, bf16_speedup=0.1)
    top = diagnose(m)[0]
    assert top.key == "low_precision_on_slow_cpu" and top.severity == "high" and top.measured
    assert top.evidence["bf16_step_slowdown"] == pytest.approx(10.0)
    assert "trainer_settings(precision=" in top.fix and "10.0x" in top.expected
    # capability known only from the library's probe (not measured on the model): still flagged, marked unmeasured
    probe_only = diagnose(_m(0.1, 0.0, precision="bf16-mixed", cpu_bf16_fast=False))[0]
    assert probe_only.key == "low_precision_on_slow_cpu" and not probe_only.measured
    # a CPU with fast bf16: no such finding; fp32 there gets a measured suggestion instead
    assert "low_precision_on_slow_cpu" not in _keys(diagnose(_m(0.1, 0.0, precision="bf16-mixed", cpu_bf16_fast=True)))
    assert "low_precision_on_slow_cpu" not in _keys(diagnose(_m(0.1, 0.0, precision="bf16-mixed", bf16_speedup=1.5)))
    fast = {f.key: f for f in diagnose(_m(0.1, 0.0, precision="32-true", cpu_bf16_fast=True, bf16_speedup=2.0))}
    assert fast["fp32_on_bf16_cpu"].score == pytest.approx(0.5) and "bf16-mixed" in fast["fp32_on_bf16_cpu"].fix


def test_advisor_functional_gpu_rules():
    m = _m(
        0.02,
        0.001,
        device_type="cuda",
        device_name="NVIDIA A100",
        precision="32-true",
        cuda_bf16_supported=True,
        tf32_off=True,
        flops_per_batch=int(1e9),
        peak_flops=312e12,
        memory_kind="cuda",
        peak_memory_bytes=95,
        memory_total_bytes=100,
        batch_size=16,
    )
    assert m.utilisation == pytest.approx(1e9 / 0.02 / 312e12)
    keys = _keys(diagnose(m))
    for key in ("fp32_on_bf16_gpu", "tf32_off", "memory_pressure", "not_compiled"):
        assert key in keys
    assert "small_batch" not in keys  # no memory headroom for a larger batch
    m.peak_memory_bytes = 10
    assert "small_batch" in _keys(diagnose(m))


def test_advisor_functional_model_and_optimizer_rules():
    m = _m(
        0.1,
        0.0,
        has_conv=True,
        channels_last_speedup=1.5,
        frozen_updated=["backbone.0.weight"],
        never_grad=["extra.weight"],
        trainable_params=10,
        optimizers=[OptimizerMeasurement("Adam", fused=None, fused_supported=True, fused_speedup=2.0)],
        optimizer_times=[0.02] * 10,
        callbacks=["TorchCompile"],
    )
    findings = diagnose(m)
    by_key = {f.key: f for f in findings}
    assert by_key["channels_last"].score == pytest.approx(1 - 1 / 1.5) and "ChannelsLast" in by_key["channels_last"].fix
    assert by_key["frozen_but_updated"].severity == "high" and "FineTuneFreezing" in by_key["frozen_but_updated"].fix
    assert by_key["unused_trainable_params"].evidence["examples"] == ["extra.weight"]
    opt = by_key["optimizer_not_fused"]
    assert opt.score == pytest.approx(0.2 * 0.5) and 'implementation="fused"' in opt.fix
    assert "not_compiled" not in by_key  # a TorchCompile callback is already there
    assert [f.score for f in findings] == sorted((f.score for f in findings), reverse=True)
    # channels_last measured slower -> kept as information, ranked last, no score
    m.channels_last_speedup = 0.8
    cl = {f.key: f for f in diagnose(m)}["channels_last"]
    assert cl.severity == "info" and cl.score == 0.0
    # already fused / already channels_last / callback present: nothing to say
    m.optimizers[0].fused = True
    m.conv_channels_last = True
    assert not {"optimizer_not_fused", "channels_last"} & set(_keys(diagnose(m)))


def test_advisor_report_formats(tmp_path):
    m = _m(
        0.01,
        0.03,
        flops_per_batch=int(2e9),
        peak_memory_bytes=2**30,
        memory_total_bytes=2**33,
        memory_available_bytes=2**32,
    )
    report = AdvisorReport(m.summary(), diagnose(m), notes=["a note"])
    d = report.to_dict()
    assert d["summary"]["data_wait_share"] == pytest.approx(0.75) and d["findings"][0]["key"] == "data_bound"
    text = report.to_json(tmp_path / "r.json")
    assert json.loads((tmp_path / "r.json").read_text()) == json.loads(text) == json.loads(json.dumps(d))
    txt = report.to_text()
    assert "75% waiting for data" in txt and "1. [high 0.75] Data-bound" in txt and "DeviceDataLoader" in txt
    assert "device peak unknown" in txt and "50% headroom" in txt and "note: a note" in txt
    empty = AdvisorReport(Measurements().summary(), [])
    assert "no findings" in empty.to_text()


def test_advisor_report_cpu_utilisation_against_estimated_peak():
    from lightning_speedups.measure import estimate_cpu_peak_flops

    est = estimate_cpu_peak_flops(cores=2, ghz=2.45, flags="sse avx avx2 fma", vendor="AuthenticAMD")  # 156.8 GFLOP/s
    m = _m(
        0.1,
        0.001,
        batch_size=32,
        flops_per_batch=int(6.9e9),
        peak_flops=est.flops,  # 69 GFLOP/s in the step
        peak_flops_estimated=True,
        peak_flops_source=est.describe(),
    )
    assert m.utilisation == pytest.approx(69e9 / 156.8e9)
    s = m.summary()
    assert s["peak_flops_estimated"] is True and s["peak_flops_source"] == est.describe()
    line = next(x for x in AdvisorReport(s, []).to_text().splitlines() if "GFLOP/s in the step" in x)
    assert line.endswith(
        "69.0 GFLOP/s in the step; 44.0% of the estimated CPU peak 157 GFLOP/s fp32 "
        "(AVX2+FMA, 32 FLOP/cycle/core x 2 cores x 2.45 GHz; an estimate)"
    )
    # under-used CPU (below `low_utilisation`) against an estimate: flagged, named an estimate, scored as before
    m.flops_per_batch = int(1e9)
    small = next(f for f in diagnose(m) if f.key == "small_batch")
    assert "of the estimated CPU peak FLOP/s" in small.title
    assert small.score == pytest.approx(m.compute_share * 0.1)
    # a busy CPU (above `low_utilisation` of the estimate) is not called under-used
    m.flops_per_batch = int(1.2e10)
    assert "small_batch" not in _keys(diagnose(m))
    # a datasheet peak (GPU) keeps its wording; an unknown one says why
    gpu = _m(0.02, 0.0, flops_per_batch=int(1e12), peak_flops=989.4e12, peak_flops_source="peak 989 TFLOP/s bf16 (x)")
    assert "5.1% of the device's peak 989 TFLOP/s bf16 (x)" in AdvisorReport(gpu.summary(), []).to_text()
    none = _m(0.02, 0.0, flops_per_batch=int(1e9), peak_flops_source="no known vector ISA in the CPU flags")
    assert "device peak unknown (no known vector ISA" in AdvisorReport(none.summary(), []).to_text()


def test_advisor_micro_measurements():
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 8 * 8, 2))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    s = channels_last_speedup(model, torch.randn(4, 3, 8, 8), repeats=1)
    assert s is not None and s > 0
    # the real model is untouched: same values, same layout, no grads
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert model[0].weight.is_contiguous() and model[0].weight.grad is None
    assert channels_last_speedup(model, torch.randn(4, 3 * 8 * 8)) is None  # not an image batch

    lin = nn.Linear(8, 8)
    opt = torch.optim.Adam(lin.parameters(), lr=1e-3)
    assert fused_optimizer_speedup(opt) is None  # no grads yet: nothing to time
    lin(torch.randn(2, 8)).sum().backward()
    w = lin.weight.detach().clone()
    assert fused_optimizer_speedup(opt, repeats=1) > 0
    assert torch.equal(w, lin.weight) and not opt.state  # measured on clones only
    assert fused_optimizer_speedup(torch.optim.LBFGS(lin.parameters())) is None  # no fused kernel

    assert bf16_autocast_speedup(model, torch.randn(4, 3, 8, 8), repeats=1) > 0
    assert bf16_autocast_speedup(model, torch.zeros(4, 3, 8, 8, dtype=torch.long)) is None  # token ids etc.
    assert model[0].weight.grad is None
