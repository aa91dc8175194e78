from __future__ import annotations

import pytest
import torch
from torch import nn

from lightning_speedups.demo import DemoClassifier, DemoMLP
from lightning_speedups.functional.channels_last import (
    apply_channels_last,
    count_conv2d,
    is_channels_last,
    to_channels_last,
    to_channels_last_,
)


def test_channels_last_functional():
    model = DemoClassifier(width=8).eval()
    x = torch.randn(4, 3, 32, 32)
    with torch.no_grad():
        before = model(x)
    params_before = {name: p for name, p in model.named_parameters()}
    conv_weights = [m.weight for m in model.modules() if isinstance(m, nn.Conv2d)]
    assert not any(is_channels_last(w) for w in conv_weights)

    summary = apply_channels_last(model)

    assert summary.converted and summary.num_conv == count_conv2d(model) == 5
    assert summary.num_tensors == 5  # the conv weights; BN and Linear tensors are not 4-D
    assert all(is_channels_last(w) for w in conv_weights)
    # same Parameter objects (an optimizer built earlier keeps working), same values
    assert all(p is params_before[name] for name, p in model.named_parameters())
    with torch.no_grad():
        after = model(to_channels_last(x))
    torch.testing.assert_close(after, before, atol=1e-5, rtol=1e-5)
    # idempotent
    assert apply_channels_last(model).num_tensors == 0


def test_channels_last_no_conv_warns_and_does_nothing():
    model = DemoMLP(hidden=(16,))
    state = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.warns(UserWarning, match="no 2-D convolution"):
        summary = apply_channels_last(model)
    assert not summary.converted and summary.num_conv == 0 and summary.num_tensors == 0
    for key, value in model.state_dict().items():
        assert torch.equal(value, state[key]) and value.is_contiguous()


def test_channels_last_leaves_5d_tensors_alone():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Conv3d(2, 2, 1))
    summary = apply_channels_last(model, warn=False)
    assert summary.num_tensors == 1
    assert is_channels_last(model[0].weight)
    assert model[1].weight.dim() == 5 and model[1].weight.is_contiguous()


def test_to_channels_last_collections():
    img = torch.randn(2, 3, 8, 8)
    lbl = torch.arange(2)
    mask = torch.zeros(2, 8, 8)
    out = to_channels_last({"image": img, "meta": (lbl, mask), "name": "x"})
    assert is_channels_last(out["image"]) and torch.equal(out["image"], img)
    assert out["meta"][0] is lbl and out["meta"][1] is mask and out["name"] == "x"
    assert not is_channels_last(img)  # out of place


def test_to_channels_last_in_place():
    img = torch.randn(2, 3, 8, 8)
    batch = [img, torch.arange(2)]
    assert to_channels_last_(batch) == 1
    assert is_channels_last(batch[0]) and torch.equal(batch[0], img)
    assert to_channels_last_(batch) == 0  # already converted

    nested = ({"x": torch.randn(2, 3, 4, 4)}, [torch.randn(1, 2, 3, 3)])
    assert to_channels_last_(nested) == 2
    assert is_channels_last(nested[0]["x"]) and is_channels_last(nested[1][0])

    frozen = (torch.randn(2, 3, 4, 4), torch.arange(2))  # a tuple cannot be changed in place
    assert to_channels_last_(frozen) == 0 and not is_channels_last(frozen[0])
