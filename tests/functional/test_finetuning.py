"""Functional fine-tuning helpers on plain modules (no Lightning), torchvision models built with weights=None."""

from __future__ import annotations

import os
import socket

import pytest
import torch
from torch import nn
from torchvision.models import mobilenet_v3_small, resnet18

from lightning_speedups._errors import SpeedupConfigError
from lightning_speedups.demo import DemoClassifier
from lightning_speedups.functional.finetuning import (
    backbone_roots,
    find_head,
    freeze,
    head_modules,
    layer_groups,
    load_pretrained,
    replace_head,
    resolve_module_names,
    unfreeze,
)


def test_finetuning_functional_freeze_unfreeze():
    net = resnet18(num_classes=5)
    out = freeze(net.layer1)
    assert out["params"] == 12 and out["norm_eval"] == 4
    assert not any(p.requires_grad for p in net.layer1.parameters())
    assert all(p.requires_grad for p in net.layer2.parameters())
    assert not net.layer1[0].bn1.training and net.layer2[0].bn1.training
    stats = net.layer1[0].bn1.running_mean.clone()
    net(torch.randn(2, 3, 32, 32)).sum().backward()
    assert torch.equal(stats, net.layer1[0].bn1.running_mean)  # eval mode: statistics untouched
    assert net.layer1[0].conv1.weight.grad is None and net.layer2[0].conv1.weight.grad is not None
    assert freeze(net.layer1)["params"] == 0  # idempotent: nothing left to freeze
    # train_bn keeps BN trainable and in train mode
    freeze(net.layer2, train_bn=True)
    assert net.layer2[0].bn1.weight.requires_grad and net.layer2[0].bn1.training
    assert not net.layer2[0].conv1.weight.requires_grad
    assert unfreeze(net.layer1)["params"] == 12
    assert all(p.requires_grad for p in net.layer1.parameters()) and net.layer1[0].bn1.training
    net.eval()
    freeze(net.layer3)
    unfreeze(net.layer3)
    assert not net.layer3[0].bn1.training  # follows the module's own (eval) mode


def test_finetuning_functional_head_and_groups():
    net = resnet18()
    assert find_head(net) == "fc"
    assert backbone_roots(net) == ["conv1", "bn1", "layer1", "layer2", "layer3", "layer4"]
    assert layer_groups(net) == [["conv1", "bn1"], ["layer1"], ["layer2"], ["layer3"], ["layer4"]]
    assert layer_groups(net, ["layer3", "layer4"]) == [["layer3"], ["layer4"]]
    mobile = mobilenet_v3_small()
    assert find_head(mobile) == "classifier"
    assert len(layer_groups(mobile)) == 13  # features is the single root: its 13 blocks are the groups
    demo = DemoClassifier(width=8)
    assert find_head(demo) == "head"
    assert layer_groups(demo) == [["backbone.0"], ["backbone.1"], ["backbone.3"], ["backbone.4"], ["backbone.6"]]

    class Wrapper(nn.Module):  # a LightningModule-style wrapper: the head is one level down
        def __init__(self) -> None:
            super().__init__()
            self.model = resnet18()
            self.token = nn.Parameter(torch.zeros(3))

    w = Wrapper()
    assert find_head(w) == "model.fc"
    assert backbone_roots(w)[0] == "model.conv1" and "model.fc" not in backbone_roots(w)


def test_finetuning_functional_replace_head():
    net = resnet18()
    net.eval()
    info = replace_head(net, 5)
    assert info == {"layer": "fc", "in_features": 512, "old_classes": 1000, "num_classes": 5}
    assert net(torch.randn(1, 3, 32, 32)).shape == (1, 5) and not net.fc.training
    mobile = mobilenet_v3_small()
    assert replace_head(mobile, 3)["layer"] == "classifier.3"
    assert mobile.classifier[3].out_features == 3


def test_finetuning_load_pretrained_local_file(tmp_path):
    src = resnet18(num_classes=7)
    with torch.no_grad():
        src.layer1[0].conv1.weight.add_(1.0)  # weights no fresh model has
    torch.save(src.state_dict(), tmp_path / "raw.pt")
    torch.save({"state_dict": src.state_dict(), "epoch": 3}, tmp_path / "wrapped.pt")
    for name in ("raw.pt", "wrapped.pt"):
        model = load_pretrained("resnet18", path=tmp_path / name, num_classes=5)
        assert torch.equal(model.layer1[0].conv1.weight, src.layer1[0].conv1.weight)
        assert model.fc.out_features == 5
    same = load_pretrained("resnet18", path=tmp_path / "raw.pt")
    assert torch.equal(same.fc.weight, src.fc.weight)  # no num_classes: the file's 7-class head is kept


def test_finetuning_load_pretrained_hub_cache_offline(tmp_path, monkeypatch):
    """Cached weights load without a network; missing ones fail fast with the cache path in the message."""
    from torchvision.models import ResNet18_Weights

    monkeypatch.setattr(torch.hub, "_hub_dir", str(tmp_path / "hub"))

    def no_network(*args, **kwargs):
        raise OSError("network is unreachable")

    monkeypatch.setattr(socket, "create_connection", no_network)
    with pytest.raises(SpeedupConfigError, match="not in the torch hub cache .*network is unreachable.*HINT"):
        load_pretrained("resnet18", weights="DEFAULT")
    with pytest.raises(SpeedupConfigError, match="downloading is disabled"):
        load_pretrained("resnet18", weights="IMAGENET1K_V1", download=False)
    # put a (random) file where torch hub caches ResNet18_Weights.IMAGENET1K_V1
    cached = os.path.join(str(tmp_path / "hub"), "checkpoints", os.path.basename(ResNet18_Weights.IMAGENET1K_V1.url))
    os.makedirs(os.path.dirname(cached))
    src = resnet18()
    torch.save(src.state_dict(), cached)
    model = load_pretrained("resnet18", weights=ResNet18_Weights.IMAGENET1K_V1, num_classes=4)
    assert torch.equal(model.conv1.weight, src.conv1.weight) and model.fc.out_features == 4


def test_finetuning_functional_misconfiguration(tmp_path):
    with pytest.raises(SpeedupConfigError, match="`arch`='resnet81' is not a torchvision.*Close matches: 'resnet18'"):
        load_pretrained("resnet81")
    with pytest.raises(SpeedupConfigError, match="`weights`='IMAGENET9K' is not available for `arch`='resnet18'"):
        load_pretrained("resnet18", weights="IMAGENET9K")
    with pytest.raises(SpeedupConfigError, match="`path`='.*missing.pt' does not exist"):
        load_pretrained("resnet18", path=tmp_path / "missing.pt")
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(SpeedupConfigError, match="could not be loaded as a state dict"):
        load_pretrained("resnet18", path=tmp_path / "junk.pt")
    torch.save(nn.Linear(2, 2).state_dict(), tmp_path / "other.pt")
    with pytest.raises(SpeedupConfigError, match="The weights do not fit `arch`='resnet18'"):
        load_pretrained("resnet18", path=tmp_path / "other.pt")
    torch.save([1, 2], tmp_path / "list.pt")
    with pytest.raises(SpeedupConfigError, match="The file holds a list, not a state dict"):
        load_pretrained("resnet18", path=tmp_path / "list.pt")
    with pytest.raises(SpeedupConfigError, match="`num_classes`=0 is out of range"):
        replace_head(resnet18(), 0)
    with pytest.raises(SpeedupConfigError, match="`head`='relu' \\(ReLU\\) holds no Linear"):
        replace_head(resnet18(), 3, head="relu")
    with pytest.raises(SpeedupConfigError, match="could not find the output head of Sequential"):
        find_head(nn.Sequential(nn.Linear(2, 2)))
    with pytest.raises(SpeedupConfigError, match="`backbone` names 'layer5'.*Close matches: 'layer4'"):
        resolve_module_names(resnet18(), ["layer5"], "backbone")


# ---- layer groups follow the blocks of common families (issue 12 item 8); tiny configs, random weights
def _tv_vit(num_layers: int = 3) -> nn.Module:
    from torchvision.models.vision_transformer import VisionTransformer

    return VisionTransformer(image_size=32, patch_size=8, num_layers=num_layers, num_heads=2, hidden_dim=32, mlp_dim=64)


def _swin() -> nn.Module:
    from torchvision.models.swin_transformer import SwinTransformer

    return SwinTransformer(patch_size=[4, 4], embed_dim=16, depths=[1, 1, 1], num_heads=[2, 2, 2], window_size=[4, 4])


def _bert(num_layers: int = 3) -> nn.Module:
    transformers = pytest.importorskip("transformers")
    cfg = transformers.BertConfig(
        vocab_size=100, hidden_size=32, num_hidden_layers=num_layers, num_attention_heads=2, intermediate_size=64
    )
    return transformers.BertForSequenceClassification(cfg)


def _timm(name: str, **kw) -> nn.Module:
    timm = pytest.importorskip("timm")
    return timm.create_model(name, pretrained=False, **kw)


def _regnet() -> nn.Module:
    from torchvision.models import regnet_y_400mf

    return regnet_y_400mf()


_VIT_LAYERS = [f"encoder.layers.encoder_layer_{i}" for i in range(3)]
FAMILIES = {  # builder, expected groups (input -> output)
    "tv_vit": (
        _tv_vit,
        [
            ["conv_proj", "class_token", "encoder.pos_embedding"],
            *[[n] for n in _VIT_LAYERS[:2]],
            [_VIT_LAYERS[2], "encoder.ln"],
        ],
    ),
    "tv_vit_1_layer": (
        lambda: _tv_vit(1),
        [["conv_proj", "class_token", "encoder.pos_embedding"], ["encoder.layers.encoder_layer_0", "encoder.ln"]],
    ),
    "swin": (_swin, [[f"features.{i}"] for i in range(5)] + [["features.5", "norm"]]),
    "bert": (_bert, [["bert.embeddings"]] + [[f"bert.encoder.layer.{i}"] for i in range(3)]),
    "timm_vit": (
        lambda: _timm("vit_tiny_patch16_224", img_size=32, patch_size=8, depth=3),
        [["patch_embed", "cls_token", "pos_embed"], ["blocks.0"], ["blocks.1"], ["blocks.2", "norm"]],
    ),
    "timm_efficientnet": (
        lambda: _timm("efficientnet_b0"),
        [["conv_stem", "bn1"]] + [[f"blocks.{i}"] for i in range(7)] + [["conv_head", "bn2"]],
    ),
    "timm_resnet": (lambda: _timm("resnet18"), [["conv1", "bn1"], ["layer1"], ["layer2"], ["layer3"], ["layer4"]]),
    "regnet": (_regnet, [["stem"]] + [[f"trunk_output.block{i}"] for i in range(1, 5)]),
}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_finetuning_layer_groups_follow_blocks(family):
    build, expected = FAMILIES[family]
    net = build()
    groups = layer_groups(net)
    assert groups == expected  # one group per block (+ the embedding / stem first), input -> output
    heads = head_modules(net)
    owned = [n for n, _ in net.named_parameters() if not any(n == h or n.startswith(h + ".") for h in heads)]
    in_group = [n for n in owned if any(n == m or n.startswith(m + ".") for g in groups for m in g)]
    assert in_group == owned  # every backbone parameter, loose tokens included, is in exactly one group
    assert all(sum(n == m or n.startswith(m + ".") for g in groups for m in g) == 1 for n in owned)


def test_finetuning_head_modules_and_wrapped_groups():
    bert = _bert()
    assert find_head(bert) == "classifier" and head_modules(bert) == ["classifier", "bert.pooler"]
    assert "bert.pooler" not in backbone_roots(bert)  # the pooler trains with the classifier

    class Wrapper(nn.Module):  # a LightningModule-style wrapper: `self.net = vit`
        def __init__(self) -> None:
            super().__init__()
            self.net = _tv_vit()

    groups = layer_groups(Wrapper())
    assert groups[0] == ["net.conv_proj", "net.class_token", "net.encoder.pos_embedding"] and len(groups) == 4
    # an explicit backbone: the same rule inside it; the ViT's top-level class token is outside `encoder`
    assert layer_groups(_tv_vit(), ["encoder"]) == [
        [_VIT_LAYERS[0], "encoder.pos_embedding"],
        [_VIT_LAYERS[1]],
        [_VIT_LAYERS[2], "encoder.ln"],
    ]
