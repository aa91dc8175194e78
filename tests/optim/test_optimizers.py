"""Optimizer registry: parameter groups, weight-decay split, lr multipliers, frozen parameters, fused choice."""

from __future__ import annotations

from types import SimpleNamespace
from unittest import mock

import pytest
import torch
from torch import nn

from lightning_speedups._errors import SpeedupConfigError
from lightning_speedups.demo import DemoClassifier
from lightning_speedups.optim import (
    OptimizerConfig,
    OptimizerInfo,
    choose_implementation,
    create_optimizer,
    get_optimizer_info,
    list_optimizers,
    register_optimizer,
)
from lightning_speedups.optim.optimizers import _fused_devices
from tests.helpers import quiet_trainer
from tests.optim._data import TinyData


def _names(opt: torch.optim.Optimizer, model: nn.Module) -> dict[str, set[str]]:
    by_id = {id(p): n for n, p in model.named_parameters()}
    return {g["name"]: {by_id[id(p)] for p in g["params"]} for g in opt.param_groups}


@pytest.mark.parametrize("name", list_optimizers())
def test_every_optimizer_builds_and_steps(name: str) -> None:
    model = nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8), nn.Linear(8, 2))
    opt = create_optimizer(model, OptimizerConfig(name, lr=0.01, weight_decay=0.01))
    before = [p.detach().clone() for p in model.parameters()]
    model(torch.randn(3, 4)).sum().backward()
    opt.step()
    assert all(not torch.equal(a, p) for a, p in zip(before, model.parameters()))
    # a hybrid (muon) splits a group by which part steps it: "default" and "default/muon" are one user group
    assert {g["name"].removesuffix("/muon") for g in opt.param_groups} == {"default", "default/no_decay"}


def test_weight_decay_grouping() -> None:
    model = DemoClassifier(width=4)
    opt = create_optimizer(model, OptimizerConfig("sgd", lr=0.1, weight_decay=5e-4))
    groups = _names(opt, model)
    # conv weights and the head weight decay; BN weights/biases and the head bias do not
    assert groups["default"] == {n for n, p in model.named_parameters() if p.ndim > 1}
    assert groups["default/no_decay"] == {n for n, p in model.named_parameters() if p.ndim <= 1}
    assert any(".1.weight" in n for n in groups["default/no_decay"])  # a BatchNorm weight
    wd = {g["name"]: g["weight_decay"] for g in opt.param_groups}
    assert wd == {"default": 5e-4, "default/no_decay": 0.0}
    # opting out puts everything in one decayed group; no decay at all means no split either
    opt = create_optimizer(model, OptimizerConfig("sgd", weight_decay=5e-4, no_decay_norm_and_bias=False))
    assert [(g["name"], g["weight_decay"]) for g in opt.param_groups] == [("default", 5e-4)]
    assert [g["name"] for g in create_optimizer(model, OptimizerConfig("sgd")).param_groups] == ["default"]


def test_norm_weight_with_ndim_gt_1_is_not_decayed() -> None:
    class Odd(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm = nn.GroupNorm(2, 4)
            self.norm.weight = nn.Parameter(torch.ones(4))
            self.proj = nn.Linear(4, 4, bias=False)

    model = Odd()
    opt = create_optimizer(model, OptimizerConfig("adamw", weight_decay=0.1))
    assert _names(opt, model) == {"default/no_decay": {"norm.weight", "norm.bias"}, "default": {"proj.weight"}}


def test_lr_multipliers_longest_prefix_wins() -> None:
    model = DemoClassifier(width=4)
    cfg = OptimizerConfig("adam", lr=1e-2, lr_multipliers={"backbone": 0.1, "backbone.0": 0.01, "head.bias": 3.0})
    opt = create_optimizer(model, cfg)
    groups = _names(opt, model)
    lrs = {g["name"]: (g["lr"], g["lr_mult"]) for g in opt.param_groups}
    assert groups["backbone.0"] == {n for n, _ in model.named_parameters() if n.startswith("backbone.0.")}
    assert not any(n.startswith("backbone.0.") for n in groups["backbone"])
    assert groups["head.bias"] == {"head.bias"} and groups["default"] == {"head.weight"}
    assert lrs["backbone.0"] == (pytest.approx(1e-4), 0.01)
    assert lrs["backbone"] == (pytest.approx(1e-3), 0.1)
    assert lrs["head.bias"] == (pytest.approx(3e-2), 3.0)
    assert lrs["default"] == (1e-2, 1.0)
    # "backbone.1" must not match "backbone.10"-style siblings by string prefix
    seq = nn.Sequential(*[nn.Linear(2, 2) for _ in range(11)])
    opt = create_optimizer(seq, OptimizerConfig(lr_multipliers={"1": 0.5}))
    assert _names(opt, seq)["1"] == {"1.weight", "1.bias"}


def test_frozen_parameters_are_grouped_and_join_when_unfrozen() -> None:
    model = DemoClassifier(width=4)
    for p in model.backbone.parameters():
        p.requires_grad_(False)
    opt = create_optimizer(model, OptimizerConfig("sgd", lr=0.1, lr_multipliers={"backbone": 0.1}))
    in_groups = {id(p) for g in opt.param_groups for p in g["params"]}
    assert in_groups == {id(p) for p in model.parameters()}
    frozen = model.backbone[0][0].weight
    before = frozen.detach().clone()
    model.train()
    loss = model(torch.randn(2, 3, 8, 8)).sum()
    loss.backward()
    opt.step()
    assert torch.equal(frozen, before)  # no grad -> skipped, no weight decay or momentum applied
    opt.zero_grad()
    frozen.requires_grad_(True)  # unfreeze: no add_param_group needed
    model(torch.randn(2, 3, 8, 8)).sum().backward()
    opt.step()
    assert not torch.equal(frozen, before)


def test_create_optimizer_from_params_dict_and_name() -> None:
    params = [nn.Parameter(torch.ones(3, 3)), nn.Parameter(torch.ones(3))]
    opt = create_optimizer(params, {"name": "sgd", "lr": 0.1, "weight_decay": 0.1})
    assert isinstance(opt, torch.optim.SGD) and opt.defaults["momentum"] == 0.9
    assert [g["name"] for g in opt.param_groups] == ["default", "default/no_decay"]
    assert isinstance(create_optimizer(params, "rmsprop"), torch.optim.RMSprop)
    assert isinstance(create_optimizer(params), torch.optim.Adam)


def test_config_fields_reach_the_optimizer() -> None:
    p = [nn.Parameter(torch.ones(2))]
    opt = create_optimizer(p, OptimizerConfig("sgd", lr=0.2, momentum=0.8, nesterov=True))
    assert opt.defaults["momentum"] == 0.8 and opt.defaults["nesterov"] is True
    opt = create_optimizer(p, OptimizerConfig("adamw", betas=(0.8, 0.9), eps=1e-6, kwargs={"amsgrad": True}))
    assert opt.defaults["betas"] == (0.8, 0.9) and opt.defaults["eps"] == 1e-6 and opt.defaults["amsgrad"]


def test_lr_scaling_in_create_optimizer() -> None:
    p = [nn.Parameter(torch.ones(2))]
    cfg = OptimizerConfig("sgd", lr=0.1, lr_scaling="linear", base_batch_size=32)
    assert create_optimizer(p, cfg, batch_size=128).param_groups[0]["lr"] == pytest.approx(0.4)
    cfg = OptimizerConfig("sgd", lr=0.1, lr_scaling="sqrt", base_batch_size=32)
    assert create_optimizer(p, cfg, batch_size=128).param_groups[0]["lr"] == pytest.approx(0.2)


def test_fused_chosen_only_where_supported() -> None:
    cpu = [torch.zeros(2, requires_grad=True)]
    adam = get_optimizer_info("adam")
    rmsprop = get_optimizer_info("rmsprop")
    cpu_fused = "cpu" in _fused_devices()  # torch >= 2.4 has fused CPU kernels
    assert choose_implementation(adam, cpu, "auto") == ({"fused": True} if cpu_fused else {})
    assert choose_implementation(adam, cpu, "auto", avoid_fused=True) == {}
    assert choose_implementation(rmsprop, cpu, "auto") == {}  # RMSprop has no fused kernel
    assert choose_implementation(adam, cpu, "foreach") == {"foreach": True}
    assert choose_implementation(adam, cpu, "for_loop") == {"foreach": False}
    meta = [torch.zeros(2, device="meta", requires_grad=True)]
    with mock.patch("lightning_speedups.optim.optimizers._fused_devices", return_value=["cuda", "meta"]):
        assert choose_implementation(adam, meta, "auto") == {"fused": True}
        assert choose_implementation(rmsprop, meta, "auto") == {}
        assert choose_implementation(adam, [torch.zeros(2, device="meta", dtype=torch.long)], "auto") == {}
        assert choose_implementation(adam, meta + [torch.zeros(2, device="meta")] + cpu, "auto") == {}  # mixed
    with mock.patch("lightning_speedups.optim.optimizers._fused_devices", return_value=["cuda"]):
        assert choose_implementation(adam, meta, "auto") == {}
        assert choose_implementation(adam, cpu, "auto") == {}
        with pytest.raises(SpeedupConfigError, match=r"`implementation`='fused' is not available for optimizer 'adam'"):
            create_optimizer(cpu, OptimizerConfig("adam", implementation="fused"))
    with pytest.raises(SpeedupConfigError, match=r"`implementation`='fused' is not available for optimizer 'rmsprop'"):
        create_optimizer(cpu, OptimizerConfig("rmsprop", implementation="fused"))
    # through the mixin: fused in a plain fp32 run, never with fp16 GradScaler + gradient clipping
    model = DemoClassifier(width=4, optimizer_config=OptimizerConfig("sgd"))
    trainer = quiet_trainer(max_steps=1, limit_val_batches=0)
    trainer.fit(model, TinyData(1))
    assert trainer.optimizers[0].defaults["fused"] is (True if cpu_fused else None)
    model._trainer = SimpleNamespace(gradient_clip_val=1.0, precision="16-mixed")  # what the mixin reads
    assert not model.configure_optimizers().defaults.get("fused")


def test_register_optimizer() -> None:
    register_optimizer(OptimizerInfo("asgd_test", torch.optim.ASGD, {"lambd": 1e-3}, summary="test"))
    try:
        opt = create_optimizer([nn.Parameter(torch.ones(2))], OptimizerConfig("asgd_test", lr=0.5))
        assert isinstance(opt, torch.optim.ASGD) and opt.defaults["lambd"] == 1e-3
    finally:
        from lightning_speedups.optim.optimizers import _OPTIMIZERS

        _OPTIMIZERS.pop("asgd_test")
