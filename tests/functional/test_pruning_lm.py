"""Mask pruning of decoder LMs (issue 51): Hugging Face ``Conv1D`` layers (GPT-2) are masked as ``nn.Linear`` is, the
tied ``lm_head`` is left dense, and masks survive ``make_pruning_permanent``, a save and a reload."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lightning_speedups._errors import SpeedupConfigError
from lightning_speedups.functional.pruning import (
    count_macs,
    default_ignored_layers,
    load_pruned,
    make_pruning_permanent,
    mask_targets,
    masked_modules,
    prune_structured,
    prune_unstructured,
    save_pruned,
    weight_mask,
)
from tests.lm_models import MiniGPT, tiny_gpt2

IDX = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(0))


def _conv1d_names(model: nn.Module) -> list[str]:
    return [n for n, m in model.named_modules() if type(m).__name__ == "Conv1D"]


def test_pruning_functional_unstructured_hf_conv1d(tmp_path):
    pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = tiny_gpt2().eval()
    conv1d = _conv1d_names(model)
    assert len(conv1d) == 8  # c_attn, c_proj, mlp.c_fc, mlp.c_proj per block
    assert default_ignored_layers(model, {"input_ids": IDX}, every_path=False) == ["lm_head"]
    summary = prune_unstructured(model, 0.5, ignored_layers=["lm_head"])
    assert set(summary.layers) == set(conv1d)  # every Conv1D masked; the tied head (and the embedding) left dense
    assert weight_mask(model.lm_head) is None and model.lm_head.weight is model.transformer.wte.weight
    masks = {n: weight_mask(model.get_submodule(n)) for n in conv1d}
    layer = model.transformer.h[0].attn.c_attn
    assert masks["transformer.h.0.attn.c_attn"].shape == layer.weight.shape == (32, 96)  # Conv1D: (in, out)
    zeros = sum(int((m == 0).sum()) for m in masks.values())
    assert zeros == round(0.5 * sum(m.numel() for m in masks.values()))  # exact global sparsity
    first = {n: m.clone() for n, m in masks.items()}
    prune_unstructured(model, 0.7, ignored_layers=["lm_head"])  # a second step: ParametrizedConv1D still counts
    masks = {n: weight_mask(model.get_submodule(n)) for n in conv1d}
    assert all(bool((masks[n] <= first[n]).all()) for n in conv1d)  # narrowed in place: pruned stays pruned
    assert sum(int((m == 0).sum()) for m in masks.values()) == round(0.7 * sum(m.numel() for m in masks.values()))
    expected = model(input_ids=IDX).logits
    save_pruned(model, tmp_path / "gpt2.pt")
    fresh = load_pruned(tiny_gpt2().eval(), tmp_path / "gpt2.pt")  # clean keys: a plain model loads them
    torch.testing.assert_close(fresh(input_ids=IDX).logits, expected)
    assert make_pruning_permanent(model) == 8 and not masked_modules(model)
    torch.testing.assert_close(model(input_ids=IDX).logits, expected)
    assert int((layer.weight == 0).sum()) == int((masks["transformer.h.0.attn.c_attn"] == 0).sum())


def test_pruning_functional_unstructured_minimal_gpt_and_layer_scope():
    torch.manual_seed(0)
    model = MiniGPT()
    assert default_ignored_layers(model) == ["lm_head"]  # no inputs: the last layer registered, the tied head
    summary = prune_unstructured(model, 0.3, scope="layer")
    assert "lm_head" not in summary.layers and len(summary.layers) == 8
    for name in summary.layers:
        mask = weight_mask(model.get_submodule(name))
        assert int((mask == 0).sum()) == round(0.3 * mask.numel())
    _, loss = model(IDX, IDX)
    loss.backward()  # the loss computed inside forward trains through the masks
    assert model.transformer.h[0].attn.c_attn.parametrizations.weight.original.grad is not None


def test_pruning_functional_conv1d_counted_but_structured_refused():
    pytest.importorskip("transformers")
    pytest.importorskip("torch_pruning")
    model = tiny_gpt2().eval()
    names = [n for n, _ in mask_targets(model, [])]
    assert set(_conv1d_names(model)) <= set(names)
    macs = count_macs(model, {"input_ids": IDX})
    assert macs >= 2 * 16 * (32 * 96 + 32 * 32 + 32 * 128 + 128 * 32) * 2  # Conv1D MACs counted, (in, out) weight
    with pytest.raises(SpeedupConfigError, match="Conv1D"):
        prune_structured(model, {"input_ids": IDX}, 0.5)
