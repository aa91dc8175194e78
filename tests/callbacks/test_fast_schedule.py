from __future__ import annotations

from typing import Any

import lightning as L
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_speedups._errors import SpeedupConfigError
from lightning_speedups.callbacks.fast_schedule import FastSchedule
from lightning_speedups.demo import DemoClassifier
from lightning_speedups.optim import OptimizerConfig, SchedulerConfig
from tests.helpers import quiet_trainer


def _loader(n: int = 32, batch_size: int = 8) -> DataLoader:
    g = torch.Generator().manual_seed(0)
    ds = TensorDataset(torch.randn(n, 3, 32, 32, generator=g), torch.randint(0, 10, (n,), generator=g))
    return DataLoader(ds, batch_size=batch_size)


class LRs(L.Callback):
    def __init__(self) -> None:
        self.lrs: list[float] = []

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self.lrs.append(trainer.optimizers[0].param_groups[0]["lr"])


class Plain(L.LightningModule):
    """No SpeedupMixin: returns a bare optimizer, keeps `batch_size` as an attribute."""

    def __init__(self, manual: bool = False) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, 10))
        self.batch_size = 8
        self.automatic_optimization = not manual

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return nn.functional.cross_entropy(self.net(batch[0]), batch[1])

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=1e-3)


def test_fast_schedule_misconfiguration():
    with pytest.raises(SpeedupConfigError, match=r"`warmup`=-1 is out of range"):
        FastSchedule(warmup=-1)
    with pytest.raises(SpeedupConfigError, match=r"`peak_factor`=-2 is out of range"):
        FastSchedule(peak_factor=-2)
    with pytest.raises(SpeedupConfigError, match=r"`lr_scaling`='log' is not supported"):
        FastSchedule(lr_scaling="log")
    with pytest.raises(SpeedupConfigError, match=r"`decay`='exp' is not supported"):
        FastSchedule(decay="exp")
    with pytest.raises(SpeedupConfigError, match=r"`final_lr_ratio`=-0.5 is out of range"):
        FastSchedule(final_lr_ratio=-0.5)
    with pytest.raises(SpeedupConfigError, match=r"`base_batch_size`=0 is out of range.*an integer >= 1"):
        FastSchedule(base_batch_size=0)
    with pytest.raises(SpeedupConfigError, match=r"`total_steps`='10' is not an integer \(a str\)"):
        FastSchedule(total_steps="10")  # type: ignore[arg-type]
    model = DemoClassifier(width=4, scheduler_config=SchedulerConfig("cosine"))
    trainer = quiet_trainer(max_steps=2, limit_val_batches=0, callbacks=[FastSchedule()])
    with pytest.raises(SpeedupConfigError, match=r"already returns one \(CosineAnnealingLR\).*scheduler_config=None"):
        trainer.fit(model, _loader())
    assert trainer.global_step == 0
    trainer = quiet_trainer(max_steps=2, limit_val_batches=0, callbacks=[FastSchedule()])
    with pytest.raises(SpeedupConfigError, match=r"needs automatic optimization"):
        trainer.fit(Plain(manual=True), _loader())
    trainer = quiet_trainer(max_epochs=-1, limit_val_batches=0, callbacks=[FastSchedule()])
    with pytest.raises(SpeedupConfigError, match=r"the Trainer is unbounded"):
        trainer.fit(Plain(), _loader())
    model = DemoClassifier(width=4)
    trainer = quiet_trainer(max_steps=2, limit_val_batches=0, callbacks=[FastSchedule(base_batch_size=32)])
    with pytest.raises(SpeedupConfigError, match=r"`base_batch_size`=32 needs the run's batch size.*batch_size=\.\.\."):
        trainer.fit(model, _loader())


def test_fast_schedule_fit_plain_module_with_batch_scaling():
    rec = LRs()
    cb = FastSchedule(warmup=2, peak_factor=2.0, base_batch_size=2, lr_scaling="sqrt")
    trainer = quiet_trainer(max_steps=8, limit_val_batches=0, accumulate_grad_batches=2, callbacks=[cb, rec])
    trainer.fit(Plain(), _loader(64))
    peak = 1e-3 * 2.0 * (16 / 2) ** 0.5  # effective batch 8 x 2 accumulation vs 2
    assert cb.peak_lrs == [[pytest.approx(peak)]]
    per_step = rec.lrs[::2]  # one lr per optimizer step
    assert per_step[:3] == pytest.approx([peak / 3, 2 * peak / 3, peak])
    assert per_step[-1] == pytest.approx(peak / 6)
    assert trainer.lr_scheduler_configs[0].interval == "step"


def test_fast_schedule_fit_speedup_mixin_model():
    rec = LRs()
    model = DemoClassifier(width=4, optimizer_config=OptimizerConfig("sgd", lr=0.01, lr_multipliers={"head": 0.5}))
    quiet_trainer(max_steps=4, limit_val_batches=0, callbacks=[FastSchedule(warmup=0, peak_factor=3.0), rec]).fit(
        model, _loader()
    )
    assert rec.lrs == pytest.approx([0.03 * (1 - s / 4) for s in range(4)])


def _fit(
    epochs: int = 3,
    ckpt_path: Any = None,
    save_at_epoch: int | None = None,
    path: Any = None,
) -> tuple[DemoClassifier, LRs]:
    class SaveAt(L.Callback):
        def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
            if trainer.current_epoch + 1 == save_at_epoch:
                trainer.save_checkpoint(path)

    L.seed_everything(0, verbose=False)
    model = DemoClassifier(width=4)
    rec = LRs()
    callbacks = [FastSchedule(warmup=0.2), rec, *([SaveAt()] if save_at_epoch else [])]
    trainer = quiet_trainer(max_epochs=epochs, limit_val_batches=0, callbacks=callbacks)
    trainer.fit(model, _loader(), ckpt_path=ckpt_path)  # 4 batches an epoch
    return model, rec


def test_fast_schedule_resume(tmp_path):
    full, full_lrs = _fit(3)
    _fit(3, save_at_epoch=1, path=tmp_path / "epoch1.ckpt")
    resumed, resumed_lrs = _fit(3, ckpt_path=tmp_path / "epoch1.ckpt")
    assert resumed_lrs.lrs == pytest.approx(full_lrs.lrs[4:])
    for (name, a), b in zip(full.named_parameters(), resumed.parameters()):
        torch.testing.assert_close(b, a, atol=1e-6, rtol=1e-5, msg=name)


def test_fast_schedule_resume_longer_run_stretches(tmp_path):
    _fit(1, save_at_epoch=1, path=tmp_path / "short.ckpt")  # a 4-step schedule, ended at lr 0
    with pytest.warns(UserWarning, match=r"schedule spans 4 steps, this run 12; the decay is stretched"):
        _, rec = _fit(3, ckpt_path=tmp_path / "short.ckpt")
    peak = 3 * 1e-3
    assert rec.lrs[0] == pytest.approx(peak * (1 - (4 - 1) / (12 - 1)))  # warm-up 1 step (of the short run)
    assert all(lr > 0 for lr in rec.lrs)
