"""LR finder: rules on synthetic curves, Lightning's range test on the demo task, the callback, plots."""

from __future__ import annotations

import math
import os

import lightning as L
import pytest
import torch

from lightning_speedups._errors import SpeedupConfigError, SpeedupRuntimeError
from lightning_speedups.callbacks.lr_finder import LRFinder
from lightning_speedups.demo import DemoClassifier, DigitsDataModule
from lightning_speedups.optim import (
    LR_RULES,
    LRFinderResult,
    OptimizerConfig,
    SchedulerConfig,
    apply_lr,
    plot_lr_schedule,
    simulate_lr_schedule,
    suggest_from_curve,
    suggest_lr,
)
from lightning_speedups.optim.lr_finder import _fix_lightning_debias
from tests.helpers import quiet_trainer
from tests.optim._data import TinyData


@pytest.fixture(autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors: one thread is faster and immune to a busy machine
    yield
    torch.set_num_threads(before)


def _curve() -> tuple[list[float], list[float]]:
    # flat until 1e-4, falls until 1e-1 (steepest around 1e-2), then diverges
    lrs = [10 ** (-6 + k / 10) for k in range(61)]
    losses = []
    for k, lr in enumerate(lrs):
        x = math.log10(lr)
        base = 2.3 - 1.0 / (1 + math.exp(-3 * (x + 2)))
        losses.append(base + (0.0 if x < -1 else 2.0 * (x + 1) ** 2) + 0.002 * math.sin(7 * k))
    return lrs, losses


def test_lr_finder_functional_rules() -> None:
    lrs, losses = _curve()
    got = {rule: suggest_from_curve(lrs, losses, rule) for rule in LR_RULES}
    assert set(got) == {"steep", "valley", "minimum", "slide"}
    for rule, lr in got.items():
        assert math.isfinite(lr) and lrs[0] <= lr <= lrs[-1], rule
    assert 10**-2.5 < got["steep"] < 10**-1.5  # the inflection of the sigmoid drop
    i_min = min(range(len(losses)), key=losses.__getitem__)
    assert got["minimum"] == pytest.approx(lrs[i_min] / 10)
    assert 1e-4 < got["valley"] < lrs[i_min]  # inside the falling stretch
    assert got["slide"] < lrs[i_min]
    # non-finite points are dropped; a too-short curve raises
    assert suggest_from_curve([*lrs, 2.0], [*losses, float("nan")], "minimum") == got["minimum"]
    with pytest.raises(SpeedupRuntimeError, match=r"produced 2 usable points; the rules need at least 3"):
        suggest_from_curve([1e-3, 1e-2, 1e-1], [1.0, float("inf"), 0.5], "valley")
    # Lightning's first smoothed point reads half the loss; the fix restores a flat curve
    beta = 0.98
    raw = [2.0] * 5
    avg = 0.0
    lightning = []
    for k, x in enumerate(raw):
        avg = beta * avg + (1 - beta) * x
        lightning.append(avg / (1 - beta ** (k + 2)))
    assert _fix_lightning_debias(lightning) == pytest.approx(raw)


def test_suggest_lr_on_demo_restores_weights_and_leaves_no_files() -> None:
    model = DemoClassifier(width=8, optimizer_config=OptimizerConfig("sgd", lr=0.01))
    model.train()
    before = {k: v.detach().clone() for k, v in model.state_dict().items()}
    rng = torch.get_rng_state()
    result = suggest_lr(
        model, DigitsDataModule(batch_size=32, augment=False), num_training_steps=30, min_lr=1e-5, rule="slide"
    )
    assert isinstance(result, LRFinderResult) and len(result.lrs) == 30
    for rule in LR_RULES:
        lr = result.suggestions[rule]
        assert math.isfinite(lr) and 1e-5 <= lr <= 1.0, rule
    assert result.lr == result.suggestions["slide"] and model.optimizer_config.lr == result.lr
    assert model.optimizer_config.name == "sgd"
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before), "weights/buffers must be restored bitwise"
    assert torch.equal(torch.get_rng_state(), rng)
    assert os.listdir(".") == []


def test_lr_finder_fit() -> None:
    model = DemoClassifier(
        width=4,
        optimizer_config=OptimizerConfig("sgd", lr=1.0, lr_multipliers={"head": 0.5}),
        scheduler_config=SchedulerConfig("onecycle"),
    )
    finder = LRFinder(rule="valley", num_training_steps=20, min_lr=1e-4, max_lr=0.5, plot_path="finder.png")
    trainer = quiet_trainer(max_epochs=1, limit_val_batches=1, callbacks=[finder])
    trainer.fit(model, TinyData(n_batches=6))
    assert finder.result is not None and 1e-4 <= finder.result.lr <= 0.5
    assert model.optimizer_config.lr == finder.result.lr != 1.0
    sched = trainer.lr_scheduler_configs[0].scheduler
    max_lrs = {
        g["name"]: m
        for g, m in zip(trainer.optimizers[0].param_groups, [g["max_lr"] for g in sched.optimizer.param_groups])
    }
    assert max_lrs["default"] == pytest.approx(finder.result.lr)  # optimizer + OneCycle rebuilt with the new lr
    assert max_lrs["head"] == pytest.approx(0.5 * finder.result.lr)
    assert trainer.global_step == 6 and sched.last_epoch == 6
    assert sorted(os.listdir(".")) == ["finder.png"]  # Lightning's temporary checkpoint is gone


def test_lr_finder_resume_skips_test() -> None:
    model = DemoClassifier(width=4, optimizer_config=OptimizerConfig("adam"))
    trainer = quiet_trainer(max_epochs=1, limit_val_batches=1, callbacks=[LRFinder(num_training_steps=10)])
    trainer.fit(model, TinyData(n_batches=3))
    lr = model.optimizer_config.lr
    trainer.save_checkpoint("a.ckpt")
    resumed = DemoClassifier(width=4, optimizer_config=OptimizerConfig("adam", lr=lr))
    finder = LRFinder(num_training_steps=10)
    trainer = quiet_trainer(max_epochs=2, limit_val_batches=1, callbacks=[finder])
    trainer.fit(resumed, TinyData(n_batches=3), ckpt_path="a.ckpt")
    assert finder.result is None and resumed.optimizer_config.lr == lr
    assert trainer.optimizers[0].param_groups[0]["lr"] == lr and trainer.global_step == 6


def test_lr_finder_misconfiguration() -> None:
    with pytest.raises(
        SpeedupConfigError, match=r"`rule`='fastest' is not supported. Allowed values: 'steep', 'valley'"
    ):
        LRFinder(rule="fastest")
    with pytest.raises(SpeedupConfigError, match=r"`mode`='log' is not supported"):
        LRFinder(mode="log")
    with pytest.raises(SpeedupConfigError, match=r"`min_lr`=0 is out of range"):
        LRFinder(min_lr=0)
    with pytest.raises(SpeedupConfigError, match=r"`max_lr`=1e-07 is out of range.*\(1e-06, inf\).*greater than"):
        LRFinder(max_lr=1e-7)
    with pytest.raises(SpeedupConfigError, match=r"`num_training_steps`=2 is out of range.*an integer >= 5"):
        LRFinder(num_training_steps=2)
    with pytest.raises(SpeedupConfigError, match=r"suggest_lr needs `datamodule` or `train_dataloaders`"):
        suggest_lr(DemoClassifier(width=4))

    class NoLR(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(3 * 8 * 8, 10)

        def training_step(self, batch, batch_idx):  # noqa: ANN001, ANN201
            return torch.nn.functional.cross_entropy(self.layer(batch[0].flatten(1)), batch[1])

        def configure_optimizers(self):  # noqa: ANN201
            return torch.optim.SGD(self.parameters(), lr=0.1)

    trainer = quiet_trainer(max_steps=1, callbacks=[LRFinder(num_training_steps=5)])
    with pytest.raises(
        SpeedupConfigError, match=r"LRFinder found no learning rate to set on NoLR. Allowed values: a module with"
    ):
        trainer.fit(NoLR(), TinyData(2))
    assert trainer.global_step == 0
    with pytest.raises(SpeedupConfigError, match=r"Found no learning rate to update on the module"):
        apply_lr(NoLR(), 0.1)
    with pytest.raises(SpeedupConfigError, match=r"`lr`=-1.0 is out of range"):
        apply_lr(DemoClassifier(width=4), -1.0)


def test_suggest_lr_num_training_is_a_deprecated_alias() -> None:
    """`num_training` (Lightning's Tuner name) still works, warns, and means `num_training_steps`."""
    model = DemoClassifier(width=4, optimizer_config=OptimizerConfig("sgd", lr=0.01))
    with pytest.warns(DeprecationWarning, match=r"num_training=\) is deprecated; use num_training_steps="):
        result = suggest_lr(model, TinyData(n_batches=8), num_training=6, update=False, early_stop_threshold=None)
    assert len(result.lrs) == 6
    with pytest.warns(DeprecationWarning), pytest.raises(SpeedupConfigError, match=r"`num_training`=6 and"):
        suggest_lr(model, TinyData(), num_training=6, num_training_steps=8)
    with pytest.warns(DeprecationWarning), pytest.raises(SpeedupConfigError, match=r"`num_training_steps`=2 is out"):
        suggest_lr(model, TinyData(), num_training=2)


def test_lr_plots_write_png() -> None:
    pytest.importorskip("matplotlib")
    lrs, losses = _curve()
    LRFinderResult.from_curve(lrs, losses, "valley").plot("finder.png")
    configs = {"onecycle": "onecycle", "warmup+cosine": {"name": "linear_warmup_cosine", "warmup": 0.1}}
    fig = plot_lr_schedule(configs, OptimizerConfig("sgd", lr=0.1), total_steps=50, path="schedules.png")
    assert len(fig.axes[0].lines) == 2
    plot_lr_schedule(SchedulerConfig("step", step_size=2), total_steps=40, path="step.png")
    for name in ("finder.png", "schedules.png", "step.png"):
        with open(name, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    lrs = simulate_lr_schedule({"name": "multistep", "milestones": [2], "gamma": 0.5}, {"lr": 0.2}, 40, 10)
    assert lrs[:20] == [0.2] * 20 and lrs[20:] == pytest.approx([0.1] * 20)
    assert simulate_lr_schedule(None, {"lr": 0.3}, 5) == [0.3] * 5


def test_lr_finder_range_test_covers_its_range_on_a_short_epoch() -> None:
    # issue 23: a 40-batch epoch under max_epochs=1 ended a 100-step test at step 40 (1e-6 to 2.5e-4 of 1e-6 to 1)
    model = DemoClassifier(width=4, optimizer_config=OptimizerConfig("sgd", lr=0.01))
    finder = LRFinder(num_training_steps=100, early_stop_threshold=None)
    trainer = quiet_trainer(max_epochs=1, limit_val_batches=1, callbacks=[finder])
    trainer.fit(model, TinyData(n_batches=40))
    result = finder.result
    assert result is not None and result.steps_run == len(result.lrs) == 100 and result.planned_steps == 100
    assert result.stop_reason is None and not result.stopped_early
    assert result.lr_covered[0] == pytest.approx(1e-6) and result.lr_covered[1] > 0.8
    assert trainer.global_step == 40 and trainer.current_epoch == 1  # the real run: one epoch, as asked
    assert trainer.check_val_every_n_epoch == 1 and trainer.fit_loop.max_epochs == 1
    # suggest_lr too, even when its trainer_kwargs carry a max_epochs
    result = suggest_lr(
        model,
        TinyData(n_batches=8),
        num_training_steps=20,
        update=False,
        early_stop_threshold=None,
        trainer_kwargs={"max_epochs": 1},
    )
    assert result.steps_run == 20 and result.stop_reason is None


def test_lr_finder_reports_a_range_test_that_stopped_early() -> None:
    # a huge max_lr makes plain SGD diverge: the test stops before its planned steps, and says where and why
    model = DemoClassifier(width=4, optimizer_config=OptimizerConfig("sgd", lr=0.01))
    with pytest.warns(UserWarning, match=r"LR finder: the LR range test ran \d+ of 60 steps, covering lr 1e-05 to"):
        result = suggest_lr(
            model,
            TinyData(n_batches=6),
            num_training_steps=60,
            min_lr=1e-5,
            max_lr=1e6,
            update=False,
            early_stop_threshold=1.5,
        )
    assert result.stopped_early and result.steps_run < 60 and result.planned_steps == 60
    assert result.stop_reason.startswith("the loss diverged") and "`early_stop_threshold`=1.5" in result.stop_reason
    assert result.lr_covered == (min(result.lrs), max(result.lrs)) and result.lr_covered[1] < 1e6
    assert result.lr_covered[0] <= result.lr <= result.lr_covered[1]


def test_range_test_stop_reasons() -> None:
    from lightning_speedups.optim.lr_curve import range_test_stop

    assert range_test_stop([2.0, 1.5, 1.0], 3, 4.0) is None
    assert range_test_stop([2.0, 1.0, 5.0], 10, 4.0).startswith("the loss diverged: 5 exceeded")
    assert range_test_stop([2.0, 1.0, 1.1], 10, 4.0).startswith("the fit loop ended before the planned steps")
    assert range_test_stop([2.0, 1.0, 5.0], 10, None).startswith("the fit loop ended")
    result = LRFinderResult.from_curve([1e-3, 1e-2, 1e-1], [2.0, 1.0, 1.1], "minimum", 10, "the fit loop ended")
    assert result.coverage_text() == (
        "the LR range test ran 3 of 10 steps, covering lr 0.001 to 0.1: stopped early, the fit loop ended"
    )
