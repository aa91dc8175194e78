from __future__ import annotations

import math

import pytest
import torch

from lightning_speedups._errors import SpeedupConfigError
from lightning_speedups.functional.fast_schedule import FastScheduleFactor, create_fast_schedule, peak_lr, warmup_steps


def _opt(*lrs: float) -> torch.optim.Optimizer:
    return torch.optim.SGD([{"params": [torch.zeros(1, requires_grad=True)], "lr": lr} for lr in lrs])


def _run(opt: torch.optim.Optimizer, sched: torch.optim.lr_scheduler.LRScheduler, steps: int) -> list[list[float]]:
    lrs = []
    for _ in range(steps):
        lrs.append([g["lr"] for g in opt.param_groups])
        opt.step()
        sched.step()
    return lrs


def test_fast_schedule_functional():
    opt = _opt(0.1, 0.01)  # two groups: their ratio survives
    sched = create_fast_schedule(opt, total_steps=20, warmup=4, peak_factor=2.0)
    lrs = _run(opt, sched, 20)
    assert sched.base_lrs == pytest.approx([0.2, 0.02])
    head = [lr[0] for lr in lrs]
    assert head[:5] == pytest.approx([0.2 * (s + 1) / 5 for s in range(4)] + [0.2])  # warm-up, then the peak
    assert all(a > b for a, b in zip(head[4:], head[5:]))  # decays every step after the peak
    assert head[-1] == pytest.approx(0.2 / 16)  # linear to 0: one step before the end
    for a, b in lrs:
        assert b == pytest.approx(a / 10)


def test_fast_schedule_shapes_and_batch_scaling():
    f = FastScheduleFactor(total=10, warmup=0, decay="cosine", final_ratio=0.1)
    assert f(0) == pytest.approx(1.0) and f(10) == pytest.approx(0.1) and f(5) == pytest.approx(0.55)
    assert FastScheduleFactor(total=10, warmup=2, decay="constant")(7) == 1.0
    assert peak_lr(1e-3, 2.0, batch_size=128, base_batch_size=32, lr_scaling="linear") == pytest.approx(8e-3)
    assert peak_lr(1e-3, 2.0, batch_size=128, base_batch_size=32, lr_scaling="sqrt") == pytest.approx(4e-3)
    assert peak_lr(1e-3, 2.0, batch_size=128, base_batch_size=32, lr_scaling=None) == pytest.approx(2e-3)
    assert warmup_steps(0.05, 200) == 10 and warmup_steps(3, 200) == 3


def test_fast_schedule_state_roundtrip():
    opt = _opt(0.1)
    sched = create_fast_schedule(opt, total_steps=10, warmup=0.2)
    _run(opt, sched, 4)
    state = sched.state_dict()
    opt2 = _opt(0.1)
    sched2 = create_fast_schedule(opt2, total_steps=99, warmup=0.5)  # different: the state must win
    opt2.load_state_dict(opt.state_dict())
    sched2.load_state_dict(state)
    assert _run(opt2, sched2, 6) == _run(opt, sched, 6)
    assert not math.isnan(state["lr_lambdas"][0]["total"])


def test_fast_schedule_functional_misconfiguration():
    with pytest.raises(SpeedupConfigError, match=r"`total_steps`=0 is out of range. Allowed values: an integer >= 1"):
        create_fast_schedule(_opt(0.1), 0)
    with pytest.raises(SpeedupConfigError, match=r"`warmup`=1.5 is out of range. Allowed values: an int >= 0"):
        create_fast_schedule(_opt(0.1), 10, warmup=1.5)
    with pytest.raises(SpeedupConfigError, match=r"`warmup`=10 \(10 steps\) is longer than training \(10 steps\)"):
        create_fast_schedule(_opt(0.1), 10, warmup=10)
    with pytest.raises(SpeedupConfigError, match=r"`decay`='step' is not supported.*'linear', 'cosine'"):
        create_fast_schedule(_opt(0.1), 10, decay="step")
    with pytest.raises(SpeedupConfigError, match=r"`peak_factor`=0 is out of range"):
        create_fast_schedule(_opt(0.1), 10, peak_factor=0)
    with pytest.raises(SpeedupConfigError, match=r"`batch_size`=64 and `base_batch_size`=None must be given together"):
        create_fast_schedule(_opt(0.1), 10, batch_size=64)
    with pytest.raises(SpeedupConfigError, match=r"`final_lr_ratio`=2 is out of range"):
        create_fast_schedule(_opt(0.1), 10, final_lr_ratio=2)
    with pytest.raises(SpeedupConfigError, match=r"`lr_scaling`='cubic' is not supported"):
        create_fast_schedule(_opt(0.1), 10, lr_scaling="cubic")
