"""compute_mean_std vs torch.mean/std on the whole set; to_tensors decoding."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset, TensorDataset
from torchvision.transforms import v2

from lightning_speedups._errors import SpeedupConfigError
from lightning_speedups.data import DeviceDataLoader, MeanStd, compute_mean_std, to_tensors
from lightning_speedups.demo import DigitsDataModule, load_digits_tensors
from lightning_speedups.demo.data import _TransformDataset


def _reference(x: torch.Tensor, correction: int) -> tuple[torch.Tensor, torch.Tensor]:
    flat = x.transpose(0, 1).reshape(x.shape[1], -1).double()
    if not x.dtype.is_floating_point:
        flat = flat / 255
    return flat.mean(1), flat.std(1, correction=correction)


class _ListDataset(Dataset):
    def __init__(self, items: list) -> None:
        self.items = items

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int):
        return self.items[i]


def test_compute_mean_std_misconfiguration():
    with pytest.raises(SpeedupConfigError, match="is empty"):
        compute_mean_std(torch.zeros(0, 3, 4, 4))
    with pytest.raises(SpeedupConfigError, match="is empty"):
        compute_mean_std(_ListDataset([]))
    with pytest.raises(SpeedupConfigError, match="is empty"):
        compute_mean_std([])
    with pytest.raises(SpeedupConfigError, match="`correction`=2 is not supported"):
        compute_mean_std(torch.rand(4, 3), correction=2)
    with pytest.raises(SpeedupConfigError, match="`batch_size`=0 is out of range. Allowed values: an integer >= 1"):
        compute_mean_std(torch.rand(4, 3), batch_size=0)
    with pytest.raises(SpeedupConfigError, match=r"needs batches of shape \(B, C, ...\)"):
        compute_mean_std(torch.rand(8))
    with pytest.raises(SpeedupConfigError, match="found batches with 3 and 2 channels"):
        compute_mean_std([torch.rand(2, 3, 4), torch.rand(2, 2, 4)])
    with pytest.raises(SpeedupConfigError, match="got dict batches"):
        compute_mean_std([{"x": torch.rand(2, 3)}])
    with pytest.raises(SpeedupConfigError, match="`correction`=1 needs more than 1"):
        compute_mean_std(torch.rand(1, 3))
    with pytest.raises(SpeedupConfigError, match="is not supported. Allowed values: a tensor"):
        compute_mean_std(42)


@pytest.mark.parametrize("correction", [0, 1])
@pytest.mark.parametrize("dtype", [torch.float32, torch.uint8])
def test_compute_mean_std_random_data(correction, dtype):
    g = torch.Generator().manual_seed(0)
    x = torch.rand(300, 3, 7, 5, generator=g) * torch.tensor([1.0, 4.0, 0.1]).view(1, 3, 1, 1) + 50.0
    if dtype == torch.uint8:
        x = torch.randint(0, 256, (300, 3, 7, 5), generator=g, dtype=torch.uint8)
    mean, std = _reference(x, correction)
    for source in (x, TensorDataset(x, torch.zeros(300)), DataLoader(TensorDataset(x), batch_size=37)):
        stats = compute_mean_std(source, correction=correction, batch_size=64)  # uneven batches: merges matter
        assert isinstance(stats, MeanStd)
        torch.testing.assert_close(torch.tensor(stats.mean, dtype=torch.float64), mean, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(torch.tensor(stats.std, dtype=torch.float64), std, rtol=1e-12, atol=1e-12)
    if correction == 1:  # population and unbiased really differ, as documented
        assert compute_mean_std(x, correction=0).std != compute_mean_std(x, correction=1).std


def test_compute_mean_std_digits():
    images, _ = load_digits_tensors(32, 3)
    mean, std = _reference(images, 1)
    dm = DigitsDataModule(augment=False)
    dm.setup("fit")
    raw = _ListDataset([img for img in images])  # a map-style dataset of (C, H, W) uint8 samples
    for source in (images, raw, DeviceDataLoader(images, batch_size=100)):
        stats = compute_mean_std(source)
        torch.testing.assert_close(torch.tensor(stats.mean, dtype=torch.float64), mean, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(torch.tensor(stats.std, dtype=torch.float64), std, rtol=1e-12, atol=1e-12)
    # feeds v2.Normalize: the standardised set has mean 0 and std 1 per channel
    normed = stats.normalize()(v2.ToDtype(torch.float32, scale=True)(images))
    torch.testing.assert_close(normed.mean((0, 2, 3)), torch.zeros(3), atol=1e-4, rtol=0)
    torch.testing.assert_close(normed.std((0, 2, 3)), torch.ones(3), atol=1e-4, rtol=0)
    assert isinstance(v2.Normalize(*stats), v2.Normalize)
    # a DataLoader of the demo's (deterministic, normalised) validation path: floats are not rescaled
    val = compute_mean_std(dm.val_dataloader(), correction=0)
    ref_mean, ref_std = _reference(torch.cat([b[0] for b in dm.val_dataloader()]), 0)
    torch.testing.assert_close(torch.tensor(val.mean, dtype=torch.float64), ref_mean, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(torch.tensor(val.std, dtype=torch.float64), ref_std, rtol=1e-10, atol=1e-10)


def test_to_tensors_misconfiguration():
    with pytest.raises(SpeedupConfigError, match="`dataset` is empty"):
        to_tensors(_ListDataset([]))
    with pytest.raises(SpeedupConfigError, match="not a map-style dataset"):
        to_tensors(iter([1, 2]))
    with pytest.raises(SpeedupConfigError, match="`batch_size`=0 is out of range. Allowed values: an integer >= 1"):
        to_tensors(_ListDataset([1]), batch_size=0)
    with pytest.raises(SpeedupConfigError, match="samples of different shapes"):
        to_tensors(_ListDataset([torch.zeros(3, 4), torch.zeros(3, 5)]))
    with pytest.raises(SpeedupConfigError, match="different shapes or field counts across batches"):
        to_tensors(_ListDataset([torch.zeros(3, 4), torch.zeros(3, 5)]), batch_size=1)
    with pytest.raises(SpeedupConfigError, match="same number of fields"):
        to_tensors(_ListDataset([(torch.zeros(2), 1), (torch.zeros(2),)]))
    with pytest.raises(SpeedupConfigError, match="cannot turn a sample field of type str"):
        to_tensors(_ListDataset(["a", "b"]))


def test_to_tensors_decodes_datasets(capsys):
    images, labels = load_digits_tensors(16, 3)
    images = images[:70]
    labels = labels[:70]
    deterministic = v2.Compose([v2.ToDtype(torch.float32, scale=True), v2.Normalize([0.3] * 3, [0.3] * 3)])
    ds = _TransformDataset(images, labels, deterministic)
    x, y = to_tensors(ds, batch_size=16)
    assert x.shape == (70, 3, 16, 16) and x.dtype == torch.float32 and torch.equal(y, labels)
    torch.testing.assert_close(x, torch.stack([deterministic(i) for i in images]))
    # PIL images (a torchvision dataset without ToTensor), numpy arrays and python numbers
    samples = [(Image.fromarray(i.permute(1, 2, 0).numpy()), int(t), np.float32(0.5)) for i, t in zip(images, labels)]
    pil = _ListDataset(samples)
    px, py, pz = to_tensors(pil, batch_size=32, progress=True, desc="decode-test")
    assert torch.equal(px, images) and torch.equal(py, labels) and pz.dtype == torch.float32
    assert "decode-test" in capsys.readouterr().err  # the progress bar
    tensors = to_tensors(TensorDataset(images, labels))  # already tensors: returned as they are
    assert tensors[0] is images
    loader = DeviceDataLoader(*to_tensors(ds), batch_size=32)
    assert len(loader) == 3
