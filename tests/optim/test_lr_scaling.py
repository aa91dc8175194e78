"""The lr rule per optimizer and the rescaling of live optimizers and schedulers (issue 49, item 4)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

from lightning_speedups.optim.lr_scaling import auto_lr_rule, lr_factor, rule_words, scale_optimizer_lrs
from lightning_speedups.optim.muon import MuonWithAdamW, muon_param_groups


def _params() -> list[nn.Parameter]:
    return [nn.Parameter(torch.zeros(2, 2))]


class _SGDLike(torch.optim.Optimizer):  # a third-party SGD variant (e.g. schedule-free SGD): by its name
    def __init__(self, params: Any) -> None:
        super().__init__(params, {"lr": 0.1, "momentum": 0.9})


class _WithBetas(torch.optim.Optimizer):  # a third-party Adam-type optimizer: by its `betas`
    def __init__(self, params: Any) -> None:
        super().__init__(params, {"lr": 0.1, "betas": (0.9, 0.99)})


class _Unknown(torch.optim.Optimizer):
    def __init__(self, params: Any) -> None:
        super().__init__(params, {"lr": 0.1})


@pytest.mark.parametrize(
    "make, rule",
    [
        (lambda p: torch.optim.SGD(p, lr=0.1), "linear"),
        (lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True), "linear"),
        (_SGDLike, "linear"),
        (lambda p: torch.optim.Adam(p), "sqrt"),
        (lambda p: torch.optim.AdamW(p), "sqrt"),
        (lambda p: torch.optim.NAdam(p), "sqrt"),
        (lambda p: torch.optim.RAdam(p), "sqrt"),
        (lambda p: torch.optim.Adamax(p), "sqrt"),
        (lambda p: torch.optim.Adagrad(p), "sqrt"),
        (lambda p: torch.optim.RMSprop(p), "sqrt"),
        (_WithBetas, "sqrt"),
        (lambda p: torch.optim.LBFGS(p), None),
        (_Unknown, None),
    ],
)
def test_auto_lr_rule(make: Callable[[Any], torch.optim.Optimizer], rule: str | None) -> None:
    assert auto_lr_rule(make(_params())) == rule


def test_auto_lr_rule_of_the_muon_hybrid_is_sqrt() -> None:
    net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    groups, _ = muon_param_groups(net, [{"params": list(net.parameters())}])
    assert auto_lr_rule(MuonWithAdamW(groups, lr=1e-3, warmup_steps=0)) == "sqrt"


def test_lr_factor_and_words() -> None:
    assert lr_factor(256, 64, "linear") == 4.0 and lr_factor(256, 64, "sqrt") == 2.0
    assert lr_factor(256, 64, None) == 1.0 and lr_factor(64, 64, "linear") == 1.0
    adam = torch.optim.Adam(_params())
    assert rule_words("auto", adam, "sqrt") == "sqrt rule (Adam: Adam-type)"
    assert rule_words("linear", adam, "linear") == "linear rule (`lr_scaling`='linear', Adam)"
    assert "no rule is known for LBFGS" in rule_words("auto", torch.optim.LBFGS(_params()), None)


def _schedules() -> dict[str, Callable[[torch.optim.Optimizer], Any]]:
    lr_sched = torch.optim.lr_scheduler
    return {
        "warmup-then-cosine": lambda o: lr_sched.SequentialLR(
            o, [lr_sched.LinearLR(o, 0.1, total_iters=3), lr_sched.CosineAnnealingLR(o, 8, eta_min=0.01)], [3]
        ),
        "onecycle": lambda o: lr_sched.OneCycleLR(o, max_lr=0.5, total_steps=12),
        "cyclic": lambda o: lr_sched.CyclicLR(o, base_lr=0.01, max_lr=0.2, step_size_up=3),
        "cosine-restarts": lambda o: lr_sched.CosineAnnealingWarmRestarts(o, 4, eta_min=0.02),
        "step": lambda o: lr_sched.StepLR(o, 3, gamma=0.5),
    }


@pytest.mark.parametrize("name", list(_schedules()))
def test_scaled_schedule_runs_on_as_the_scaled_curve(name: str) -> None:
    """After scaling at step ``k``, every later lr is ``factor`` times the unscaled twin's."""

    def run(factor: float | None, at: int = 2, steps: int = 12) -> list[float]:
        opt = torch.optim.SGD(_params(), lr=0.1, momentum=0.9)
        sched = _schedules()[name](opt)
        other = torch.optim.SGD(_params(), lr=0.1)
        bystander = torch.optim.lr_scheduler.StepLR(other, 1)
        out = []
        for step in range(steps):
            if step == at and factor is not None:
                scale_optimizer_lrs(opt, [bystander, sched], factor)
                assert sched.get_last_lr() == [g["lr"] for g in opt.param_groups]
            out.append(opt.param_groups[0]["lr"])
            opt.step()
            sched.step()
        assert other.param_groups[0]["lr"] == 0.1 and bystander.base_lrs == [0.1]  # another optimizer's: untouched
        return out

    plain = run(None)
    scaled = run(2.0)
    assert scaled[:2] == pytest.approx(plain[:2])
    assert scaled[2:] == pytest.approx([2.0 * x for x in plain[2:]])


def test_scale_reduce_on_plateau_floor_and_one_is_a_no_op() -> None:
    opt = torch.optim.SGD(_params(), lr=0.1)
    sched = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, min_lr=0.001)
    scale_optimizer_lrs(opt, [sched], 3.0)
    assert opt.param_groups[0]["lr"] == pytest.approx(0.3) and sched.min_lrs == [pytest.approx(0.003)]
    scale_optimizer_lrs(opt, [sched], 1.0)
    assert opt.param_groups[0]["lr"] == pytest.approx(0.3)
