"""``quantize_for_inference`` on architecture classes whose outputs are not one logits tensor, and on models where no
layer can be quantized (issue 26): never a silent float model, never an "int8" model with nothing in int8."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lightning_speedups import SpeedupConfigError
from lightning_speedups.functional import quantize_for_inference
from lightning_speedups.functional.int8_backends import count_quantized_layers


class DictHeads(nn.Module):
    """Segmentation-style output: ``{"out": ..., "aux": ...}`` (torchvision's DeepLabV3 / FCN)."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(32, 64), nn.ReLU())
        self.out = nn.Linear(64, 8)
        self.aux = nn.Linear(64, 8)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        h = self.body(x)
        return {"out": self.out(h), "aux": self.aux(h)}


class TupleHeads(DictHeads):
    """A tuple of tensors and a non-tensor (a model returning ``(logits, hidden, extras)``)."""

    def forward(self, x: torch.Tensor) -> tuple:  # type: ignore[override]
        heads = super().forward(x)
        return heads["out"], heads["aux"], {"note": "not a tensor"}


class NoTensorOut(DictHeads):
    def forward(self, x: torch.Tensor) -> list[str]:  # type: ignore[override]
        return ["class"] * x.shape[0]


class ConvOnly(nn.Module):
    """No nn.Linear: the dynamic int8 paths have nothing to quantize (as on a U-Net)."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 3, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def _hf_output_model():
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_outputs import Seq2SeqLMOutput

    class HFStyle(DictHeads):
        def forward(self, x: torch.Tensor) -> Seq2SeqLMOutput:  # type: ignore[override]
            heads = super().forward(x)
            return Seq2SeqLMOutput(logits=heads["out"], encoder_last_hidden_state=heads["aux"])

    del transformers
    return HFStyle()


@pytest.mark.parametrize("build", [DictHeads, TupleHeads, _hf_output_model], ids=["dict", "tuple", "model_output"])
def test_quantization_structured_outputs_are_compared(build):
    torch.manual_seed(0)
    model = build().eval()
    qmodel, report = quantize_for_inference(
        model, torch.randn(16, 32), backend="eager_dynamic", min_speedup=0.0, repeats=2, budget_s=1.0
    )
    cand = report.candidates["eager_dynamic"]
    assert cand["status"] == "ok", cand  # compared on the logits / all tensors, not failed on `.float()`
    assert cand["quantized_layers"] == 3 and report.quantized_layers == 3 and report.backend == "eager_dynamic"
    assert 0 < cand["heldout_rel_error"] < 0.1


def test_quantization_output_without_tensor_refused():
    with pytest.raises(SpeedupConfigError, match=r"\(NoTensorOut\) returns a list with no tensor.*HINT: wrap"):
        quantize_for_inference(NoTensorOut().eval(), torch.randn(8, 32), repeats=2, budget_s=1.0)


def test_quantization_zero_layer_candidate_never_chosen():
    model = ConvOnly().eval()
    x = torch.randn(4, 3, 8, 8)
    with pytest.warns(UserWarning, match=r"no layer of ConvOnly could be quantized.*net\.0, net\.2"):
        out_model, report = quantize_for_inference(
            model, x, backend="eager_dynamic", min_speedup=0.0, repeats=2, budget_s=1.0
        )
    assert report.backend == "none" and report.quantized_layers == 0
    assert report.candidates["eager_dynamic"] == {"status": "no_layer_quantized", "quantized_layers": 0}
    assert type(out_model.net[0]) is nn.Conv2d


def test_quantization_segmentation_dict_output_without_linear():
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    model = torchvision.models.segmentation.lraspp_mobilenet_v3_large(
        weights=None, weights_backbone=None, num_classes=3
    ).eval()
    with pytest.warns(UserWarning, match="no layer of LRASPP could be quantized"):
        _, report = quantize_for_inference(
            model, torch.randn(2, 3, 32, 32), backend="torchao_dynamic", min_speedup=0.0, repeats=2, budget_s=1.0
        )
    assert report.backend == "none" and report.quantized_layers == 0


def test_quantization_reports_layers_quantized_per_backend():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 8)).eval()
    assert count_quantized_layers(model) == 0
    _, report = quantize_for_inference(model, torch.randn(8, 3, 8, 8), min_speedup=0.0, repeats=2, budget_s=1.0)
    layers = {n: c.get("quantized_layers") for n, c in report.candidates.items() if c["status"] != "failed"}
    assert layers.get("fx_static") == 2 and layers.get("eager_dynamic") == 1  # conv+relu fused, and the linear
    assert report.quantized_layers == layers[report.backend] > 0


def test_quantization_t5_seq2seq_output():
    transformers = pytest.importorskip("transformers")
    config = transformers.T5Config(
        vocab_size=64,
        d_model=32,
        d_kv=8,
        d_ff=64,
        num_layers=1,
        num_decoder_layers=1,
        num_heads=2,
        decoder_start_token_id=0,
    )
    torch.manual_seed(0)
    model = transformers.T5ForConditionalGeneration(config).eval()
    ids = torch.randint(1, 64, (8, 6))
    example = (ids, None, ids)  # input_ids, attention_mask, decoder_input_ids
    _, report = quantize_for_inference(
        model, example, backend="eager_dynamic", min_speedup=0.0, max_rel_error=0.5, repeats=2, budget_s=1.0
    )
    cand = report.candidates["eager_dynamic"]
    assert cand["status"] in ("ok", "too_inaccurate"), cand  # compared on Seq2SeqLMOutput.logits
    assert cand["quantized_layers"] > 0


class FunctionalWeight(nn.Module):
    """An attention-style block whose forward reads ``self.qkv.weight`` itself (``F.linear``, as timm's EVA, BEiT and
    Swin v2 do) next to Linears it calls as modules."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(32, 96)
        self.proj = nn.Linear(32, 32)
        self.head = nn.Linear(32, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = nn.functional.linear(x, self.qkv.weight, self.qkv.bias).chunk(3, dim=-1)
        return self.head(self.proj(q * k.sigmoid() + v))


@pytest.mark.parametrize("backend", ["eager_dynamic", "torchao_dynamic"])
def test_quantization_leaves_a_functionally_read_linear_in_float(backend, tmp_path):
    """Before: eager_dynamic failed (``linear(): argument 'weight' must be Tensor, not method``), torchao_dynamic
    with an IndexError, and the float model came back. Now the read layer stays float, the called ones are int8,
    and the saved model rebuilds."""
    if backend == "torchao_dynamic":
        pytest.importorskip("torchao")
    from lightning_speedups.functional import load_quantized, save_quantized

    torch.manual_seed(0)
    model = FunctionalWeight().eval()
    x = torch.randn(16, 32)
    qmodel, report = quantize_for_inference(model, x, backend=backend, min_speedup=0.0, repeats=2, budget_s=1.0)
    cand = report.candidates[backend]
    assert cand["status"] == "ok" and cand["quantized_layers"] == 2, cand
    assert report.backend == backend and report.unsupported_layers == ["qkv"]
    assert type(model.qkv) is nn.Linear and count_quantized_layers(model) == 0  # the user's model is not changed
    save_quantized(qmodel, report, tmp_path / "q.pt")
    reloaded = load_quantized(tmp_path / "q.pt", FunctionalWeight().eval(), x)
    with torch.no_grad():
        torch.testing.assert_close(reloaded(x), qmodel(x))
