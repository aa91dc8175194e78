from __future__ import annotations

from typing import Any

import lightning as L
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_speedups._errors import SpeedupConfigError
from lightning_speedups.callbacks.label_smoothing import LabelSmoothing
from lightning_speedups.demo import DemoClassifier
from tests.helpers import quiet_trainer


def _loader(n: int = 64) -> DataLoader:
    g = torch.Generator().manual_seed(0)
    ds = TensorDataset(torch.randn(n, 3, 32, 32, generator=g), torch.randint(0, 10, (n,), generator=g))
    return DataLoader(ds, batch_size=16)


class Recorder(DemoClassifier):
    """Records the smoothing its loss submodule holds in each step."""

    def __init__(self) -> None:
        super().__init__(width=4)
        self.seen: dict[str, list[float]] = {"train": [], "val": []}

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.seen["train"].append(self.loss_fn.label_smoothing)
        return super().training_step(batch, batch_idx)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.seen["val"].append(self.loss_fn.label_smoothing)
        super().validation_step(batch, batch_idx)


class FunctionalLoss(L.LightningModule):
    """A plain module calling F.cross_entropy with an attribute (saved in hparams)."""

    def __init__(self, label_smoothing: float = 0.0) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.layer = nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, 10))
        self.seen: list[float] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.seen.append(self.hparams.label_smoothing)
        x, y = batch
        return nn.functional.cross_entropy(self.layer(x), y, label_smoothing=self.hparams.label_smoothing)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


class NoHandle(FunctionalLoss):
    def __init__(self) -> None:
        L.LightningModule.__init__(self)
        self.layer = nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, 10))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return nn.functional.cross_entropy(self.layer(batch[0]), batch[1])


def test_label_smoothing_misconfiguration():
    with pytest.raises(SpeedupConfigError, match=r"`smoothing`=-0.1 is out of range.*a number in \[0.0, 1.0\)"):
        LabelSmoothing(-0.1)
    with pytest.raises(SpeedupConfigError, match=r"`attribute`='not a name' is not supported"):
        LabelSmoothing(0.1, attribute="not a name")
    trainer = quiet_trainer(max_steps=1, callbacks=[LabelSmoothing(0.1)])
    with pytest.raises(SpeedupConfigError, match=r"cannot reach the loss of `NoHandle`.*HINT: compute the loss"):
        trainer.fit(NoHandle(), _loader())
    assert trainer.global_step == 0


def test_label_smoothing_fit_train_only():
    model = Recorder()
    callbacks = [LabelSmoothing(0.1)]
    trainer = quiet_trainer(
        max_epochs=1, limit_val_batches=1, val_check_interval=2, num_sanity_val_steps=1, callbacks=callbacks
    )
    trainer.fit(model, _loader(), _loader(32))
    assert model.seen["train"] == [0.1] * 4
    assert model.seen["val"] and set(model.seen["val"]) == {0.0}  # sanity check + validation: plain loss
    assert model.loss_fn.label_smoothing == 0.0  # restored at the end of fit


def test_label_smoothing_hparams_attribute_not_saved(tmp_path):
    model = FunctionalLoss()
    trainer = quiet_trainer(max_steps=3, limit_val_batches=0, callbacks=[LabelSmoothing(0.2)])
    trainer.fit(model, _loader())
    assert model.seen == [0.2, 0.2, 0.2] and model.hparams.label_smoothing == 0.0
    trainer.save_checkpoint(tmp_path / "ls.ckpt")
    assert FunctionalLoss.load_from_checkpoint(tmp_path / "ls.ckpt").hparams.label_smoothing == 0.0


def test_label_smoothing_checkpoint_mid_fit_keeps_module_value(tmp_path):
    class Save(L.Callback):
        def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
            if trainer.global_step == 2:
                trainer.save_checkpoint(tmp_path / "mid.ckpt")

    trainer = quiet_trainer(max_steps=3, limit_val_batches=0, callbacks=[LabelSmoothing(0.2), Save()])
    trainer.fit(FunctionalLoss(), _loader())
    assert torch.load(tmp_path / "mid.ckpt", weights_only=False)["hyper_parameters"]["label_smoothing"] == 0.0


def test_label_smoothing_resume(tmp_path):
    def fit(epochs: int, ckpt_path: Any = None, save: Any = None) -> DemoClassifier:
        L.seed_everything(0, verbose=False)
        model = DemoClassifier(width=4)
        trainer = quiet_trainer(max_epochs=epochs, limit_val_batches=0, callbacks=[LabelSmoothing(0.1)])
        trainer.fit(model, _loader(32), ckpt_path=ckpt_path)
        if save:
            trainer.save_checkpoint(save)
        return model

    full = fit(2)
    fit(1, save=tmp_path / "half.ckpt")
    resumed = fit(2, ckpt_path=tmp_path / "half.ckpt")
    for (name, a), b in zip(full.named_parameters(), resumed.parameters()):
        torch.testing.assert_close(b, a, atol=1e-6, rtol=1e-5, msg=name)
    # smoothing changes the result: the run is not the plain one
    L.seed_everything(0, verbose=False)
    plain = DemoClassifier(width=4)
    quiet_trainer(max_epochs=2, limit_val_batches=0).fit(plain, _loader(32))
    assert not torch.allclose(plain.head.weight, full.head.weight)
