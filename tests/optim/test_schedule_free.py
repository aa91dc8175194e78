"""Schedule-free AdamW / SGD: registry entries, config mapping, switching, BatchNorm refresh, and the mixin's hooks.

The reference for "validation sees the eval weights" is the plain loop the ``schedulefree`` README prescribes
(``optimizer.train()`` before the steps, ``optimizer.eval()`` before evaluating), run on the same data.
"""

from __future__ import annotations

import sys
from typing import Any

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

from lightning_speedups import SpeedupConfigError
from lightning_speedups.demo import DemoClassifier
from lightning_speedups.optim import (
    OptimizerConfig,
    SchedulerConfig,
    SpeedupMixin,
    create_optimizer,
    get_optimizer_info,
    in_train_mode,
    is_schedule_free,
    recompute_batchnorm,
    schedule_free_eval,
    schedule_free_train,
)
from lightning_speedups.optim.schedule_free import DEFAULT_WARMUP_STEPS, eval_weights_into_checkpoint
from tests.helpers import quiet_trainer

schedulefree = pytest.importorskip("schedulefree")  # the optional extra (in `dev`)

SF_NAMES = ("schedule_free_adamw", "schedule_free_sgd")


def _data(n: int = 16, repeat: bool = False) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 4, generator=g)
    y = torch.randint(0, 2, (n,), generator=g)
    if repeat:  # one batch of 4 repeated: a mid-epoch resume (which restarts a plain loader) sees the same batches
        x = x[:4].repeat(n // 4, 1)
        y = y[:4].repeat(n // 4)
    return TensorDataset(x, y)


class Net(SpeedupMixin, L.LightningModule):
    """A tiny MLP (optionally with BatchNorm) that records what its validation steps saw."""

    def __init__(self, bn: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        torch.manual_seed(0)
        mid: list[nn.Module] = [nn.BatchNorm1d(8)] if bn else []
        self.net = nn.Sequential(nn.Linear(4, 8), *mid, nn.ReLU(), nn.Linear(8, 2))
        self.val_seen: list[tuple[bool, torch.Tensor]] = []
        self.train_seen: list[bool] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.train_seen.append(in_train_mode(self.trainer.optimizers[0]))
        x, y = batch
        return nn.functional.cross_entropy(self(x), y)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.val_seen.append((in_train_mode(self.trainer.optimizers[0]), self.net[0].weight.detach().clone()))
        x, y = batch
        self.log("val_loss", nn.functional.cross_entropy(self(x), y))


def _sf(name: str = "schedule_free_adamw", **kwargs: Any) -> OptimizerConfig:
    return OptimizerConfig(name, lr=0.05, weight_decay=0.01, kwargs={"warmup_steps": 2, **kwargs})


def _fit(model: L.LightningModule, epochs: int = 2, data: Dataset | None = None, **kwargs: Any) -> L.Trainer:
    data = data if data is not None else _data()
    trainer = quiet_trainer(max_epochs=epochs, **kwargs)
    trainer.fit(model, DataLoader(data, batch_size=4), DataLoader(data, batch_size=len(data)))  # 1 val batch
    return trainer


# ------------------------------------------------------------------------------------------------------ registry
@pytest.mark.parametrize("name", SF_NAMES)
def test_registry_entries_map_the_config_fields(name: str) -> None:
    info = get_optimizer_info(name)
    assert info.schedule_free and not info.shardable and not info.nesterov
    model = nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8), nn.Linear(8, 2))
    field = {"betas": (0.95, 0.99), "eps": 1e-6} if name.endswith("adamw") else {"momentum": 0.8}
    cfg = OptimizerConfig(name, lr=0.1, weight_decay=0.01, lr_multipliers={"0": 0.5}, **field)
    opt = create_optimizer(model, cfg)
    assert is_schedule_free(opt) and in_train_mode(opt)  # ready to step
    groups = {g["name"]: g for g in opt.param_groups}
    assert set(groups) == {"0", "0/no_decay", "default", "default/no_decay"}
    assert groups["0"]["lr"] == pytest.approx(0.05) and groups["default"]["lr"] == pytest.approx(0.1)
    assert groups["0"]["lr_mult"] == 0.5 and groups["default/no_decay"]["weight_decay"] == 0.0
    assert groups["default"]["weight_decay"] == 0.01
    assert all(g["warmup_steps"] == DEFAULT_WARMUP_STEPS for g in opt.param_groups)
    for key, value in field.items():
        assert groups["default"][key] == value
    opt = create_optimizer(model, OptimizerConfig(name, implementation="for_loop", kwargs={"warmup_steps": 7}))
    assert all(not g["foreach"] and g["warmup_steps"] == 7 for g in opt.param_groups)


def test_schedule_free_misconfiguration(monkeypatch: pytest.MonkeyPatch) -> None:
    net = nn.Linear(4, 2)
    with pytest.raises(SpeedupConfigError, match=r"`betas`=\(0.9, 0.99\) is not an argument of optimizer 'schedule_f"):
        OptimizerConfig("schedule_free_sgd", betas=(0.9, 0.99))
    with pytest.raises(SpeedupConfigError, match=r"`momentum`=0.9 is not an argument of optimizer 'schedule_free_a"):
        OptimizerConfig("schedule_free_adamw", momentum=0.9)
    with pytest.raises(SpeedupConfigError, match=r"`nesterov`=True is only supported by 'sgd', not 'schedule_free"):
        OptimizerConfig("schedule_free_sgd", nesterov=True)
    with pytest.raises(SpeedupConfigError, match=r"Optimizer 'schedule_free_sgd' rejected its arguments .*'eps'"):
        create_optimizer(net, OptimizerConfig("schedule_free_sgd", eps=1e-6))
    with pytest.raises(SpeedupConfigError, match=r"`betas`=\(0.0, 0.999\) is out of range.*divide by zero"):
        create_optimizer(net, OptimizerConfig("schedule_free_adamw", betas=(0.0, 0.999)))
    with pytest.raises(SpeedupConfigError, match=r"`momentum`=0.0 is out of range. Allowed values: a number in \(0"):
        create_optimizer(net, OptimizerConfig("schedule_free_sgd", momentum=0.0))
    with pytest.raises(SpeedupConfigError, match=r"`warmup_steps`=-1 is out of range"):
        create_optimizer(net, OptimizerConfig("schedule_free_adamw", kwargs={"warmup_steps": -1}))
    with pytest.raises(SpeedupConfigError, match=r"`implementation`='fused' is not available for optimizer 'sched"):
        create_optimizer(net, OptimizerConfig("schedule_free_adamw", implementation="fused"))
    with pytest.raises(SpeedupConfigError, match=r"`scheduler_config`='cosine' is set beside the schedule-free opt"):
        Net(optimizer_config=OptimizerConfig("schedule_free_adamw"), scheduler_config=SchedulerConfig("cosine"))
    with pytest.raises(SpeedupConfigError, match=r"`bn_batches`=-1 is out of range"):
        schedule_free_eval([], bn_batches=-1)
    monkeypatch.setitem(sys.modules, "schedulefree", None)  # not installed
    with pytest.raises(SpeedupConfigError, match=r"`name`='schedule_free_sgd' needs the optional package `schedul"):
        create_optimizer(net, "schedule_free_sgd")
    with pytest.raises(SpeedupConfigError, match=r'pip install "lightning-speedups\[schedulefree\]"'):
        create_optimizer(net, "schedule_free_adamw")


def test_scheduler_from_hparams_is_refused_before_any_step() -> None:
    model = DemoClassifier(width=4, scheduler_config=SchedulerConfig("cosine"))
    model.optimizer_config = OptimizerConfig("schedule_free_sgd")  # assigned later: checked when the optimizer is built
    trainer = quiet_trainer(max_steps=1)
    with pytest.raises(SpeedupConfigError, match=r"`scheduler_config`='cosine' is set beside the schedule-free"):
        trainer.fit(model, DataLoader(TensorDataset(torch.randn(4, 3, 8, 8), torch.zeros(4).long()), batch_size=4))
    assert trainer.global_step == 0


# ------------------------------------------------------------------------------------------------------ functional
def test_switching_is_idempotent_and_skips_other_optimizers() -> None:
    net = nn.Linear(4, 2)
    opt = create_optimizer(net, _sf())
    plain = torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1)
    assert schedule_free_eval([plain, opt]).optimizers == 0  # no step yet: the flags flip, the weights stay
    assert not in_train_mode(opt) and schedule_free_train([opt, plain]).optimizers == 0
    net(torch.randn(3, 4)).sum().backward()
    opt.step()
    y = net.weight.detach().clone()
    z = opt.state[net.weight]["z"].clone()
    assert schedule_free_eval([opt]).optimizers == 1
    x = net.weight.detach().clone()
    torch.testing.assert_close(x, y.lerp(z, 1 - 1 / 0.9))  # the average: x = y + (1 - 1/beta1)(z - y)
    assert schedule_free_eval([opt]).optimizers == 0 and torch.equal(net.weight, x)  # a second eval is a no-op
    assert schedule_free_train([opt]).optimizers == 1
    torch.testing.assert_close(net.weight, y)
    assert schedule_free_train([opt]).optimizers == 0


def test_recompute_batchnorm_averages_the_batches_and_keeps_flags() -> None:
    net = nn.Sequential(nn.Linear(3, 3), nn.Dropout(0.5), nn.BatchNorm1d(3)).eval()
    batches = [(torch.randn(8, 3) * (i + 1) + i, torch.zeros(8)) for i in range(4)]
    assert recompute_batchnorm(net, batches, num_batches=3) == 3
    with torch.no_grad():
        h = [net[0](x) for x, _ in batches[:3]]
    torch.testing.assert_close(net[2].running_mean, torch.stack([a.mean(0) for a in h]).mean(0))
    torch.testing.assert_close(net[2].running_var, torch.stack([a.var(0) for a in h]).mean(0))
    assert not net.training and not net[2].training and net[2].momentum == 0.1
    before = net[2].running_mean.clone()
    with pytest.warns(UserWarning, match=r"not recomputed: no part of the batch runs through Sequential.forward"):
        assert recompute_batchnorm(net, [("not", "a tensor")]) == 0  # statistics kept
    assert torch.equal(net[2].running_mean, before)
    assert recompute_batchnorm(nn.Linear(3, 3), batches) == 0  # no BatchNorm: nothing to do


def test_eval_weights_into_checkpoint_function() -> None:
    net = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
    opt = create_optimizer(net, _sf())
    net(torch.randn(3, 4)).sum().backward()
    opt.step()
    y = {k: v.clone() for k, v in net.state_dict().items()}
    ckpt = {"state_dict": net.state_dict(), "optimizer_states": [opt.state_dict()]}
    assert eval_weights_into_checkpoint(net, [opt], ckpt) == 1
    assert in_train_mode(opt) and all(not g["train_mode"] for g in ckpt["optimizer_states"][0]["param_groups"])
    for key, value in net.state_dict().items():
        torch.testing.assert_close(value, y[key])  # training goes on at y
        z = opt.state[dict(net.named_parameters())[key]]["z"]
        torch.testing.assert_close(ckpt["state_dict"][key], y[key].lerp(z, 1 - 1 / 0.9))
    assert eval_weights_into_checkpoint(net, [opt], ckpt) == 0  # saved in eval mode already: left alone


# ------------------------------------------------------------------------------------------------------ mixin fit
def _reference(name: str, epochs: int) -> tuple[list[torch.Tensor], nn.Module]:
    """The README's loop: the first layer's eval weights after each epoch, and the final (eval-mode) network."""
    net = Net(optimizer_config=_sf(name)).net
    opt = create_optimizer(net, _sf(name))
    after_epoch = []
    for _ in range(epochs):
        opt.train()
        for x, y in DataLoader(_data(), batch_size=4):
            opt.zero_grad()
            nn.functional.cross_entropy(net(x), y).backward()
            opt.step()
        opt.eval()
        after_epoch.append(net[0].weight.detach().clone())
    return after_epoch, net


@pytest.mark.parametrize("name", SF_NAMES)
def test_mixin_validates_and_ends_on_the_eval_weights(name: str) -> None:
    model = Net(optimizer_config=_sf(name))
    trainer = _fit(model, epochs=2)
    expected, ref = _reference(name, epochs=2)
    assert [mode for mode, _ in model.val_seen] == [False, False] and all(model.train_seen)
    for (_, seen), want in zip(model.val_seen, expected, strict=True):
        torch.testing.assert_close(seen, want)
    assert not in_train_mode(trainer.optimizers[0])
    for a, b in zip(model.net.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(a, b)  # fit ends with the average


class _Expect(L.Callback):
    """Records, after each training step, the eval weights ``x = lerp(y, z, 1 - 1/beta1)`` and the train weights."""

    def __init__(self) -> None:
        self.x: dict[int, dict[str, torch.Tensor]] = {}
        self.y: dict[int, dict[str, torch.Tensor]] = {}

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        opt = trainer.optimizers[0]
        beta1 = opt.param_groups[0]["betas"][0]
        step = trainer.global_step
        named = dict(pl_module.named_parameters())
        self.y[step] = {k: p.detach().clone() for k, p in named.items()}
        self.x[step] = {k: p.detach().lerp(opt.state[p]["z"], 1 - 1 / beta1) for k, p in named.items()}


@pytest.mark.parametrize("weights_only", [False, True])
def test_mixin_checkpoint_holds_eval_weights_and_training_goes_on(tmp_path: Any, weights_only: bool) -> None:
    expect = _Expect()
    saver = ModelCheckpoint(tmp_path, "{step}", every_n_train_steps=2, save_top_k=-1, save_weights_only=weights_only)
    model = Net(optimizer_config=_sf())
    _fit(model, epochs=1, enable_checkpointing=True, callbacks=[expect, saver], limit_val_batches=0)
    ckpt = torch.load(tmp_path / "step=2.ckpt", weights_only=True)  # plain tensors and types only
    for key, want in expect.x[2].items():
        torch.testing.assert_close(ckpt["state_dict"][key], want)
        assert not torch.allclose(want, expect.y[2][key])  # the two points differ: the test can tell them apart
    if not weights_only:
        assert all(not g["train_mode"] for g in ckpt["optimizer_states"][0]["param_groups"])
    assert all(model.train_seen)  # the next steps ran in train mode ...
    uninterrupted = Net(optimizer_config=_sf())
    _fit(uninterrupted, epochs=1, limit_val_batches=0)
    for a, b in zip(model.parameters(), uninterrupted.parameters(), strict=True):
        torch.testing.assert_close(a, b)  # ... from the train weights (up to the eval/train round trip's rounding)


def test_mixin_resume_mid_epoch_equals_uninterrupted(tmp_path: Any) -> None:
    def fit(ckpt_path: Any = None) -> Net:
        model = Net(bn=True, optimizer_config=_sf("schedule_free_sgd"))
        saver = ModelCheckpoint(tmp_path, "{step}", every_n_train_steps=3, save_top_k=-1)
        trainer = quiet_trainer(max_steps=7, enable_checkpointing=True, callbacks=[saver])
        data = _data(repeat=True)  # 4 batches an epoch: step 3 is mid-epoch
        trainer.fit(model, DataLoader(data, batch_size=4), DataLoader(data, batch_size=4), ckpt_path=ckpt_path)
        return model

    full = fit()
    resumed = fit(tmp_path / "step=3.ckpt")
    for (key, a), b in zip(full.state_dict().items(), resumed.state_dict().values(), strict=True):
        torch.testing.assert_close(b, a, rtol=0, atol=0, msg=key)  # exactly: the resumed run replays the switches


class _BNCheck(L.Callback):
    """At validation, the BatchNorm statistics against those of the (one, repeated) training batch at these weights."""

    def __init__(self) -> None:
        self.errors: list[float] = []

    def on_validation_epoch_start(self, trainer: L.Trainer, pl_module: Any) -> None:
        x = _data(repeat=True).tensors[0][:4]
        h = pl_module.net[0](x)
        bn = pl_module.net[1]
        self.errors.append(float((bn.running_mean - h.mean(0)).abs().max() + (bn.running_var - h.var(0)).abs().max()))


@pytest.mark.parametrize("bn_batches", [3, 0])
def test_mixin_recomputes_batchnorm_at_the_eval_weights(bn_batches: int) -> None:
    model = Net(bn=True, optimizer_config=_sf("schedule_free_sgd"))
    model.schedule_free_bn_batches = bn_batches
    check = _BNCheck()
    _fit(model, epochs=2, data=_data(repeat=True), callbacks=[check])
    if bn_batches:
        assert max(check.errors) < 1e-5
    else:  # the statistics of the train point y, an EMA: not those of x
        assert min(check.errors) > 1e-3


class _Counting(Dataset):
    def __init__(self) -> None:
        self.data = _data()
        self.reads = 0

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> Any:
        self.reads += 1
        return self.data[i]


def test_no_batchnorm_no_extra_batches() -> None:
    data = _Counting()
    model = Net(optimizer_config=_sf())
    _fit(model, epochs=2, data=data)
    assert data.reads == 2 * 16 + 2 * 16  # the training epochs and the validation epochs, nothing more


def test_test_and_predict_use_the_eval_weights() -> None:
    model = Net(optimizer_config=_sf())
    trainer = _fit(model, epochs=1, limit_val_batches=0)
    opt = trainer.optimizers[0]
    x = model.net[0].weight.detach().clone()
    opt.train()  # as after an interrupted fit
    assert not torch.allclose(model.net[0].weight, x)
    trainer.predict(model, DataLoader(_data().tensors[0], batch_size=4))
    assert not in_train_mode(opt)
    torch.testing.assert_close(model.net[0].weight, x)


def test_plain_optimizer_is_left_alone() -> None:
    model = Net(optimizer_config=OptimizerConfig("adamw", lr=0.01), scheduler_config=SchedulerConfig("cosine"))
    trainer = _fit(model, epochs=1)
    assert not model._speedup_schedule_free and not is_schedule_free(trainer.optimizers[0])
    assert isinstance(create_optimizer(nn.Linear(2, 2), "schedule_free_sgd"), schedulefree.SGDScheduleFree)
