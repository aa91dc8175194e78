"""Pruning models with attention: feed-forward-only structured pruning, attention-safe masks, transactions, bounds."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lightning_speedups import SpeedupConfigError
from lightning_speedups.functional import prune_structured, prune_unstructured
from lightning_speedups.functional.pruning import make_pruning_permanent, masked_modules, weight_mask

pytest.importorskip("torch_pruning")


def _vit() -> nn.Module:
    from torchvision.models.vision_transformer import VisionTransformer

    return VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=32, mlp_dim=64)


def _bert() -> nn.Module:
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(
        vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, num_labels=2
    )
    return transformers.BertForSequenceClassification(config)


class Encoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        layer = nn.TransformerEncoderLayer(16, 2, 32, batch_first=True, dropout=0.0)
        self.enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.enc(x).mean(1))


def test_structured_vit_prunes_feed_forward_only():
    model = _vit().eval()
    x = torch.randn(2, 3, 32, 32)
    summary = prune_structured(model, x, 0.5)
    layer = model.encoder.layers[0]
    assert layer.mlp[0].out_features == 32 and layer.mlp[3].in_features == 32  # mlp_dim 64 -> 32
    assert layer.self_attention.embed_dim == 32 and model.hidden_dim == 32  # residual width and heads untouched
    assert set(summary.layers) == {f"encoder.layers.encoder_layer_{i}.mlp.0" for i in range(2)}
    assert model(x).shape == (2, 1000)


def test_structured_bert_keeps_heads_consistent():
    model = _bert().eval()
    ids = torch.randint(0, 100, (2, 12))
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    prune_structured(model, inputs, 0.4375)  # the amount that used to break the qkv reshape
    for layer in model.bert.encoder.layer:
        attn = layer.attention.self
        assert attn.query.out_features == attn.num_attention_heads * attn.attention_head_size == 32
        assert layer.intermediate.dense.out_features == 36  # 64 * (1 - 0.4375)
    assert model(**inputs).logits.shape == (2, 2)


def test_structured_refuses_attention_without_feed_forward():
    model = nn.Sequential(nn.Linear(4, 4))
    mha = nn.MultiheadAttention(4, 2, batch_first=True)

    class OnlyAttention(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.mha = mha
            self.head = model

        def forward(self, x):
            return self.head(self.mha(x, x, x)[0])

    net = OnlyAttention()
    with pytest.raises(SpeedupConfigError, match="has attention and no feed-forward block"):
        prune_structured(net, torch.randn(1, 3, 4), 0.5)


def test_structured_prune_is_transactional():
    class HardCoded(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(3, 16, 3, padding=1)
            self.fc = nn.Linear(16, 4)

        def forward(self, x):
            return self.fc(nn.functional.adaptive_avg_pool2d(self.conv(x), 1).view(-1, 16))

    model = HardCoded()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    params = [id(p) for p in model.parameters()]
    with pytest.raises(SpeedupConfigError, match="forward fails .* shape '\\[-1, 16\\]' is invalid.*unchanged"):
        prune_structured(model, torch.zeros(1, 3, 8, 8), 0.5)
    assert [id(p) for p in model.parameters()] == params and model.conv.out_channels == 16
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert model(torch.zeros(2, 3, 8, 8)).shape == (2, 4)


def test_structured_graph_budget_refuses_before_memory_runs_out():
    from torchvision.models import resnet18

    model = resnet18(num_classes=4)
    with pytest.raises(SpeedupConfigError, match="`max_graph_indices`=1,000 was exceeded.*unchanged"):
        prune_structured(model, torch.zeros(1, 3, 32, 32), 0.5, max_graph_indices=1000)
    assert model.conv1.out_channels == 64
    with pytest.raises(SpeedupConfigError, match="`max_graph_indices`=0 is out of range"):
        prune_structured(model, torch.zeros(1, 3, 32, 32), 0.5, max_graph_indices=0)


def test_structured_small_swin_stays_bounded():
    from torchvision.models.swin_transformer import SwinTransformer

    model = SwinTransformer(patch_size=[4, 4], embed_dim=16, depths=[1, 1], num_heads=[2, 2], window_size=[4, 4])
    x = torch.randn(1, 3, 32, 32)
    summary = prune_structured(model.eval(), x, 0.5)
    assert summary.params_after < summary.params_before
    assert model(x).shape == (1, 1000)


@pytest.mark.parametrize("build", [Encoder, _vit], ids=["TransformerEncoder", "torchvision-vit"])
def test_mask_pruning_attention_trains_and_reads_masked_weights(build):
    model = build()
    x = torch.randn(2, 5, 16) if build is Encoder else torch.randn(2, 3, 32, 32)
    prune_unstructured(model, 0.5)
    out_proj = [m for m in model.modules() if isinstance(m, nn.MultiheadAttention)][0].out_proj
    assert weight_mask(out_proj) is not None
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):  # the second backward used to fail: MHA read a stale masked weight from the last graph
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()
    assert bool((out_proj.weight[weight_mask(out_proj) == 0] == 0).all())  # what MHA reads is masked
    names = set(masked_modules(model))
    assert make_pruning_permanent(model) == len(names)
    assert not masked_modules(model) and not any("parametrizations" in k for k in model.state_dict())
