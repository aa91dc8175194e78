"""The ``Muon`` callback: a plain LightningModule's own optimizer and schedule, trained as the Muon hybrid."""

from __future__ import annotations

from typing import Any

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from lightning_speedups._errors import SpeedupConfigError
from lightning_speedups.callbacks.fast_schedule import FastSchedule
from lightning_speedups.callbacks.muon import Muon
from lightning_speedups.optim.muon import MuonWithAdamW
from tests.fsdp_cpu import CPUFSDPStrategy
from tests.helpers import RankReport, quiet_trainer
from tests.optim.test_muon import VOCAB, TinyGPT, _hybrid, _tokens


class PlainGPT(L.LightningModule):
    """A module as people write it: its own AdamW (two groups) and a OneCycle schedule, or SGD, or no schedule."""

    def __init__(self, optimizer: str = "adamw", schedule: str | None = "onecycle", steps: int = 8) -> None:
        super().__init__()
        self.model = TinyGPT()
        self.optimizer = optimizer
        self.schedule = schedule
        self.steps = steps

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        (idx,) = batch
        logits = self.model(idx[:, :-1])
        return F.cross_entropy(logits.reshape(-1, VOCAB), idx[:, 1:].reshape(-1))

    def configure_optimizers(self) -> Any:
        embeddings = [self.model.wte.weight, self.model.wpe.weight]
        rest = [p for p in self.parameters() if all(p is not e for e in embeddings)]
        groups = [{"params": embeddings, "lr": 1e-3}, {"params": rest}]
        if self.optimizer == "sgd":
            optimizer: torch.optim.Optimizer = torch.optim.SGD(groups, lr=0.1, momentum=0.9)
        else:
            optimizer = torch.optim.AdamW(groups, lr=3e-3, betas=(0.9, 0.95), weight_decay=0.1)
        if self.schedule is None:
            return optimizer
        sched = torch.optim.lr_scheduler.OneCycleLR(optimizer, [1e-3, 3e-3], total_steps=self.steps)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def _module(seed: int = 0, **kwargs: Any) -> PlainGPT:
    L.seed_everything(seed, verbose=False)
    return PlainGPT(**kwargs)


def test_muon_callback_misconfiguration() -> None:
    with pytest.raises(SpeedupConfigError, match=r"`lr`=0 is out of range"):
        Muon(lr=0)
    with pytest.raises(SpeedupConfigError, match=r"`conv`='all' is not supported.*'adamw', 'muon'"):
        Muon(conv="all")
    with pytest.raises(SpeedupConfigError, match=r"`momentum`=1.5 is out of range"):
        Muon(momentum=1.5)
    with pytest.raises(SpeedupConfigError, match=r"`warmup_steps`=-2 is out of range"):
        Muon(warmup_steps=-2)
    trainer = quiet_trainer(max_steps=2, callbacks=[Muon()])
    with pytest.raises(SpeedupConfigError, match=r"`lr`=None keeps the learning rate of SGD, which is not Adam-type"):
        trainer.fit(_module(optimizer="sgd"), _tokens(16))
    assert trainer.global_step == 0

    class Manual(PlainGPT):
        def __init__(self) -> None:
            super().__init__()
            self.automatic_optimization = False

    with pytest.raises(SpeedupConfigError, match=r"`automatic_optimization`=False"):
        quiet_trainer(max_steps=2, callbacks=[Muon()]).fit(Manual(), _tokens(16))
    fsdp = quiet_trainer(max_steps=1, strategy=CPUFSDPStrategy(), callbacks=[Muon()])
    with pytest.raises(SpeedupConfigError, match=r"`strategy`=CPUFSDPStrategy is not supported by Muon"):
        Muon().setup(fsdp, _module(), "fit")


def test_muon_callback_keeps_the_modules_groups_and_schedule() -> None:
    lrs: list[list[float]] = []

    class Record(L.Callback):
        def on_train_batch_start(self, trainer: Any, *args: Any) -> None:
            lrs.append([g["lr"] for g in trainer.optimizers[0].param_groups])

    module = _module()
    trainer = quiet_trainer(max_steps=8, callbacks=[Muon(), Record()])
    trainer.fit(module, _tokens(64))
    (optimizer,) = trainer.optimizers
    assert isinstance(optimizer, MuonWithAdamW)
    assert optimizer.group_sources == [0, 1, 1]  # the embeddings' group stays whole; the other splits in two
    assert optimizer.defaults["betas"] == (0.9, 0.95)
    assert [g["use_muon"] for g in optimizer.param_groups] == [False, False, True]
    (config,) = trainer.lr_scheduler_configs
    assert config.scheduler.optimizer is optimizer
    # OneCycle drives all three groups: the split ones in step, at the peaks the module gave its two groups
    reference = torch.optim.SGD([{"params": [torch.zeros(1)]}, {"params": [torch.zeros(1)]}], lr=1.0)
    expected_sched = torch.optim.lr_scheduler.OneCycleLR(reference, [1e-3, 3e-3], total_steps=8)
    for got in lrs:
        want = [g["lr"] for g in reference.param_groups]
        assert got == pytest.approx([want[0], want[1], want[1]])
        reference.step()
        expected_sched.step()


def test_muon_callback_scales_an_sgd_modules_lr_and_fast_schedule_follows() -> None:
    module = _module(optimizer="sgd", schedule=None)
    trainer = quiet_trainer(max_steps=4, callbacks=[FastSchedule(warmup=0, peak_factor=1.0), Muon(lr=2e-3)])
    trainer.fit(module, _tokens(64))
    (optimizer,) = trainer.optimizers
    (config,) = trainer.lr_scheduler_configs
    assert config.scheduler.optimizer is optimizer
    # the module's ratio (1e-3 : 0.1) is kept and the base lr becomes 2e-3
    assert config.scheduler.base_lrs == pytest.approx([2e-5, 2e-3, 2e-3])


def test_muon_callback_resume_equals_uninterrupted(tmp_path) -> None:
    (batch,) = next(iter(_tokens(4)))
    data = DataLoader(TensorDataset(batch.repeat(16, 1)), batch_size=4)  # see test_muon_resume_mid_epoch...

    def fit(ckpt_path: str | None = None) -> PlainGPT:
        module = _module()
        every = ModelCheckpoint(dirpath=tmp_path, filename="{step}", every_n_train_steps=3, save_top_k=-1)
        trainer = quiet_trainer(max_steps=8, enable_checkpointing=True, callbacks=[Muon(), every])
        trainer.fit(module, data, ckpt_path=ckpt_path)
        return module

    full = fit()
    state = torch.load(tmp_path / "step=3.ckpt", weights_only=True)
    assert len(state["optimizer_states"][0]["param_groups"]) == 3  # the hybrid's state, restored into the hybrid
    resumed = fit(str(tmp_path / "step=3.ckpt"))
    for (key, a), b in zip(full.state_dict().items(), resumed.state_dict().values(), strict=True):
        torch.testing.assert_close(b, a, msg=key)


@pytest.mark.ddp
def test_muon_callback_ddp(tmp_path) -> None:
    callbacks = [Muon(), RankReport(tmp_path, hybrid=_hybrid)]
    trainer = quiet_trainer(max_steps=4, devices=2, strategy="ddp_spawn", callbacks=callbacks)
    trainer.fit(_module(steps=4), _tokens(64))
    reports = RankReport.read(tmp_path)
    assert all(r["hybrid"] for r in reports)
    assert reports[0]["checksum"] == pytest.approx(reports[1]["checksum"], rel=1e-9)
