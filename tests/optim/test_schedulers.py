"""Per-step LR of every registered scheduler inside a Lightning fit equals the torch reference driven by hand."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.optim import lr_scheduler as tls

from lightning_speedups._errors import SpeedupConfigError
from lightning_speedups.demo import DemoClassifier
from lightning_speedups.optim import (
    OptimizerConfig,
    SchedulerConfig,
    SchedulerInfo,
    create_scheduler,
    get_scheduler_info,
    lightning_scheduler_config,
    list_schedulers,
    register_scheduler,
)
from tests.helpers import quiet_trainer
from tests.optim._data import LRRecorder, TinyData

EPOCHS = 2
BATCHES = 3
TOTAL = EPOCHS * BATCHES
BASE_LR = 0.05


def _lambda(fn: Callable[[int], float]) -> Callable[[torch.optim.Optimizer], Any]:
    return lambda opt: tls.LambdaLR(opt, fn)


def _warmup_cosine(s: int, w: int = 2) -> float:
    return (s + 1) / (w + 1) if s < w else 0.5 * (1 + math.cos(math.pi * (s - w) / (TOTAL - w)))


# name -> (SchedulerConfig kwargs, reference scheduler built on a 1-parameter optimizer)
CASES: dict[str, tuple[dict[str, Any], Callable[[torch.optim.Optimizer], Any]]] = {
    "constant": ({}, _lambda(lambda s: 1.0)),
    "step": ({"step_size": 1, "gamma": 0.5}, lambda o: tls.StepLR(o, 1, gamma=0.5)),
    "multistep": ({"milestones": [1], "gamma": 0.3}, lambda o: tls.MultiStepLR(o, [1], gamma=0.3)),
    "exponential": ({"gamma": 0.5}, lambda o: tls.ExponentialLR(o, 0.5)),
    "cosine": ({}, lambda o: tls.CosineAnnealingLR(o, T_max=TOTAL)),
    "cosine_restarts": ({"t_0": 2}, lambda o: tls.CosineAnnealingWarmRestarts(o, T_0=2)),
    "onecycle": ({}, lambda o: tls.OneCycleLR(o, max_lr=BASE_LR, total_steps=TOTAL, cycle_momentum=False)),
    "linear_warmup_cosine": ({"warmup": 2}, _lambda(_warmup_cosine)),
    "constant_with_warmup": ({"warmup": 0.5}, _lambda(lambda s: (s + 1) / 4 if s < 3 else 1.0)),
    # warm-up 1 step, stable to step 3, then 3 cool-down steps at 3/4, 2/4, 1/4 of the peak
    "wsd": ({"warmup": 1, "decay_fraction": 0.5}, _lambda(lambda s: 0.5 if s < 1 else min(1.0, 1 - (s - 2) / 4))),
    "plateau": (
        # threshold=1: no later epoch counts as an improvement, so the lr is halved after epoch 2
        {"monitor": "val_loss", "patience": 0, "factor": 0.5, "kwargs": {"threshold": 1.0}},
        lambda o: tls.ReduceLROnPlateau(o, patience=0, factor=0.5, threshold=1.0),
    ),
}


def _reference(name: str, metrics: list[float]) -> list[float]:
    p = torch.zeros(1, requires_grad=True)
    opt = torch.optim.SGD([p], lr=BASE_LR)
    sched = CASES[name][1](opt)
    interval = get_scheduler_info(name).interval
    lrs = []
    for epoch in range(EPOCHS):
        for _ in range(BATCHES):
            lrs.append(opt.param_groups[0]["lr"])
            opt.step()
            if interval == "step":
                sched.step()
        if isinstance(sched, tls.ReduceLROnPlateau):
            sched.step(metrics[epoch])
        elif interval == "epoch":
            sched.step()
    lrs.append(opt.param_groups[0]["lr"])
    return lrs


@pytest.mark.parametrize("optimizer", ["sgd", "adam", "adagrad"])
@pytest.mark.parametrize("name", list_schedulers())
def test_scheduler_lr_matches_reference(name: str, optimizer: str) -> None:
    if name not in CASES:
        pytest.fail(f"scheduler {name!r} was registered without a reference in CASES: add one")
    model = DemoClassifier(
        width=4,
        optimizer_config=OptimizerConfig(optimizer, lr=BASE_LR, weight_decay=1e-4, lr_multipliers={"head": 0.5}),
        scheduler_config=SchedulerConfig(name, **CASES[name][0]),
    )
    rec = LRRecorder()
    quiet_trainer(max_epochs=EPOCHS, limit_val_batches=1, callbacks=[rec]).fit(model, TinyData(BATCHES))
    assert len(rec.lrs) == TOTAL + 1
    expected = _reference(name, rec.metrics)
    got = [snap["default"] for snap in rec.lrs]
    assert got == pytest.approx(expected, rel=1e-9, abs=1e-12)
    # lr multipliers survive every schedule: the head group stays at half the default group's lr
    for snap in rec.lrs:
        assert snap["head"] == pytest.approx(0.5 * snap["default"], rel=1e-9, abs=1e-12)
        assert snap["head/no_decay"] == pytest.approx(snap["head"])
    if name != "constant":
        assert len(set(got)) > 1, "the schedule should change the lr within the test run"


def test_scheduler_flags() -> None:
    assert get_scheduler_info("onecycle").needs_total(SchedulerConfig("onecycle"))
    assert get_scheduler_info("cosine").needs_total(SchedulerConfig("cosine"))
    assert not get_scheduler_info("cosine_restarts").needs_total(SchedulerConfig("cosine_restarts", t_0=3))
    assert get_scheduler_info("constant_with_warmup").needs_total(SchedulerConfig("constant_with_warmup", warmup=0.1))
    assert not get_scheduler_info("constant_with_warmup").needs_total(SchedulerConfig("constant_with_warmup", warmup=5))
    assert get_scheduler_info("plateau").needs_monitor and get_scheduler_info("plateau").interval == "epoch"
    assert {get_scheduler_info(n).interval for n in ("step", "multistep", "exponential")} == {"epoch"}
    assert {get_scheduler_info(n).interval for n in ("cosine", "onecycle", "linear_warmup_cosine")} == {"step"}
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
    cfg = SchedulerConfig("plateau", monitor="val_acc", mode="max", interval="epoch", frequency=2)
    out = lightning_scheduler_config(create_scheduler(opt, cfg), cfg)
    assert out["monitor"] == "val_acc" and out["interval"] == "epoch" and out["frequency"] == 2
    assert create_scheduler(opt, None) is None


def test_register_scheduler_is_usable_by_name() -> None:
    info = SchedulerInfo("poly_test", lambda o, c, t: tls.PolynomialLR(o, total_iters=t), needs_total_steps=True)
    register_scheduler(info)
    try:
        opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
        sched = create_scheduler(opt, {"name": "poly_test", "total_steps": 4})
        assert isinstance(sched, tls.PolynomialLR) and sched.total_iters == 4
    finally:
        from lightning_speedups.optim.schedulers import _SCHEDULERS

        _SCHEDULERS.pop("poly_test")


@pytest.mark.parametrize("name", ["onecycle", "cosine", "linear_warmup_cosine"])
def test_unbounded_run_raises_at_configure_optimizers(name: str) -> None:
    model = DemoClassifier(width=4, scheduler_config=SchedulerConfig(name, warmup=2 if "warmup" in name else 0))
    trainer = quiet_trainer(max_epochs=-1, limit_val_batches=1)
    with pytest.raises(SpeedupConfigError, match=r"unbounded \(max_epochs=-1 and no max_steps\).*max_steps"):
        trainer.fit(model, TinyData(2))
    assert trainer.global_step == 0


def test_warmup_longer_than_training_raises_before_training() -> None:
    model = DemoClassifier(width=4, scheduler_config=SchedulerConfig("linear_warmup_cosine", warmup=50))
    trainer = quiet_trainer(max_epochs=2, limit_val_batches=1)
    with pytest.raises(SpeedupConfigError, match=r"`warmup`=50 \(50 intervals\) is longer than training \(6"):
        trainer.fit(model, TinyData(3))
    assert trainer.global_step == 0


def test_epoch_total_and_frequency() -> None:
    # cosine stepped per epoch over 4 epochs, every 2nd epoch -> T_max = 2
    model = DemoClassifier(width=4, scheduler_config=SchedulerConfig("cosine", interval="epoch", frequency=2))
    trainer = quiet_trainer(max_epochs=4, limit_val_batches=1)
    trainer.fit(model, TinyData(2))
    assert trainer.lr_scheduler_configs[0].scheduler.T_max == 2
    assert trainer.lr_scheduler_configs[0].frequency == 2


def test_onecycle_too_few_steps_is_refused():
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1)
    with pytest.raises(SpeedupConfigError, match=r"`onecycle` over 4 step\(s\) with `pct_start`=0.25 leaves no room"):
        create_scheduler(opt, SchedulerConfig("onecycle", pct_start=0.25, total_steps=4))
    assert create_scheduler(opt, SchedulerConfig("onecycle", pct_start=0.25, total_steps=8)) is not None
