"""autotune's batch-size candidate with its lr scaled: the bar is the extra samples the gradient noise scale predicts
(issue 49, item 4), the bound of 2x where it cannot be measured or the lr cannot follow. Timings are mocked."""

from __future__ import annotations

import math
import re
from typing import Any

import pytest
import torch

from lightning_speedups.autotune import autotune, candidates, trials
from lightning_speedups.demo import DemoClassifier
from lightning_speedups.functional.batch_size.noise_scale import NoiseScale, doubling_sample_cost
from tests.test_autotune import FakeMachine, _loader, _patched, _PlainModule


def _ratio_for(cost: float) -> float:
    """The batch / noise-scale ratio whose doubling costs ``cost`` times the samples."""
    return (cost - 1.0) / (2.0 - cost)


def _measured(cost: float) -> Any:
    r = _ratio_for(cost)
    scale = NoiseScale(batch_size=8, batches=8, grad_sq=1.0, noise=1.0 / r, ratio=r, ratio_high=r)
    return lambda ctx: (scale, f"gradient noise scale ~{scale.b_simple:.0f} samples at batch 8 (test)")


@pytest.mark.parametrize(
    ("cost", "x2", "kept"),
    [
        (1.2, 0.75, 2),  # 1.33x the samples/s against 1.2x the samples (and 5%): kept
        (1.2, 0.9, 1),  # 1.11x the samples/s: not enough
        (1.5, 0.75, 1),  # 1.33x the samples/s against 1.5x the samples: kept at x1
        (1.05, 0.8, 2),  # far below the noise scale a larger batch needs no more samples: 1.25x is kept
    ],
)
def test_the_bar_is_the_measured_sample_cost(monkeypatch, cost, x2, kept):
    machine = FakeMachine({"x2": x2, "x4": 1.0})
    _patched(monkeypatch, machine)
    monkeypatch.setattr(candidates, "_noise_scale", _measured(cost))
    plan = autotune(
        DemoClassifier(width=4),
        _loader(),
        candidates=["batch_size"],
        methods=[],
        cache=False,
        clock=machine.clock,
        budget_s=2000.0,
        max_epochs=1,
    )
    (choice,) = plan.choices
    assert choice.chosen == kept and plan.settings["batch_scale"] == kept
    assert "bar: gradient noise scale ~" in choice.note
    need = (1.0 + 0.05) * cost
    if kept == 1:
        assert f"below the {need:.2f}x needed: a doubled batch may need up to {cost:.3g}x the samples" in choice.note
    else:  # x4 is no faster per sample: its bar is the cost of a doubling from twice the batch
        x4_cost = doubling_sample_cost(2 * _ratio_for(cost))
        assert f"{(1.0 + 0.05) * x4_cost:.2f}x needed" in choice.note


def test_the_bar_stays_at_the_bound_where_the_lr_cannot_follow_or_nothing_is_measured(monkeypatch):
    # a plain module's own configure_optimizers: the plan cannot scale its lr, so 1.67x the samples/s is not enough
    machine = FakeMachine({"x2": 0.6, "x4": 1.0})
    _patched(monkeypatch, machine)
    plan = autotune(
        _PlainModule(),
        _loader(n=64),
        candidates=["batch_size"],
        methods=[],
        cache=False,
        clock=machine.clock,
        budget_s=2000.0,
        max_epochs=1,
    )
    (choice,) = plan.choices
    assert choice.chosen == 1 and "below the 2.10x needed: a doubled batch may need up to 2x the samples" in choice.note
    assert "bar: at most 2x the samples (the lr of `_PlainModule.configure_optimizers` cannot follow" in choice.note
    # two batches in the loader: too few to measure the noise scale
    plan = autotune(
        DemoClassifier(width=4),
        _loader(n=16),
        candidates=["batch_size"],
        methods=[],
        cache=False,
        clock=machine.clock,
        budget_s=2000.0,
        max_epochs=1,
    )
    (choice,) = plan.choices
    assert choice.chosen == 1 and "the gradient noise scale could not be measured on 2 batches" in choice.note


def test_the_noise_scale_is_measured_on_the_users_batches(monkeypatch):
    machine = FakeMachine({"x2": 0.4, "x4": 1.0})
    _patched(monkeypatch, machine)
    model = DemoClassifier(width=4)
    loader = _loader(n=64)
    rng = torch.get_rng_state()
    plan = autotune(
        model,
        loader,
        candidates=["batch_size"],
        methods=[],
        cache=False,
        clock=machine.clock,
        budget_s=2000.0,
        max_epochs=1,
    )
    assert torch.equal(rng, torch.get_rng_state())  # the loader's shuffling and dropout drew from a forked RNG
    (choice,) = plan.choices
    found = re.search(
        r"bar: gradient noise scale ~(\d+|inf) samples at batch 8 \(upper bound of batch / noise "
        r"scale (\d+\.\d\d), 8 batches\)",
        choice.note,
    )
    assert found, choice.note
    assert 1.0 <= doubling_sample_cost(float(found.group(2))) <= 2.0
    assert choice.chosen == 2  # 2.5x the samples/s clears any bar


def test_the_larger_batch_trains_with_its_lr_scaled(monkeypatch):
    seen: list[float] = []
    real = trials.make_train_step

    def spy(model: Any, batch: Any, *, optimizer: torch.optim.Optimizer, **kw: Any) -> Any:
        seen.append(optimizer.param_groups[0]["lr"])
        return real(model, batch, optimizer=optimizer, **kw)

    monkeypatch.setattr(trials, "make_train_step", spy)
    ctx = trials.TrialContext(
        DemoClassifier(width=4), next(iter(_loader())), torch.device("cpu"), 10, 0.05, math.inf, {}
    )
    trials.make_step(ctx, {"batch_scale": 1})
    trials.make_step(ctx, {"batch_scale": 4})
    assert seen[1] == pytest.approx(2.0 * seen[0])  # Adam (the demo's): the square-root rule

    sgd = DemoClassifier(width=4, optimizer_config={"name": "sgd", "lr": 0.1})
    ctx = trials.TrialContext(sgd, next(iter(_loader())), torch.device("cpu"), 10, 0.05, math.inf, {})
    trials.make_step(ctx, {"batch_scale": 4})
    assert seen[2] == pytest.approx(0.4)


@pytest.mark.parametrize(
    ("config", "factor"),
    [
        ({"name": "sgd", "lr": 0.1}, 2.0),  # linear
        ({"name": "adamw", "lr": 0.1}, 2**0.5),  # square root
        ({"name": "sgd", "lr": 0.1, "lr_scaling": "linear", "base_batch_size": 8}, 1.0),  # follows the batch itself
    ],
)
def test_plan_apply_scales_the_lr_by_the_optimizers_rule(monkeypatch, config, factor):
    machine = FakeMachine({"x2": 0.4, "x4": 1.0})
    _patched(monkeypatch, machine)
    loader = _loader(n=32, batch_size=8)
    plan = autotune(
        DemoClassifier(width=4),
        loader,
        candidates=["batch_size"],
        methods=[],
        cache=False,
        clock=machine.clock,
        budget_s=2000.0,
        max_epochs=1,
    )
    assert plan.settings["batch_scale"] == 2
    model = DemoClassifier(width=4, optimizer_config=config)
    plan.apply(model, loader)
    assert plan.train_dataloaders.batch_size == 16
    assert model.optimizer_config.lr == pytest.approx(0.1 * factor)
