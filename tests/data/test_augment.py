"""BatchAugment: per-sample randomness, shapes/dtypes kept, determinism, exactness vs per-sample torchvision."""

from __future__ import annotations

import pytest
import torch
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as TF

from lightning_speedups._errors import SpeedupConfigError
from lightning_speedups.data import BatchAugment


def _images(n: int = 32, dtype: torch.dtype = torch.uint8, h: int = 12, w: int = 10) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    return torch.randint(0, 256, (n, 3, h, w), generator=g).to(dtype)


def test_batch_augment_misconfiguration():
    with pytest.raises(SpeedupConfigError, match="`padding`=-1 is out of range. Allowed values: an integer >= 0"):
        BatchAugment(padding=-1)
    with pytest.raises(SpeedupConfigError, match="`crop_size`=0 is invalid"):
        BatchAugment(crop_size=0)
    with pytest.raises(SpeedupConfigError, match="`padding_mode`='wrap' is not supported"):
        BatchAugment(padding_mode="wrap")
    with pytest.raises(SpeedupConfigError, match="`hflip`=1.5 is out of range"):
        BatchAugment(hflip=1.5)
    with pytest.raises(SpeedupConfigError, match="`backend`='cuda' is not supported"):
        BatchAugment(backend="cuda")
    with pytest.raises(SpeedupConfigError, match="must be given together"):
        BatchAugment(mean=[0.5])
    with pytest.raises(SpeedupConfigError, match="non-empty and of the same length"):
        BatchAugment(mean=[0.5, 0.5], std=[0.2])
    with pytest.raises(SpeedupConfigError, match="`std`=.* is out of range. Allowed values: numbers > 0"):
        BatchAugment(mean=[0.5], std=[0.0])
    with pytest.raises(SpeedupConfigError, match="`dtype`=torch.int64 is not supported. Allowed values: a floating"):
        BatchAugment(dtype=torch.int64)
    with pytest.raises(SpeedupConfigError, match="`generator`=.* is not supported.*None or a torch.Generator"):
        BatchAugment(generator=0)
    aug = BatchAugment(padding=2, hflip=0.5, mean=[0.5] * 3, std=[0.2] * 3)
    with pytest.raises(SpeedupConfigError, match=r"needs image batches of shape \(B, C, H, W\), got \(8, 10\)"):
        aug(torch.randn(8, 10))  # augmentations on non-image tensors
    with pytest.raises(SpeedupConfigError, match="needs real-valued images"):
        aug(torch.zeros(2, 3, 4, 4, dtype=torch.bool))
    with pytest.raises(SpeedupConfigError, match="`mean` has 3 values but the images have 2 channels"):
        aug(torch.rand(2, 2, 4, 4))
    with pytest.raises(SpeedupConfigError, match="larger than the padded image"):
        BatchAugment(crop_size=20, padding=2)(torch.rand(2, 3, 8, 8))
    with pytest.raises(SpeedupConfigError, match="must be smaller than the image side"):
        BatchAugment(padding=8, padding_mode="reflect")(torch.rand(2, 3, 8, 8))


@pytest.mark.parametrize("padding_mode", ["constant", "reflect", "replicate"])
@pytest.mark.parametrize("dtype", [torch.uint8, torch.float32])
def test_batch_augment_matches_per_sample_torchvision(padding_mode, dtype):
    x = _images(dtype=dtype)
    aug = BatchAugment(padding=3, crop_size=(9, 11), padding_mode=padding_mode, fill=7, hflip=0.5, seed=1)
    y = aug(x)
    assert y.shape == (32, 3, 9, 11) and y.dtype == dtype
    p = aug.last_params
    tv_mode = {"replicate": "edge"}.get(padding_mode, padding_mode)
    for b in range(len(x)):  # the reference: pad, crop and flip one sample at a time with torchvision
        ref = TF.pad(x[b], [3], fill=7, padding_mode=tv_mode)
        ref = TF.crop(ref, int(p["oy"][b]), int(p["ox"][b]), 9, 11)
        if p["flip"][b]:
            ref = TF.horizontal_flip(ref)
        assert torch.equal(y[b], ref), b


def test_batch_augment_per_sample_randomness():
    one = _images(1, h=16, w=16)
    x = one.expand(64, -1, -1, -1).contiguous()  # 64 copies of the same image
    flipped = BatchAugment(hflip=0.5, seed=0)(x)
    is_flipped = [torch.equal(f, one[0].flip(-1)) for f in flipped]
    assert 10 < sum(is_flipped) < 54  # not one coin for the whole batch
    assert all(torch.equal(f, one[0]) or flip for f, flip in zip(flipped, is_flipped))
    cropped = BatchAugment(padding=4, seed=0)(x)
    assert len({c.numpy().tobytes() for c in cropped}) > 20  # many different crops
    assert cropped.shape == x.shape and cropped.dtype == x.dtype


def test_batch_augment_deterministic():
    x = _images()
    kw = dict(padding=4, hflip=0.5, mean=[0.4, 0.5, 0.6], std=[0.2, 0.3, 0.25])
    a = BatchAugment(seed=3, **kw)
    b = BatchAugment(seed=3, **kw)
    c = BatchAugment(seed=4, **kw)
    first = [a(x), a(x)]
    assert torch.equal(first[0], b(x)) and torch.equal(first[1], b(x))
    assert not torch.equal(first[0], c(x))
    assert not torch.equal(first[0], first[1])  # the stream moves on per batch
    a.reset()
    assert torch.equal(a(x), first[0])
    g1 = torch.Generator().manual_seed(9)
    g2 = torch.Generator().manual_seed(9)
    assert torch.equal(BatchAugment(generator=g1, **kw)(x), BatchAugment(generator=g2, **kw)(x))
    torch.manual_seed(5)
    from_global = BatchAugment(**kw)(x)  # seed=None: torch's global RNG, as seeded by seed_everything
    torch.manual_seed(5)
    assert torch.equal(BatchAugment(**kw)(x), from_global)


@pytest.mark.parametrize("dtype", [torch.uint8, torch.float32])
def test_batch_augment_normalisation_matches_v2(dtype):
    x = _images(dtype=dtype) if dtype == torch.uint8 else torch.rand(32, 3, 12, 10)
    mean = [0.4, 0.5, 0.6]
    std = [0.2, 0.3, 0.25]
    y = BatchAugment(mean=mean, std=std)(x)
    ref = v2.Normalize(mean, std)(v2.ToDtype(torch.float32, scale=True)(x))
    assert y.dtype == torch.float32 and y.shape == x.shape
    torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-5)
    assert BatchAugment(mean=[0.5], std=[0.5], dtype=torch.float64)(x).dtype == torch.float64  # one value: all channels
    assert BatchAugment()(x) is x  # nothing asked: untouched


def test_batch_augment_kornia_backend():
    pytest.importorskip("kornia")
    x = _images(h=16, w=16)
    kw = dict(padding=4, hflip=0.5, backend="kornia")
    a = BatchAugment(seed=2, **kw)
    b = BatchAugment(seed=2, **kw)
    ya = a(x)
    assert ya.shape == x.shape and ya.dtype == x.dtype
    assert torch.equal(ya, b(x))  # deterministic with a seed
    assert not torch.equal(ya, a(x))
    one = x[:1].expand(64, -1, -1, -1).contiguous()
    assert len({c.numpy().tobytes() for c in BatchAugment(seed=0, **kw)(one)}) > 20  # per-sample randomness
    normed = BatchAugment(seed=0, mean=[0.5] * 3, std=[0.25] * 3, **kw)(x)
    assert normed.dtype == torch.float32


def test_batch_augment_seed_differs_per_ddp_rank(monkeypatch):
    x = _images()
    rank0 = BatchAugment(padding=4, hflip=0.5, seed=1)(x)
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_rank", lambda: 1)
    rank1 = BatchAugment(padding=4, hflip=0.5, seed=1)(x)
    assert not torch.equal(rank0, rank1)  # ranks crop differently
    assert torch.equal(rank1, BatchAugment(padding=4, hflip=0.5, seed=1)(x))  # and each rank is reproducible
