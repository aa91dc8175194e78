"""OptimizerKernel: a plain module's own optimizers run with torch's fused / foreach kernel, everything else kept."""

from __future__ import annotations

from typing import Any

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader, TensorDataset

from lightning_speedups._errors import SpeedupConfigError
from lightning_speedups.callbacks.optimizer_kernel import OptimizerKernel
from tests.callbacks.test_muon import PlainGPT, _module
from tests.fsdp_cpu import CPUFSDPStrategy
from tests.helpers import RankReport, quiet_trainer
from tests.optim.test_muon import _tokens


def _data() -> DataLoader:
    (batch,) = next(iter(_tokens(4)))
    return DataLoader(TensorDataset(batch.repeat(16, 1)), batch_size=4)


def _fit(callbacks: list[L.Callback], steps: int = 8, **kwargs: Any) -> tuple[PlainGPT, L.Trainer]:
    module = _module(steps=steps, **kwargs)
    trainer = quiet_trainer(max_steps=steps, callbacks=callbacks)
    trainer.fit(module, _data())
    return module, trainer


def test_misconfiguration() -> None:
    with pytest.raises(SpeedupConfigError, match=r"`implementation`='fast'.*'fused', 'foreach'"):
        OptimizerKernel("fast")
    trainer = quiet_trainer(max_steps=1, strategy=CPUFSDPStrategy(), callbacks=[OptimizerKernel()])
    with pytest.raises(SpeedupConfigError, match="not supported by OptimizerKernel"):
        trainer.fit(_module(), _data())


@pytest.mark.parametrize("implementation", ["fused", "foreach"])
def test_the_same_updates_with_the_kernel_groups_and_schedule_kept(implementation: str) -> None:
    # AdamW in two groups under a OneCycle schedule: the kernel changes how the update is computed, not what it is
    plain, _ = _fit([])
    kernel = OptimizerKernel(implementation)
    tuned, trainer = _fit([kernel])
    (opt,) = trainer.optimizers
    assert type(opt) is torch.optim.AdamW and kernel.replaced == ["AdamW"] and kernel.kept == []
    assert all(group[implementation] for group in opt.param_groups)
    assert [g["weight_decay"] for g in opt.param_groups] == [0.1, 0.1] and opt.defaults["betas"] == (0.9, 0.95)
    (config,) = trainer.lr_scheduler_configs
    assert config.scheduler.optimizer is opt and config.scheduler.last_epoch == 8  # it stepped the new optimizer
    # foreach computes each update exactly as the for-loop does; fused rounds differently (1e-7 on one step), which a
    # few weights whose gradient is about zero turn into a different sign of Adam's step (at most the lr, 3e-3)
    tolerance = {"rtol": 0.0, "atol": 5e-3} if implementation == "fused" else {"rtol": 0.0, "atol": 0.0}
    for (key, a), b in zip(plain.state_dict().items(), tuned.state_dict().values(), strict=True):
        torch.testing.assert_close(b, a, msg=key, **tolerance)


def test_an_optimizer_with_no_such_kernel_is_kept_and_said() -> None:
    class Rprop(PlainGPT):
        def configure_optimizers(self) -> Any:
            return torch.optim.Rprop(self.parameters(), lr=1e-3)  # a foreach kernel, no fused one

    L.seed_everything(0, verbose=False)
    kernel = OptimizerKernel("fused")
    trainer = quiet_trainer(max_steps=2, callbacks=[kernel])
    module = Rprop()
    trainer.fit(module, _data())
    before = trainer.optimizers[0]
    assert type(before) is torch.optim.Rprop and kernel.kept == ["Rprop"] and kernel.replaced == []
    assert kernel.to_text() == "Rprop kept: no fused kernel for it here"


def test_resume_mid_fit_equals_uninterrupted(tmp_path) -> None:
    def fit(ckpt_path: str | None = None) -> PlainGPT:
        module = _module()
        every = ModelCheckpoint(dirpath=tmp_path, filename="{step}", every_n_train_steps=3, save_top_k=-1)
        trainer = quiet_trainer(max_steps=8, enable_checkpointing=True, callbacks=[OptimizerKernel(), every])
        trainer.fit(module, _data(), ckpt_path=ckpt_path)
        assert all(g["fused"] for g in trainer.optimizers[0].param_groups)
        return module

    full = fit()
    state = torch.load(tmp_path / "step=3.ckpt", weights_only=True)
    assert state["optimizer_states"][0]["param_groups"][0]["fused"] is True
    resumed = fit(str(tmp_path / "step=3.ckpt"))
    for (key, a), b in zip(full.state_dict().items(), resumed.state_dict().values(), strict=True):
        torch.testing.assert_close(b, a, msg=key)


def _fused(trainer: L.Trainer) -> bool:
    return all(group["fused"] for group in trainer.optimizers[0].param_groups)


@pytest.mark.ddp
def test_ddp(tmp_path) -> None:
    callbacks = [OptimizerKernel(), RankReport(tmp_path, fused=_fused)]
    trainer = quiet_trainer(max_steps=4, devices=2, strategy="ddp_spawn", callbacks=callbacks)
    trainer.fit(_module(steps=4), _tokens(64))
    reports = RankReport.read(tmp_path)
    assert all(r["fused"] for r in reports)
    assert reports[0]["checksum"] == pytest.approx(reports[1]["checksum"], rel=1e-9)
