from __future__ import annotations

from typing import Any

import lightning as L
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset, default_collate

from lightning_speedups._errors import SpeedupConfigError
from lightning_speedups.callbacks.progressive_resizing import ProgressiveResizing
from lightning_speedups.demo import DemoClassifier, DemoMLP
from tests.helpers import quiet_trainer


def _loader(n: int = 64, batch_size: int = 8, tuples: bool = False) -> DataLoader:
    g = torch.Generator().manual_seed(0)
    ds = TensorDataset(torch.randn(n, 3, 32, 32, generator=g), torch.randint(0, 10, (n,), generator=g))
    collate = (lambda b: tuple(default_collate(b))) if tuples else None
    return DataLoader(ds, batch_size=batch_size, collate_fn=collate)


class Recorder(DemoClassifier):
    """Records the image side that training_step, validation_step and the backbone see."""

    def __init__(self) -> None:
        super().__init__(width=4)
        self.seen: dict[str, list[int]] = {"train": [], "val": []}

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.seen["train"].append(batch[0].shape[-1])
        x, y = batch
        return self.loss_fn(self.head(self.backbone(x)), y)  # a step that bypasses forward()

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.seen["val"].append(batch[0].shape[-1])
        super().validation_step(batch, batch_idx)


def test_progressive_resizing_misconfiguration():
    with pytest.raises(SpeedupConfigError, match=r"`initial_scale`=0 is out of range"):
        ProgressiveResizing(initial_scale=0)
    with pytest.raises(SpeedupConfigError, match=r"`finetune_fraction`=1.2 is out of range"):
        ProgressiveResizing(finetune_fraction=1.2)
    with pytest.raises(SpeedupConfigError, match=r"`delay_fraction`=0.9 \+ `finetune_fraction`=0.2 is out of range"):
        ProgressiveResizing(delay_fraction=0.9)
    with pytest.raises(SpeedupConfigError, match=r"`size_increment`=2.5 is not an integer \(a float\)"):
        ProgressiveResizing(size_increment=2.5)  # type: ignore[arg-type]
    with pytest.raises(SpeedupConfigError, match=r"`mode`='random' is not supported. Allowed values: 'resize', 'crop'"):
        ProgressiveResizing(mode="random")
    with pytest.raises(SpeedupConfigError, match=r"`interpolation`='linear' is not supported"):
        ProgressiveResizing(interpolation="linear")
    with pytest.raises(SpeedupConfigError, match=r"`total_steps`=0 is out of range. Allowed values: an integer >= 1"):
        ProgressiveResizing(total_steps=0)
    with pytest.raises(SpeedupConfigError, match=r"`seed`=-1 is out of range"):
        ProgressiveResizing(seed=-1)
    # a model with a fixed-size classifier cannot take small images: refused before the first step
    trainer = quiet_trainer(max_steps=2, limit_val_batches=0, callbacks=[ProgressiveResizing()])
    with pytest.raises(SpeedupConfigError, match=r"`DemoMLP` fails on \(16, 16\) inputs.*HINT: pool globally"):
        trainer.fit(DemoMLP(hidden=(8,)), _loader())
    assert trainer.global_step == 0
    trainer = quiet_trainer(max_epochs=-1, limit_val_batches=0, callbacks=[ProgressiveResizing()])
    with pytest.raises(SpeedupConfigError, match=r"needs the run length, but the Trainer is unbounded"):
        trainer.fit(DemoClassifier(width=4), _loader())


@pytest.mark.parametrize("tuples", [False, True])
def test_progressive_resizing_fit(tuples: bool):
    model = Recorder()
    cb = ProgressiveResizing(initial_scale=0.5, delay_fraction=0.5, finetune_fraction=0.25)
    trainer = quiet_trainer(max_steps=8, limit_val_batches=1, val_check_interval=4, callbacks=[cb])
    trainer.fit(model, _loader(tuples=tuples), _loader(16))
    # half size up to 50% of the steps, a ramp (step 5: progress 0.625 -> scale 0.75), full size for the last 25%
    assert model.seen["train"] == [16, 16, 16, 16, 16, 24, 32, 32]
    assert model.seen["val"] == [32, 32]  # validation at full size
    assert cb.sizes == {"16x16": 5, "24x24": 1, "32x32": 2}
    assert trainer.callback_metrics["resize_scale"] == 1.0
    assert "batch_to_device" not in vars(trainer.strategy)  # the hook is removed at teardown


def test_progressive_resizing_crop_and_accumulation():
    model = Recorder()
    cb = ProgressiveResizing(initial_scale=0.25, delay_fraction=0.5, finetune_fraction=0.5, mode="crop")
    trainer = quiet_trainer(max_steps=4, limit_val_batches=0, accumulate_grad_batches=2, callbacks=[cb])
    trainer.fit(model, _loader())
    assert model.seen["train"] == [8, 8, 8, 8, 32, 32, 32, 32]  # both micro-batches of a step share a size


def test_progressive_resizing_resume_saves_state_and_warns_on_new_length(tmp_path):
    def fit(epochs: int, ckpt_path: Any = None) -> ProgressiveResizing:
        L.seed_everything(0, verbose=False)
        cb = ProgressiveResizing(initial_scale=0.5)
        trainer = quiet_trainer(max_epochs=epochs, limit_val_batches=0, callbacks=[cb])
        trainer.fit(Recorder(), _loader(32), ckpt_path=ckpt_path)  # 4 batches an epoch
        if ckpt_path is None:
            trainer.save_checkpoint(tmp_path / "short.ckpt")
        return cb

    short = fit(1)
    state = torch.load(tmp_path / "short.ckpt", weights_only=False)["callbacks"]["ProgressiveResizing"]
    assert state["total_steps"] == 4 and state["sizes"] == short.sizes and sum(short.sizes.values()) == 4
    with pytest.warns(UserWarning, match=r"run had 4 steps, this one 12; the resizing schedule is stretched"):
        longer = fit(3, ckpt_path=tmp_path / "short.ckpt")
    assert sum(longer.sizes.values()) == 12  # the saved counts continue


def test_progressive_resizing_resume_same_run(tmp_path):
    class SaveAt(L.Callback):
        def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
            if trainer.current_epoch == 0:
                trainer.save_checkpoint(tmp_path / "epoch1.ckpt")

    def fit(ckpt_path: Any = None, stop_after: int | None = None) -> tuple[Recorder, ProgressiveResizing]:
        L.seed_everything(0, verbose=False)
        model = Recorder()
        cb = ProgressiveResizing(initial_scale=0.5, mode="crop", seed=3)
        extra = [SaveAt()] if stop_after else []
        trainer = quiet_trainer(max_epochs=3, limit_val_batches=0, callbacks=[cb, *extra])
        trainer.fit(model, _loader(32), ckpt_path=ckpt_path)  # 4 batches an epoch, 12 steps
        return model, cb

    full, full_cb = fit()
    fit(stop_after=1)
    resumed, resumed_cb = fit(ckpt_path=tmp_path / "epoch1.ckpt")
    assert full.seen["train"][4:] == resumed.seen["train"]  # the same sizes after the restart
    assert resumed_cb.sizes == full_cb.sizes
    for (name, a), b in zip(full.named_parameters(), resumed.parameters()):
        torch.testing.assert_close(b, a, atol=1e-6, rtol=1e-5, msg=name)


def test_progressive_resizing_plain_tensor_batches():
    class Bare(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 1))
            self.sides: list[int] = []

        def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
            self.sides.append(batch.shape[-1])
            return self.net(batch).mean()

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    model = Bare()
    quiet_trainer(max_steps=2, callbacks=[ProgressiveResizing(finetune_fraction=0.0, delay_fraction=1.0)]).fit(
        model, DataLoader(torch.randn(16, 3, 32, 32), batch_size=8)
    )
    assert model.sides == [16, 16]


def test_after_batch_to_device_hook_sees_train_and_val_batches():
    """The seam: Lightning's loops move every batch with strategy.batch_to_device and use what it returns."""
    from lightning_speedups._compat import after_batch_to_device

    trainer = quiet_trainer(max_steps=2, limit_val_batches=1, val_check_interval=2)
    model = Recorder()
    calls: list[bool] = []

    def hook(batch: Any, dataloader_idx: int) -> Any:
        calls.append(trainer.training)
        return [batch[0][..., :8, :8], batch[1]]

    class Install(L.Callback):
        def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
            after_batch_to_device(trainer.strategy, "test", hook)

    trainer.callbacks.append(Install())
    trainer.fit(model, _loader(), _loader())
    assert calls == [True, True, False], (
        "Lightning's loops no longer move batches with strategy.batch_to_device: update _compat.after_batch_to_device"
    )
    assert model.seen == {"train": [8, 8], "val": [8]}
    after_batch_to_device(trainer.strategy, "test", None)
    assert "batch_to_device" not in vars(trainer.strategy)  # the strategy's own method is back
