from __future__ import annotations

import pytest
import torch

from lightning_speedups._errors import SpeedupConfigError
from lightning_speedups.functional.progressive_resizing import (
    progressive_scale,
    resize_batch,
    resize_images,
    scaled_side,
)


def test_progressive_resizing_functional():
    images = torch.rand(4, 3, 32, 24)
    labels = torch.arange(4)
    mask = torch.zeros(4, 1, 32, 24, dtype=torch.long)
    out = resize_batch({"x": images, "y": labels, "meta": [mask, "id"]}, 0.5)
    assert tuple(out["x"].shape) == (4, 3, 16, 12)
    assert out["y"] is labels and out["meta"][1] == "id"  # class labels and non-tensors pass through
    # a per-pixel target of the image's size follows it, by nearest neighbour, keeping its dtype
    assert out["meta"][0].shape == (4, 1, 16, 12) and out["meta"][0].dtype == torch.long
    # antialiased bilinear: a constant image stays constant, the mean is kept
    flat = resize_images(torch.full((1, 1, 8, 8), 0.25), (4, 4))
    torch.testing.assert_close(flat, torch.full((1, 1, 4, 4), 0.25))
    assert resize_batch(images, 1.0) is images


def test_progressive_resizing_crop_is_a_window():
    images = torch.arange(64.0).view(1, 1, 8, 8)
    g = torch.Generator().manual_seed(0)
    crop = resize_batch(images, 0.5, mode="crop", generator=g)
    assert tuple(crop.shape) == (1, 1, 4, 4)
    top, left = divmod(int(crop[0, 0, 0, 0]), 8)
    torch.testing.assert_close(crop, images[..., top : top + 4, left : left + 4])
    again = resize_batch(images, 0.5, mode="crop", generator=torch.Generator().manual_seed(0))
    assert torch.equal(crop, again)  # reproducible from the seed


def test_progressive_schedule_and_rounding():
    assert progressive_scale(0.2, 0.5, 0.2, 0.5) == 0.5
    assert progressive_scale(0.65, 0.5, 0.2, 0.5) == pytest.approx(0.75)
    assert progressive_scale(0.9, 0.5, 0.2, 0.5) == 1.0
    assert progressive_scale(0.5, 0.25, 0.5, 0.5) == 1.0  # no ramp: a step to full size
    assert progressive_scale(0.49, 0.25, 0.5, 0.5) == 0.25
    scales = [progressive_scale(p / 100) for p in range(101)]
    assert scales == sorted(scales)  # never shrinks again
    assert [scaled_side(32, s) for s in (0.5, 0.56, 0.62, 0.75, 0.9, 1.0)] == [16, 16, 20, 24, 28, 32]
    assert scaled_side(224, 0.5, 32) % 32 == 0 and scaled_side(10, 0.01, 4) == 4


def test_progressive_resizing_functional_misconfiguration():
    x = torch.rand(1, 3, 8, 8)
    with pytest.raises(SpeedupConfigError, match=r"`scale`=0 is out of range.*a number in \(0.0, 1.0\]"):
        resize_batch(x, 0)
    with pytest.raises(SpeedupConfigError, match=r"`mode`='zoom' is not supported. Allowed values: 'resize', 'crop'"):
        resize_batch(x, 0.5, mode="zoom")
    with pytest.raises(SpeedupConfigError, match=r"`interpolation`='lanczos' is not supported"):
        resize_batch(x, 0.5, interpolation="lanczos")
    with pytest.raises(SpeedupConfigError, match=r"`size_increment`=0 is out of range.*an integer >= 1"):
        resize_batch(x, 0.5, size_increment=0)
    with pytest.raises(SpeedupConfigError, match=r"`delay_fraction`=0.6 \+ `finetune_fraction`=0.5 is out of range"):
        progressive_scale(0.1, 0.5, 0.5, 0.6)
    with pytest.raises(SpeedupConfigError, match=r"`initial_scale`=1.5 is out of range"):
        progressive_scale(0.1, 1.5)
