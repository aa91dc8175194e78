"""Heads of decoder LMs and of models with no named head (issue 51): ``lm_head`` and the other common names, a head
tied to the token embedding, the last linear layer with the output's width, HF ``Conv1D`` as a linear layer, and the
refusal that lists the names tried."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn.utils import parametrize

from lightning_speedups._errors import SpeedupConfigError
from lightning_speedups._heads import HEAD_NAMES, Head, embedding_ties, find_heads, is_linear_like, shared_parameters
from lightning_speedups.functional.finetuning import backbone_roots, find_head, head_modules, layer_groups
from tests.lm_models import LMModule, MiniGPT, exec_classes, tiny_gpt2

IDX = torch.zeros(2, 16, dtype=torch.long)


def test_finetuning_head_names_cover_lm_and_classifier_heads():
    assert {"fc", "classifier", "heads", "head"} <= set(HEAD_NAMES)  # today's torchvision / timm names
    assert {"lm_head", "score", "qa_outputs", "output"} <= set(HEAD_NAMES)


@pytest.mark.parametrize("net", ["mini", "gpt2"])
def test_finetuning_finds_a_tied_lm_head(net):
    if net == "gpt2":
        pytest.importorskip("transformers")
    model = MiniGPT() if net == "mini" else tiny_gpt2()
    assert find_heads(model) == [Head("lm_head", "name", "transformer.wte")]
    assert embedding_ties(model) == {"lm_head": "transformer.wte"}
    assert find_head(model) == "lm_head" and head_modules(model) == ["lm_head"]
    assert backbone_roots(model) == ["transformer"]
    groups = layer_groups(model)
    assert groups[0] == ["transformer.wte"] and groups[-1] == ["transformer.h.1", "transformer.ln_f"]
    wrapped = LMModule(net)  # one level down, as in a LightningModule
    assert find_heads(wrapped) == [Head("model.lm_head", "name", "model.transformer.wte")]
    assert find_heads(wrapped, max_depth=0) == [Head("model.lm_head", "tied", "model.transformer.wte")]


def test_finetuning_heads_found_by_structure():
    class Tied(nn.Module):  # no head name: the linear layer sharing the embedding's weight
        def __init__(self) -> None:
            super().__init__()
            self.tok = nn.Embedding(50, 8)
            self.body = nn.Linear(8, 8)
            self.proj = nn.Linear(8, 50, bias=False)
            self.proj.weight = self.tok.weight

    assert find_heads(Tied()) == [Head("proj", "tied", "tok")]
    assert [[n for n, _ in h] for h in shared_parameters(Tied())] == [["tok", "proj"]]
    gpt = exec_classes()["ExecGPT"]()  # untied head named `out`: only a forward tells which layer gives the width
    assert find_heads(gpt) == []
    assert find_heads(gpt, example_inputs=IDX) == [Head("out", "width", None)]
    assert find_head(gpt, example_inputs=(IDX,)) == "out"
    assert head_modules(gpt, example_inputs=IDX) == ["out"]


def test_finetuning_no_head_inside_repeated_blocks():
    pytest.importorskip("transformers")
    from transformers import BertConfig, BertModel

    cfg = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32)
    bare = BertModel(cfg)  # `encoder.layer.i.output` are blocks' layers, not heads; no head at all
    assert find_heads(bare, max_depth=None) == []
    blocks = nn.Sequential(nn.ModuleDict({"output": nn.Linear(4, 4)}), nn.ModuleDict({"output": nn.Linear(4, 4)}))
    assert find_heads(nn.ModuleDict({"blocks": blocks}), max_depth=None) == []


def test_finetuning_conv1d_is_a_linear_layer():
    pytest.importorskip("transformers")
    from transformers.pytorch_utils import Conv1D

    layer = Conv1D(6, 4)
    assert is_linear_like(layer) and not is_linear_like(nn.Conv1d(4, 6, 1))
    parametrize.register_parametrization(layer, "weight", nn.Identity())  # class becomes ParametrizedConv1D
    assert type(layer).__name__ != "Conv1D" and is_linear_like(layer)


def test_finetuning_refusal_lists_the_names_tried():
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    with pytest.raises(SpeedupConfigError) as err:
        find_head(model)
    msg = str(err.value)
    assert msg.startswith("`backbone`=None: could not find the output head of Sequential")
    assert all(repr(n) in msg for n in HEAD_NAMES) and "no linear layer shares its weight with an embedding" in msg
    assert "Allowed values:" in msg and "HINT: say what to freeze with FineTuneFreezing(backbone=...)" in msg
    with pytest.raises(SpeedupConfigError, match="nor a linear layer that gives the output's width"):
        find_head(model, example_inputs=torch.zeros(1, 3))  # a forward that fails: no width to read
    assert find_head(model, example_inputs=torch.zeros(1, 4)) == "2"
