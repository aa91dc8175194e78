"""Functional quantization: fake quantization for QAT, int8 inference by measurement, float8 conversion logic."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lightning_speedups._errors import SpeedupConfigError
from lightning_speedups._structure import apply_structure_records
from lightning_speedups.demo import DemoClassifier, DemoMLP
from lightning_speedups.functional import float8 as f8
from lightning_speedups.functional import quantization as fq
from lightning_speedups.functional.quantization import (
    FakeQuantConfig,
    QuantizationReport,
    convert_to_float8,
    float8_filter,
    load_quantized,
    prepare_qat,
    qat_record,
    quantize_for_inference,
    remove_fake_quantization,
    save_quantized,
)

pytest.importorskip("torchao")


def _mlp() -> nn.Sequential:
    return nn.Sequential(nn.Flatten(), nn.Linear(192, 128), nn.ReLU(), nn.Linear(128, 10))


def test_quantization_misconfiguration():
    with pytest.raises(SpeedupConfigError, match="`weight_dtype`='fp4' is not supported"):
        FakeQuantConfig(weight_dtype="fp4")
    with pytest.raises(SpeedupConfigError, match="`layers`='conv3d' is not supported"):
        FakeQuantConfig(layers=("conv3d",))
    with pytest.raises(SpeedupConfigError, match="`model` has no layer eligible for QAT"):
        prepare_qat(nn.Sequential(nn.ReLU(), nn.LSTM(4, 4)))
    x = torch.randn(2, 3, 8, 8)
    with pytest.raises(SpeedupConfigError, match="`backend`='tensorrt' is not supported. Allowed values: 'auto'"):
        quantize_for_inference(_mlp(), x, backend="tensorrt")
    with pytest.raises(SpeedupConfigError, match="`max_rel_error`=0 is out of range"):
        quantize_for_inference(_mlp(), x, max_rel_error=0)
    report = QuantizationReport("none", 1, 1, 1.0, 1.0, 0.0)
    with pytest.raises(SpeedupConfigError, match="`report.backend`='none' cannot be saved"):
        save_quantized(_mlp(), report, "m.pt")
    with pytest.raises(SpeedupConfigError, match="`recipe`='mxfp8' is not supported"):
        convert_to_float8(_mlp(), recipe="mxfp8")


def test_prepare_qat_functional():
    model = DemoClassifier(width=8)
    x = torch.randn(4, 3, 32, 32)
    params = [id(p) for p in model.parameters()]
    keys = list(model.state_dict())
    model.eval()
    ref = model(x)
    config = FakeQuantConfig(exclude=("backbone.0",))
    summary = prepare_qat(model, config)
    assert summary.converted == ["backbone.1.0", "backbone.3.0", "backbone.4.0", "backbone.6.0", "head"]
    assert summary.skipped == {"backbone.0.0": "excluded"}
    assert [id(p) for p in model.parameters()] == params and list(model.state_dict()) == keys
    out = model(x)
    assert not torch.equal(out, ref)  # fake quantization changes the numbers ...
    torch.testing.assert_close(out, ref, atol=0.1 * ref.abs().max().item(), rtol=0)  # ... a little
    out.sum().backward()  # straight-through estimator: gradients reach every weight
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for n, p in model.named_parameters() if "weight" in n)
    assert prepare_qat(model, config) == summary  # idempotent: no double wrapping
    record = qat_record(model)
    assert record["layers"]["head"] == {"weight_dtype": "int8", "activation_dtype": "int8"}

    fresh = DemoClassifier(width=8).eval()
    apply_structure_records(fresh, {"lightning_speedups": {"qat": record}})
    fresh.load_state_dict(model.state_dict(), strict=True)
    torch.testing.assert_close(fresh(x), model(x))

    assert remove_fake_quantization(model) == list(record["layers"])
    assert qat_record(model) is None
    torch.testing.assert_close(model(x), ref)


def test_prepare_qat_weight_only_int4_linear_only():
    model = _mlp()
    summary = prepare_qat(model, FakeQuantConfig(weight_dtype="int4", activation_dtype=None, layers=("linear",)))
    assert summary.converted == ["1", "3"]
    assert model[1].activation_fake_quantizer is None
    w = model[1]._fq_weight()
    assert w.detach().unique(dim=1).shape[1] <= 16 * 128 and torch.unique(w[0]).numel() <= 16  # 4-bit grid per row


def test_quantize_for_inference_cnn_fx_static(tmp_path):
    model = DemoClassifier(width=8)
    prepare_qat(model)  # a QAT model: fake quantizers are stripped in the copy
    x = torch.randn(16, 3, 32, 32)
    qmodel, report = quantize_for_inference(model, x, backend="fx_static", min_speedup=0.0, repeats=2)
    assert report.backend == "fx_static" and list(report.candidates) == ["fx_static"]
    assert report.size_ratio > 1.5  # int8 conv weights (tiny model: scales and zero points weigh in)
    assert report.unsupported_layers == []  # conv, BN, ReLU and Linear all quantized
    assert qat_record(model) is not None  # input model untouched
    float_model = DemoClassifier(width=8)
    float_model.load_state_dict(model.state_dict())
    ref = float_model.eval()(x)
    with torch.no_grad():
        out = qmodel(x)
    heldout = (out - ref)[8:].abs().max().item()  # the second half of the example is held out from calibration
    assert heldout == pytest.approx(report.max_abs_diff, abs=1e-5)
    assert report.max_abs_diff <= 0.1 * ref.abs().max().item()

    save_quantized(qmodel, report, str(tmp_path / "int8.pt"))
    fresh = DemoClassifier(width=8)
    loaded = load_quantized(str(tmp_path / "int8.pt"), fresh, x[:1])
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), out)


def test_quantize_for_inference_mlp_dynamic(tmp_path):
    model = DemoMLP(hidden=(256,)).eval()
    x = torch.randn(32, 3, 32, 32)
    qmodel, report = quantize_for_inference(model, x, backend="eager_dynamic", min_speedup=0.0, repeats=2)
    assert report.backend == "eager_dynamic" and report.recipe["backend"] == "eager_dynamic"
    assert report.size_ratio > 3.0  # int8 weights: ~4x smaller
    assert type(qmodel.backbone[1]) is torch.ao.nn.quantized.dynamic.Linear
    ref = model(x)
    assert report.max_abs_diff <= 0.05 * ref.abs().max().item()
    save_quantized(qmodel, report, str(tmp_path / "int8.pt"))
    loaded = load_quantized(str(tmp_path / "int8.pt"), DemoMLP(hidden=(256,)), x)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), qmodel(x))


def test_quantize_for_inference_auto_keeps_the_fastest():
    model = DemoClassifier(width=4)
    qmodel, report = quantize_for_inference(model, torch.randn(8, 3, 32, 32), min_speedup=0.0, repeats=2)
    assert set(report.candidates) == {"fx_static", "eager_dynamic", "torchao_dynamic"}  # no compile unless allowed
    ok = {n: c for n, c in report.candidates.items() if c["status"] == "ok"}
    fastest = max(ok, key=lambda n: ok[n]["speedup"])
    # the fastest, or one within noise of it (its interval reaches the fastest's lower bound) that is more accurate
    chosen = ok[report.backend]
    assert report.backend == fastest or chosen["speedup_interval"][1] >= ok[fastest]["speedup_interval"][0]
    assert report.latency_after_s == chosen["latency_s"] and report.decision["trials"] >= 2
    convs = ["backbone.0.0", "backbone.1.0", "backbone.3.0", "backbone.4.0", "backbone.6.0"]
    # only FX static quantizes convolutions; the dynamic paths leave them in float and list them
    assert report.unsupported_layers == ([] if report.backend == "fx_static" else convs)


def test_quantize_for_inference_never_slower():
    model = _mlp()
    x = torch.randn(4, 3, 8, 8)
    with pytest.warns(UserWarning, match="returning the float model"):
        out_model, report = quantize_for_inference(model, x, backend="eager_dynamic", min_speedup=1e9, repeats=1)
    assert report.backend == "none" and report.speedup == 1.0 and report.unsupported_layers == ["1", "3"]
    assert type(out_model[1]) is nn.Linear
    with pytest.warns(UserWarning, match="no candidate within tolerance"):
        quantize_for_inference(model, x, backend="eager_dynamic", max_rel_error=1e-9, repeats=1)


def test_float8_filter():
    lin = nn.Linear(2048, 1024)
    assert float8_filter(lin, "a") is None
    assert float8_filter(nn.Linear(1000, 1024), "a") == "dims 1000x1024 not divisible by 16"
    assert float8_filter(lin, "a", min_features=2048) == "dims 2048x1024 below min_features=2048"
    assert float8_filter(lin, "block.a", exclude=("block",)) == "excluded"
    assert float8_filter(lin, "a", filter_fn=lambda m, fqn: fqn != "a") == "rejected by filter_fn"
    assert float8_filter(nn.Conv2d(16, 16, 1), "c") == "not an nn.Linear"


def test_float8_hardware_check(monkeypatch):
    monkeypatch.setattr(f8, "_cuda_capability", lambda: (8, 6))
    assert fq.float8_supported() == (False, fq.float8_supported()[1]) and "8.6" in fq.float8_supported()[1]
    with pytest.raises(SpeedupConfigError, match="float8 is unavailable: .*this GPU has 8.6"):
        convert_to_float8(nn.Sequential(nn.Linear(1024, 1024)))
    monkeypatch.setattr(f8, "_cuda_capability", lambda: (9, 0))
    assert fq.float8_supported() == (True, "")
    summary = convert_to_float8(nn.Sequential(nn.Linear(1024, 1024), nn.Linear(1024, 10)))
    assert summary.converted == ["0"] and summary.skipped == {"1": "dims 1024x10 not divisible by 16"}


@pytest.mark.slow
def test_quantize_for_inference_pt2e_inductor():
    """torchao PT2E + X86InductorQuantizer + torch.compile (tens of seconds of compilation on a small CPU)."""
    model = _mlp().eval()
    x = torch.randn(32, 3, 8, 8)
    qmodel, report = quantize_for_inference(model, x, backend="pt2e_inductor", min_speedup=0.0, repeats=2)
    assert report.candidates["pt2e_inductor"]["status"] == "ok", report.candidates
    assert report.max_abs_diff <= 0.1 * model(x).abs().max().item()
