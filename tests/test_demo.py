"""The demo task: real digits, generated shapes, the small conv net."""

from __future__ import annotations

import pytest
import torch

from lightning_speedups import SpeedupConfigError
from lightning_speedups.demo import DemoClassifier, DemoMLP, DigitsDataModule, ShapesDataset, load_digits_tensors
from lightning_speedups.demo.data import DIGITS_MEAN, DIGITS_STD
from tests.helpers import quiet_trainer


def test_digits_datamodule_shapes_and_split():
    dm = DigitsDataModule(batch_size=64, seed=3)
    dm.setup("fit")
    x, y = next(iter(dm.train_dataloader()))
    assert x.shape == (64, 3, 32, 32) and x.dtype == torch.float32 and y.dtype == torch.long
    assert len(dm.train_set) + len(dm.val_set) == 1797
    dm2 = DigitsDataModule(batch_size=64, seed=3)
    dm2.setup("fit")
    assert torch.equal(dm.val_labels, dm2.val_labels)  # split fixed by seed


def test_digits_stats_constants_match_data():
    images, _ = load_digits_tensors(channels=1)
    x = images.double() / 255.0
    assert abs(x.mean().item() - DIGITS_MEAN) < 1e-3 and abs(x.std().item() - DIGITS_STD) < 1e-3


def test_digits_class_subset_relabels():
    dm = DigitsDataModule(classes=[5, 6, 7, 8, 9])
    dm.setup("fit")
    assert dm.num_classes == 5 and set(dm.train_labels.tolist()) == {0, 1, 2, 3, 4}


def test_shapes_dataset_deterministic_and_learnable():
    a = ShapesDataset(n=64, seed=7)
    b = ShapesDataset(n=64, seed=7)
    assert torch.equal(a.images, b.images) and a.images.shape == (64, 3, 32, 32)
    assert not torch.equal(a.images, ShapesDataset(n=64, seed=8).images)


def test_demo_models_forward_and_fit():
    model = DemoClassifier(width=8)
    assert model(model.example_input_array).shape == (1, 10)
    assert DemoMLP(hidden=(32,))(torch.zeros(2, 3, 32, 32)).shape == (2, 10)
    trainer = quiet_trainer(max_epochs=1, limit_train_batches=3, limit_val_batches=1)
    trainer.fit(model, DigitsDataModule(batch_size=16))
    assert "val_acc" in trainer.callback_metrics


def test_demo_misconfiguration():
    with pytest.raises(SpeedupConfigError, match=r"`batch_size`=0 is out of range. Allowed values: an integer >= 1"):
        DigitsDataModule(batch_size=0)
    with pytest.raises(SpeedupConfigError, match=r"`channels`=2 is not supported. Allowed values: 1, 3"):
        DigitsDataModule(channels=2)
    with pytest.raises(SpeedupConfigError, match=r"`classes`=\[1, 1\] is invalid"):
        DigitsDataModule(classes=[1, 1])
    with pytest.raises(SpeedupConfigError, match=r"`val_fraction`=1.5 is out of range"):
        DigitsDataModule(val_fraction=1.5)
    with pytest.raises(SpeedupConfigError, match=r"`width`=0 is out of range. Allowed values: an integer >= 1"):
        DemoClassifier(width=0)
    with pytest.raises(SpeedupConfigError, match=r"`num_classes`=1 is out of range. Allowed values: an integer >= 2"):
        DemoClassifier(num_classes=1)
    with pytest.raises(SpeedupConfigError, match=r"`n`=0 is out of range. Allowed values: an integer >= 1"):
        ShapesDataset(n=0)


def test_shapes_datamodule_noise():
    from lightning_speedups import SpeedupConfigError
    from lightning_speedups.demo import ShapesDataModule

    quiet = ShapesDataModule(n_train=64, n_val=16)
    noisy = ShapesDataModule(n_train=64, n_val=16, noise=0.6)
    quiet.setup("fit")
    noisy.setup("fit")
    assert torch.equal(quiet.train_labels, noisy.train_labels)  # same shapes, more pixel noise
    spread = [(dm.train_images.float() - quiet.train_images.float()).abs().mean().item() for dm in (quiet, noisy)]
    assert spread[0] == 0 and spread[1] > 20
    assert noisy.hparams.noise == 0.6
    with pytest.raises(SpeedupConfigError, match=r"`noise`=-0.1 is out of range.*HINT: the pixel noise"):
        ShapesDataModule(noise=-0.1)
