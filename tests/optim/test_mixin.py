"""SpeedupMixin inside Lightning: resume, checkpoints with configs in hparams, LightningCLI YAML, lr scaling."""

from __future__ import annotations

import glob

import lightning as L
import pytest
import torch

from lightning_speedups.demo import DemoClassifier
from lightning_speedups.optim import OptimizerConfig, SchedulerConfig, SpeedupMixin
from tests.helpers import quiet_trainer
from tests.optim._data import LRRecorder, TinyData


class _Crash(L.Callback):
    """Save a checkpoint at the end of epoch 1, then "crash" at the start of epoch 2."""

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.current_epoch == 0:
            trainer.save_checkpoint("crash.ckpt")

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.current_epoch == 1:
            raise RuntimeError("simulated crash")


def _model() -> DemoClassifier:
    return DemoClassifier(
        width=4,
        optimizer_config=OptimizerConfig("sgd", lr=0.05, weight_decay=1e-3, lr_multipliers={"head": 0.5}),
        scheduler_config=SchedulerConfig("onecycle"),
    )


def test_optim_resume() -> None:
    L.seed_everything(0)
    full = _model()
    rec_full = LRRecorder()
    quiet_trainer(max_epochs=2, limit_val_batches=1, callbacks=[rec_full]).fit(full, TinyData(3))

    L.seed_everything(0)
    crashed = _model()
    with pytest.raises(RuntimeError, match="simulated crash"):
        quiet_trainer(max_epochs=2, limit_val_batches=1, callbacks=[_Crash()]).fit(crashed, TinyData(3))
    resumed = _model()
    rec = LRRecorder()
    trainer = quiet_trainer(max_epochs=2, limit_val_batches=1, callbacks=[rec])
    trainer.fit(resumed, TinyData(3), ckpt_path="crash.ckpt")
    # same lr at the same step (epoch 2 + the final lr), and the same weights as the uninterrupted run
    assert rec.lrs == rec_full.lrs[3:]
    for (name, a), b in zip(full.state_dict().items(), resumed.state_dict().values()):
        torch.testing.assert_close(a, b, msg=name)
    sched = trainer.lr_scheduler_configs[0].scheduler
    assert sched.last_epoch == 6 and sched.total_steps == 6


def test_checkpoint_with_configs_in_hparams_loads(tmp_path) -> None:
    model = DemoClassifier(width=4, optimizer_config={"name": "adamw", "lr": 3e-3}, scheduler_config="cosine")
    trainer = quiet_trainer(max_steps=2, limit_val_batches=1)
    trainer.fit(model, TinyData(2))
    trainer.save_checkpoint("m.ckpt")
    loaded = DemoClassifier.load_from_checkpoint("m.ckpt")  # weights_only load: configs are safe globals
    assert loaded.optimizer_config == OptimizerConfig("adamw", lr=3e-3)
    assert loaded.scheduler_config == SchedulerConfig("cosine")
    model2 = DemoClassifier(width=4, optimizer_config=OptimizerConfig("sgd", lr=0.1, lr_multipliers={"head": 2.0}))
    trainer = quiet_trainer(max_steps=1, limit_val_batches=1)
    trainer.fit(model2, TinyData(2))
    trainer.save_checkpoint("m2.ckpt")
    assert DemoClassifier.load_from_checkpoint("m2.ckpt").optimizer_config.lr_multipliers == {"head": 2.0}


class _HParamsOnly(SpeedupMixin, L.LightningModule):
    """A user model that saves the configs as hparams without forwarding them to the mixin."""

    def __init__(self, optimizer_config: dict | None = None, scheduler_config: dict | None = None) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.layer = torch.nn.Linear(3, 2)


def test_configs_from_hparams_and_attributes() -> None:
    model = _HParamsOnly(optimizer_config={"name": "rmsprop", "lr": 0.02}, scheduler_config={"name": "exponential"})
    out = model.configure_optimizers()
    assert isinstance(out["optimizer"], torch.optim.RMSprop) and out["optimizer"].param_groups[0]["lr"] == 0.02
    assert out["lr_scheduler"]["interval"] == "epoch"
    model.optimizer_config = {"name": "sgd", "lr": 0.3}  # assigned later, as a dict
    model.scheduler_config = None
    opt = _HParamsOnly().configure_optimizers()
    assert isinstance(opt, torch.optim.Adam)  # the defaults


def test_lr_scaling_uses_datamodule_batch_size() -> None:
    cfg = OptimizerConfig("sgd", lr=0.1, lr_scaling="linear", base_batch_size=2)
    model = DemoClassifier(width=4, optimizer_config=cfg)
    trainer = quiet_trainer(max_steps=1, limit_val_batches=1, accumulate_grad_batches=2)
    trainer.fit(model, TinyData(2, batch_size=4))
    # batch 4 x 1 device x accumulation 2 = 8 = 4 x base
    assert trainer.optimizers[0].param_groups[0]["lr"] == pytest.approx(0.4)


def test_lightning_cli_yaml(tmp_path) -> None:
    from lightning.pytorch.cli import LightningCLI

    from lightning_speedups.demo import DigitsDataModule

    (tmp_path / "config.yaml").write_text(
        """
trainer:
  accelerator: cpu
  devices: 1
  fast_dev_run: true
  logger: false
  enable_progress_bar: false
  enable_model_summary: false
model:
  width: 4
  optimizer_config:
    name: sgd
    lr: 0.05
    momentum: 0.8
    weight_decay: 0.0005
    lr_multipliers: {backbone: 0.1}
  scheduler_config:
    name: linear_warmup_cosine
    warmup: 0.5
data:
  batch_size: 16
  augment: false
"""
    )
    cli = LightningCLI(
        DemoClassifier, DigitsDataModule, args=["fit", "--config", "config.yaml"], save_config_callback=None
    )
    model = cli.model
    assert model.optimizer_config == OptimizerConfig(
        "sgd", lr=0.05, momentum=0.8, weight_decay=5e-4, lr_multipliers={"backbone": 0.1}
    )
    assert model.scheduler_config == SchedulerConfig("linear_warmup_cosine", warmup=0.5)
    opt = cli.trainer.optimizers[0]
    assert isinstance(opt, torch.optim.SGD) and cli.trainer.global_step == 1
    assert {g["name"] for g in opt.param_groups} == {"backbone", "backbone/no_decay", "default", "default/no_decay"}
    assert not glob.glob("**/*.ckpt", recursive=True)
