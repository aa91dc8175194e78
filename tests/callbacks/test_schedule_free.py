"""ScheduleFreeSwitch: a user's own schedule-free optimizer switched at the right hooks, checkpoints, resume, DDP."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_speedups import ScheduleFreeSwitch, SpeedupConfigError, SpeedupMixin
from lightning_speedups.optim import OptimizerConfig, in_train_mode
from tests.fsdp_cpu import CPUFSDPStrategy
from tests.helpers import quiet_trainer

schedulefree = pytest.importorskip("schedulefree")  # the optional extra (in `dev`)


def _data(n: int = 16, repeat: bool = False) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 4, generator=g)
    y = torch.randint(0, 2, (n,), generator=g)
    if repeat:  # one batch repeated: a mid-epoch resume (which restarts a plain loader) sees the same batches
        x = x[:4].repeat(n // 4, 1)
        y = y[:4].repeat(n // 4)
    return TensorDataset(x, y)


def _net(bn: bool) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), *([nn.BatchNorm1d(8)] if bn else []), nn.ReLU(), nn.Linear(8, 2))


class UserModule(L.LightningModule):
    """A plain LightningModule whose ``configure_optimizers`` builds ``schedulefree.AdamWScheduleFree`` itself."""

    def __init__(self, bn: bool = False, scheduler: bool = False) -> None:
        super().__init__()
        self.net = _net(bn)
        self.scheduler = scheduler
        self.val_seen: list[tuple[bool, torch.Tensor]] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.cross_entropy(self(x), y)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.val_seen.append((in_train_mode(self.trainer.optimizers[0]), self.net[0].weight.detach().clone()))

    def configure_optimizers(self) -> Any:
        opt = schedulefree.AdamWScheduleFree(self.parameters(), lr=0.05, warmup_steps=2)
        if self.scheduler:
            return [opt], [torch.optim.lr_scheduler.StepLR(opt, 1)]
        return opt


class MixinModule(SpeedupMixin, UserModule):
    def __init__(self, bn: bool = False) -> None:
        config = OptimizerConfig("schedule_free_adamw", lr=0.05, kwargs={"warmup_steps": 2})
        super().__init__(bn, optimizer_config=config)


def _fit(
    model: L.LightningModule, callbacks: list[Any], data: TensorDataset | None = None, ckpt_path: Any = None, **kw: Any
) -> L.Trainer:
    data = data if data is not None else _data()
    kw.setdefault("max_epochs", 2)
    trainer = quiet_trainer(callbacks=callbacks, **kw)
    trainer.fit(model, DataLoader(data, batch_size=4), DataLoader(data, batch_size=len(data)), ckpt_path=ckpt_path)
    return trainer


class _Expect(L.Callback):
    """After each training step: the eval weights ``x = lerp(y, z, 1 - 1/beta1)`` the optimizer state implies."""

    def __init__(self) -> None:
        self.x: dict[int, dict[str, torch.Tensor]] = {}

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        opt = trainer.optimizers[0]
        beta1 = opt.param_groups[0]["betas"][0]
        self.x[trainer.global_step] = {
            k: p.detach().lerp(opt.state[p]["z"], 1 - 1 / beta1) for k, p in pl_module.named_parameters()
        }


# ------------------------------------------------------------------------------------------------------ refusals
def test_schedule_free_switch_misconfiguration() -> None:
    with pytest.raises(SpeedupConfigError, match=r"`bn_batches`=-1 is out of range. Allowed values: an integer >= 0"):
        ScheduleFreeSwitch(bn_batches=-1)
    with pytest.raises(SpeedupConfigError, match=r"`bn_batches`=1.5 is not an integer \(a float\)"):
        ScheduleFreeSwitch(bn_batches=1.5)  # type: ignore[arg-type]
    with pytest.raises(SpeedupConfigError, match=r"`strategy`=CPUFSDPStrategy is not supported by ScheduleFreeSwitch"):
        ScheduleFreeSwitch().setup(SimpleNamespace(strategy=CPUFSDPStrategy()), None, "fit")  # type: ignore[arg-type]
    model = UserModule(scheduler=True)
    trainer = quiet_trainer(max_steps=2, callbacks=[ScheduleFreeSwitch()])
    with pytest.raises(SpeedupConfigError, match=r"`lr_scheduler`=StepLR steps the schedule-free optimizer AdamWSc"):
        trainer.fit(model, DataLoader(_data(), batch_size=4))
    assert trainer.global_step == 0


def test_warns_when_there_is_nothing_to_switch_or_weights_only_checkpoints(tmp_path: Any) -> None:
    class Plain(UserModule):
        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    with pytest.warns(UserWarning, match=r"no optimizer of the trainer has schedule-free train\(\)/eval\(\)"):
        _fit(Plain(), [ScheduleFreeSwitch()], max_epochs=1)
    saver = ModelCheckpoint(tmp_path, save_weights_only=True)
    with pytest.warns(UserWarning, match=r"saves weights only.*hold the train weights"):
        _fit(UserModule(), [ScheduleFreeSwitch(), saver], max_epochs=1, enable_checkpointing=True)


# ------------------------------------------------------------------------------------------------------ fit
def test_schedule_free_switch_fit_on_a_user_optimizer() -> None:
    with pytest.raises(Exception, match="not in train mode"):  # why the callback exists: Lightning never calls train()
        _fit(UserModule(), [])
    model = UserModule()
    trainer = _fit(model, [ScheduleFreeSwitch()])
    # the README's loop on the same data: train() before the steps, eval() before evaluating
    net = _net(bn=False)
    opt = schedulefree.AdamWScheduleFree(net.parameters(), lr=0.05, warmup_steps=2)
    expected = []
    for _ in range(2):
        opt.train()
        for x, y in DataLoader(_data(), batch_size=4):
            opt.zero_grad()
            nn.functional.cross_entropy(net(x), y).backward()
            opt.step()
        opt.eval()
        expected.append(net[0].weight.detach().clone())
    assert [mode for mode, _ in model.val_seen] == [False, False]
    for (_, seen), want in zip(model.val_seen, expected, strict=True):
        torch.testing.assert_close(seen, want)
    assert not in_train_mode(trainer.optimizers[0])  # the fit ends on the average
    for a, b in zip(model.net.parameters(), net.parameters(), strict=True):
        torch.testing.assert_close(a, b)


def _fit_saving(model: L.LightningModule, callbacks: list[Any], root: Any, ckpt_path: Any = None) -> L.Trainer:
    """7 steps on one repeated batch (4 an epoch: step 3 is mid-epoch), validation each epoch, a checkpoint every 3."""
    saver = ModelCheckpoint(root, "{step}", every_n_train_steps=3, save_top_k=-1)
    return _fit(
        model,
        [*callbacks, saver],
        _data(repeat=True),
        ckpt_path,
        max_epochs=None,
        max_steps=7,
        enable_checkpointing=True,
    )


def test_schedule_free_switch_resume(tmp_path: Any) -> None:
    expect = _Expect()
    full = UserModule(bn=True)
    _fit_saving(full, [ScheduleFreeSwitch(bn_batches=2), expect], tmp_path / "full")
    ckpt = torch.load(tmp_path / "full" / "step=3.ckpt", weights_only=True)
    assert not any(g["train_mode"] for g in ckpt["optimizer_states"][0]["param_groups"])
    for key, want in expect.x[3].items():
        torch.testing.assert_close(ckpt["state_dict"][key], want)
    resumed = UserModule(bn=True)
    _fit_saving(resumed, [ScheduleFreeSwitch(bn_batches=2)], tmp_path / "resumed", tmp_path / "full" / "step=3.ckpt")
    for (key, a), b in zip(full.state_dict().items(), resumed.state_dict().values(), strict=True):
        torch.testing.assert_close(b, a, rtol=0, atol=0, msg=key)


def test_mixin_and_callback_together_switch_once(tmp_path: Any) -> None:
    alone = MixinModule(bn=True)
    both = MixinModule(bn=True)
    _fit_saving(alone, [], tmp_path / "alone")
    _fit_saving(both, [ScheduleFreeSwitch()], tmp_path / "both")
    for (key, a), b in zip(alone.state_dict().items(), both.state_dict().values(), strict=True):
        torch.testing.assert_close(b, a, rtol=0, atol=0, msg=key)  # a second switch would have moved the weights
    for name in ("step=3.ckpt", "step=6.ckpt"):
        a, b = (torch.load(tmp_path / d / name, weights_only=True) for d in ("alone", "both"))
        for key, value in a["state_dict"].items():
            torch.testing.assert_close(b["state_dict"][key], value, rtol=0, atol=0, msg=key)
        assert a["optimizer_states"][0]["param_groups"] == b["optimizer_states"][0]["param_groups"]


# ------------------------------------------------------------------------------------------------------ DDP
class _ReportRank(L.Callback):
    def __init__(self, path: Any) -> None:
        self.path = path
        self.bn: list[list[float]] = []

    def on_validation_epoch_start(self, trainer: L.Trainer, pl_module: Any) -> None:
        assert not in_train_mode(trainer.optimizers[0])
        self.bn.append(pl_module.net[1].running_mean.tolist())

    def on_fit_end(self, trainer: L.Trainer, pl_module: Any) -> None:
        report = {
            "bn": self.bn,
            "train_mode": in_train_mode(trainer.optimizers[0]),
            "weights": [p.detach().double().sum().item() for p in pl_module.parameters()],
        }
        (self.path / f"rank{trainer.global_rank}.json").write_text(json.dumps(report))


@pytest.mark.ddp
def test_schedule_free_switch_ddp(tmp_path: Any) -> None:
    model = UserModule(bn=True)
    _fit(
        model,
        [ScheduleFreeSwitch(bn_batches=2), _ReportRank(tmp_path)],
        _data(32),
        max_epochs=2,
        devices=2,
        strategy="ddp_spawn",
    )
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2))
    assert not r0["train_mode"] and not r1["train_mode"]  # both end on the average
    assert len(r0["bn"]) == 2
    # refreshed on each rank's own batches, then averaged: the ranks agree
    torch.testing.assert_close(torch.tensor(r0["bn"]), torch.tensor(r1["bn"]))
    assert r0["weights"] == pytest.approx(r1["weights"])
    # the main process gets rank 0's final (eval) weights
    assert [p.detach().double().sum().item() for p in model.parameters()] == pytest.approx(r0["weights"])
