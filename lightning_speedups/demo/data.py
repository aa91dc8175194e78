"""Data for the demo task: scikit-learn's digits (real, 1797 images) and procedurally drawn shapes."""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset, TensorDataset
from torchvision.transforms import v2

from lightning_speedups._errors import SpeedupConfigError, check_choice, check_int, check_range

__all__ = ["DigitsDataModule", "ShapesDataModule", "ShapesDataset", "load_digits_tensors", "DIGITS_MEAN", "DIGITS_STD"]

# exact statistics of the 32x32 upscaled digits (all 1797 images), used by the Normalize transform
DIGITS_MEAN = 0.3053
DIGITS_STD = 0.3235


@lru_cache(maxsize=1)
def _digits_uint8() -> tuple[torch.Tensor, torch.Tensor]:
    try:
        from sklearn.datasets import load_digits
    except ImportError as err:  # pragma: no cover - exercised only without the extra
        raise ImportError("The digits demo needs scikit-learn: pip install 'lightning-speedups[demo]'") from err
    bunch = load_digits()
    images = torch.from_numpy(bunch.images).float()  # (N, 8, 8) in [0, 16]
    images = (images * (255.0 / 16.0)).round().clamp(0, 255).to(torch.uint8).unsqueeze(1)
    return images, torch.from_numpy(bunch.target).long()


def load_digits_tensors(
    size: int = 32, channels: int = 3, classes: Sequence[int] | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """All digits as uint8 images ``(N, channels, size, size)`` and labels, optionally only some classes.

    Labels of a class subset are re-numbered ``0..len(classes)-1`` in the order given.
    """
    images, labels = _digits_uint8()
    if classes is not None:
        keep = torch.isin(labels, torch.tensor(list(classes)))
        images = images[keep]
        labels = labels[keep]
        remap = {c: i for i, c in enumerate(classes)}
        labels = torch.tensor([remap[int(y)] for y in labels], dtype=torch.long)
    if size != 8:
        images = torch.nn.functional.interpolate(
            images.float(), size=(size, size), mode="bilinear", align_corners=False
        )
        images = images.round().clamp(0, 255).to(torch.uint8)
    return images.expand(-1, channels, -1, -1).contiguous(), labels


class _TransformDataset(Dataset):
    """Per-sample transforms over uint8 image tensors: the plain data path most Lightning users write."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, transform: v2.Transform) -> None:
        self.images = images
        self.labels = labels
        self.transform = transform

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, idx: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.transform(self.images[idx]), self.labels[idx]


def _split(n: int, val_fraction: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    n_val = int(round(n * val_fraction))
    return perm[n_val:], perm[:n_val]


class DigitsDataModule(L.LightningDataModule):
    """scikit-learn's 8x8 handwritten digits, upscaled to 32x32, with per-sample torchvision v2 transforms.

    This is the *plain* baseline data path that the data-pipeline techniques beat.

    Args:
        batch_size: training batch size (the batch-size finder tunes this attribute).
        size: image side after upscaling.
        channels: 1 for grayscale, 3 to repeat it (CIFAR-shaped, fits torchvision models).
        classes: keep only these digits, re-labelled ``0..k-1`` (e.g. ``[0, 1, 2, 3, 4]`` to pretrain).
        val_fraction: share held out for validation, fixed by ``seed``.
        augment: random crop (padding 2) on training images.
        num_workers: DataLoader workers.
        seed: fixes the train/val split.

    Example::

        >>> dm = DigitsDataModule(batch_size=64)
        >>> dm.setup("fit")
        >>> x, y = next(iter(dm.train_dataloader()))
        >>> tuple(x.shape)
        (64, 3, 32, 32)
    """

    def __init__(
        self,
        batch_size: int = 32,
        size: int = 32,
        channels: int = 3,
        classes: Sequence[int] | None = None,
        val_fraction: float = 0.2,
        augment: bool = True,
        num_workers: int = 0,
        seed: int = 0,
    ) -> None:
        super().__init__()
        check_int("batch_size", batch_size, 1)
        check_choice("channels", channels, (1, 3))
        check_range("val_fraction", val_fraction, 0.0, 1.0, low_inclusive=False, high_inclusive=False)
        if classes is not None:
            bad = [c for c in classes if c not in range(10)]
            if bad or len(set(classes)) != len(classes) or len(classes) < 2:
                raise SpeedupConfigError(
                    f"`classes`={list(classes)!r} is invalid. Allowed values: at least two distinct digits in 0..9."
                )
        self.save_hyperparameters()
        self.batch_size = batch_size
        self.size = size
        self.channels = channels
        self.augment = augment
        self.classes = list(classes) if classes is not None else None
        self.num_classes = len(self.classes) if self.classes is not None else 10
        self.val_fraction = val_fraction
        self.num_workers = num_workers
        self.seed = seed

    def transforms(self, train: bool) -> v2.Transform:
        """The per-sample transform pipeline (uint8 CHW tensor in, normalised float tensor out)."""
        steps: list[v2.Transform] = []
        if train and self.augment:
            steps.append(v2.RandomCrop(self.size, padding=2))
        steps += [
            v2.ToDtype(torch.float32, scale=True),
            v2.Normalize([DIGITS_MEAN] * self.channels, [DIGITS_STD] * self.channels),
        ]
        return v2.Compose(steps)

    def setup(self, stage: str | None = None) -> None:
        images, labels = load_digits_tensors(self.size, self.channels, self.classes)
        train_idx, val_idx = _split(len(labels), self.val_fraction, self.seed)
        self.train_images = images[train_idx]
        self.train_labels = labels[train_idx]
        self.val_images = images[val_idx]
        self.val_labels = labels[val_idx]
        self.train_set = _TransformDataset(self.train_images, self.train_labels, self.transforms(train=True))
        self.val_set = _TransformDataset(self.val_images, self.val_labels, self.transforms(train=False))

    def _loader(self, dataset: Dataset, shuffle: bool, batch_size: int) -> DataLoader:
        return DataLoader(
            dataset,
            batch_size=batch_size,
            shuffle=shuffle,
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
        )

    def train_dataloader(self) -> DataLoader:
        return self._loader(self.train_set, shuffle=True, batch_size=self.batch_size)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.val_set, shuffle=False, batch_size=max(self.batch_size, 256))

    def test_dataloader(self) -> DataLoader:
        return self.val_dataloader()


def _draw_shapes(n: int, size: int, seed: int, noise: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw ``n`` images of 10 shape classes with random colour, position, scale and noise (vectorised)."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 10, (n,), generator=g)
    coords = torch.linspace(-1.0, 1.0, size)
    yy, xx = torch.meshgrid(coords, coords, indexing="ij")
    cx = (torch.rand(n, 1, 1, generator=g) - 0.5) * 0.6
    cy = (torch.rand(n, 1, 1, generator=g) - 0.5) * 0.6
    r = 0.35 + 0.3 * torch.rand(n, 1, 1, generator=g)
    x = (xx - cx) / r
    y = (yy - cy) / r
    d = torch.sqrt(x**2 + y**2)
    masks = torch.stack(
        [
            d < 1.0,  # disc
            (x.abs() < 0.8) & (y.abs() < 0.8),  # square
            (y > -0.8) & (y < 0.8) & (x.abs() < (0.8 - y) / 2),  # triangle
            (x.abs() < 0.25) | (y.abs() < 0.25),  # cross
            torch.sin(y * 3 * math.pi) > 0.3,  # horizontal stripes
            torch.sin(x * 3 * math.pi) > 0.3,  # vertical stripes
            (x - y).abs() < 0.35,  # diagonal bar
            (d > 0.6) & (d < 1.0),  # ring
            (torch.sin(x * 2.5 * math.pi) > 0.5) & (torch.sin(y * 2.5 * math.pi) > 0.5),  # dot grid
            x + y > 0.0,  # half plane
        ],
        dim=1,
    ).float()  # (n, 10, size, size)
    mask = masks[torch.arange(n), labels].unsqueeze(1)
    fg = 0.5 + 0.5 * torch.rand(n, 3, 1, 1, generator=g)
    bg = 0.4 * torch.rand(n, 3, 1, 1, generator=g)
    img = bg + (fg - bg) * mask + noise * torch.randn(n, 3, size, size, generator=g)
    return (img.clamp(0, 1) * 255).round().to(torch.uint8), labels


class ShapesDataset(TensorDataset):
    """A generated, learnable, CIFAR-shaped data set: 3x32x32 uint8 images of 10 shape classes.

    Deterministic by ``seed``; any size (use it for throughput work where 1797 digits are too few).

    Example::

        >>> ds = ShapesDataset(n=100, seed=1)
        >>> image, label = ds[0]
        >>> tuple(image.shape), image.dtype
        ((3, 32, 32), torch.uint8)
    """

    def __init__(self, n: int = 4096, size: int = 32, seed: int = 0, noise: float = 0.08) -> None:
        check_int("n", n, 1)
        images, labels = _draw_shapes(n, size, seed, noise)
        super().__init__(images, labels)
        self.images = images
        self.labels = labels


class ShapesDataModule(L.LightningDataModule):
    """The generated shapes with per-sample torchvision transforms (pad-4 random crop + flip), like CIFAR training.

    ``noise`` is the standard deviation of the Gaussian pixel noise (on the 0-1 scale): at the default 0.08 a small
    CNN is near 100% after one epoch; at 0.6 (the end-to-end bench's task) plain Adam took one to three epochs to 90%.
    """

    def __init__(
        self,
        n_train: int = 4096,
        n_val: int = 1024,
        batch_size: int = 64,
        num_workers: int = 0,
        seed: int = 0,
        noise: float = 0.08,
    ) -> None:
        super().__init__()
        check_int("batch_size", batch_size, 1)
        check_range("noise", noise, 0.0, None, hint="the pixel noise's standard deviation on the 0-1 scale, e.g. 0.08")
        self.save_hyperparameters()
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.n_train = n_train
        self.n_val = n_val
        self.seed = seed
        self.noise = float(noise)
        self.num_classes = 10

    def transforms(self, train: bool) -> v2.Transform:
        steps: list[v2.Transform] = [v2.RandomCrop(32, padding=4), v2.RandomHorizontalFlip()] if train else []
        steps += [v2.ToDtype(torch.float32, scale=True), v2.Normalize([0.5] * 3, [0.25] * 3)]
        return v2.Compose(steps)

    def setup(self, stage: str | None = None) -> None:
        drawn = (self.n_train, self.n_val, self.seed, self.noise)
        if getattr(self, "_drawn", None) == drawn:  # drawing is deterministic: a second setup() keeps the tensors
            return
        self._drawn = drawn
        train = ShapesDataset(self.n_train, seed=self.seed, noise=self.noise)
        val = ShapesDataset(self.n_val, seed=self.seed + 1, noise=self.noise)
        self.train_images = train.images
        self.train_labels = train.labels
        self.val_images = val.images
        self.val_labels = val.labels
        self.train_set = _TransformDataset(train.images, train.labels, self.transforms(True))
        self.val_set = _TransformDataset(val.images, val.labels, self.transforms(False))

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True, num_workers=self.num_workers)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=max(self.batch_size, 256), num_workers=self.num_workers)
