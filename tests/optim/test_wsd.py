"""WSD (warm-up, stable, decay): the registry entry, the cool-down from any step, FastSchedule's ``decay="wsd"``."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR

from lightning_speedups._errors import SpeedupConfigError
from lightning_speedups.callbacks.fast_schedule import FastSchedule
from lightning_speedups.demo import DemoClassifier
from lightning_speedups.functional.fast_schedule import create_fast_schedule
from lightning_speedups.optim import SchedulerConfig, create_scheduler
from lightning_speedups.optim.wsd import WSDFactor, cool_down
from tests.helpers import quiet_trainer
from tests.optim._data import LRRecorder, TinyData


def test_wsd_misconfiguration() -> None:
    for bad in (0, 0.0, 1, 1.0, -0.1, 1.5):
        with pytest.raises(SpeedupConfigError, match=rf"`decay_fraction`={bad!r} is out of range.*\(0.0, 1.0\)"):
            SchedulerConfig("wsd", decay_fraction=bad)
    with pytest.raises(SpeedupConfigError, match=r"`decay_shape`='sqrt' is not supported.*'linear', '1-sqrt'"):
        SchedulerConfig("wsd", decay_shape="sqrt")
    with pytest.raises(SpeedupConfigError, match=r"`decay_fraction`=1.0 is out of range"):
        FastSchedule(decay="wsd", decay_fraction=1.0)
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
    with pytest.raises(SpeedupConfigError, match=r"`scheduler`=CosineAnnealingLR has no WSD schedule to cool down"):
        cool_down(torch.optim.lr_scheduler.CosineAnnealingLR(opt, 10), 5)
    with pytest.raises(SpeedupConfigError, match=r"`steps`=0 is out of range"):
        cool_down(LambdaLR(opt, WSDFactor(10, 0)), 0)


@pytest.mark.parametrize("shape", ["linear", "1-sqrt", "cosine"])
def test_wsd_shapes_hold_the_peak_then_cool_down_to_min_lr(shape: str) -> None:
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    cfg = SchedulerConfig("wsd", warmup=5, decay_fraction=0.2, decay_shape=shape, min_lr=0.1, total_steps=100)
    sched = create_scheduler(opt, cfg)
    lrs = []
    for _ in range(100):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs[:5] == pytest.approx([(s + 1) / 6 for s in range(5)])
    assert lrs[5:80] == [1.0] * 75  # stable until the last 20 steps
    assert all(a > b for a, b in zip(lrs[79:], lrs[80:]))  # the cool-down only goes down
    assert 0.1 < lrs[-1] < 0.2 and opt.param_groups[0]["lr"] == pytest.approx(0.1)


def _noisy_regression(cool_at: int | None, total: int = 200, cool_steps: int = 40) -> float:
    """Final loss of SGD on a noisy linear regression under WSD, with a cool-down moved to ``cool_at``."""
    g = torch.Generator().manual_seed(0)
    true = torch.randn(8, 1, generator=g)
    model = nn.Linear(8, 1, bias=False)
    nn.init.zeros_(model.weight)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = LambdaLR(opt, WSDFactor(total, warmup=5, decay_fraction=0.2))
    end = total
    for step in range(total):
        if step == cool_at:
            end = cool_down(sched, cool_steps)
        if step == end:
            break
        x = torch.randn(16, 8, generator=g)
        y = x @ true + 0.5 * torch.randn(16, 1, generator=g)
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        sched.step()
    x = torch.randn(4096, 8, generator=g)
    with torch.no_grad():
        return float(nn.functional.mse_loss(model(x), x @ true))


def test_wsd_a_cool_down_from_any_stable_step_ends_well() -> None:
    planned = _noisy_regression(None)  # the whole run: 160 stable steps, a 40-step cool-down
    for cool_at in (40, 80, 120):  # a run stopped early after its own cool-down
        cooled = _noisy_regression(cool_at)
        stopped = _noisy_regression(cool_at + 40, cool_steps=1)  # the same steps, ended without a cool-down
        assert cooled < 0.5 * stopped, (cool_at, cooled, stopped)
        assert cooled < 2.0 * planned, (cool_at, cooled, planned)


def test_wsd_cool_down_is_saved_with_the_scheduler() -> None:
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    sched = LambdaLR(opt, WSDFactor(100, warmup=0))
    for _ in range(30):
        opt.step()
        sched.step()
    assert cool_down(sched, 10) == 40
    state = sched.state_dict()
    fresh_opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    fresh = LambdaLR(fresh_opt, WSDFactor(100, warmup=0))
    fresh.load_state_dict(state)
    factor = fresh.lr_lambdas[0]
    assert (factor.decay_start, factor.total) == (30, 40)
    # a cool-down already under way is only ever shortened
    assert cool_down(sched, 50) == 80 and sched.lr_lambdas[0].total == 40


def test_fast_schedule_wsd_fit_and_functional() -> None:
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
    sched = create_fast_schedule(opt, total_steps=10, warmup=0, peak_factor=2.0, decay="wsd", decay_fraction=0.3)
    assert isinstance(sched.lr_lambdas[0], WSDFactor) and sched.base_lrs == [pytest.approx(0.2)]
    model = DemoClassifier(width=4, optimizer_config={"name": "sgd", "lr": 0.05})
    rec = LRRecorder()
    callbacks = [FastSchedule(warmup=1, peak_factor=2.0, decay="wsd", decay_fraction=0.5), rec]
    quiet_trainer(max_epochs=4, limit_val_batches=0, callbacks=callbacks).fit(model, TinyData(3))
    lrs = [snap["default"] for snap in rec.lrs[:-1]]
    assert lrs[:6] == pytest.approx([0.05] + [0.1] * 5)  # 12 steps: warm-up 1, stable to step 5, cool-down 6
    assert lrs[5:] == sorted(lrs[5:], reverse=True) and lrs[-1] < 0.02
