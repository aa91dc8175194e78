"""autotune's schedule method: FastSchedule on the user's optimizer (a quarter-epoch warm-up, at most 5% of the run,
3x the lr at the peak, linear decay to the end); left out, with a note, where FastSchedule cannot run; rebuilt from
the cache; a real fit follows the curve and a resumed fit continues it. No timing asserted."""

from __future__ import annotations

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint, StochasticWeightAveraging
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_speedups.autotune import autotune
from lightning_speedups.autotune.methods import method_callbacks, schedule_warmup
from lightning_speedups.autotune.optim import returns_scheduler as _returns_scheduler
from lightning_speedups.callbacks.fast_schedule import FastSchedule
from lightning_speedups.callbacks.lr_finder import LRFinder
from lightning_speedups.demo import DemoClassifier
from lightning_speedups.optim import SchedulerConfig

STEPS_PER_EPOCH = 8


def _loader(n: int = 8 * STEPS_PER_EPOCH, batch_size: int = 8) -> DataLoader:
    g = torch.Generator().manual_seed(0)
    return DataLoader(
        TensorDataset(torch.randn(n, 3, 32, 32, generator=g), torch.randint(0, 10, (n,), generator=g)),
        batch_size=batch_size,
    )


def _plan(model: L.LightningModule | None = None, **kw):
    kw = {"methods": ["schedule"], "cache": False, "max_epochs": 4, **kw}
    return autotune(model or DemoClassifier(width=4), _loader(), candidates=[], budget_s=5.0, accelerator="cpu", **kw)


class _Plain(L.LightningModule):
    """A plain LightningModule; ``conf`` picks what its configure_optimizers returns."""

    def __init__(self, conf: str = "optimizer") -> None:
        super().__init__()
        self.conf = conf
        self.net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 10))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        if self.conf == "sgd":
            return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)
        opt = torch.optim.Adam(self.parameters(), lr=1e-3)
        if self.conf == "lists":
            return [opt], [torch.optim.lr_scheduler.StepLR(opt, 1)]
        if self.conf == "dict":
            return {"optimizer": opt, "lr_scheduler": {"scheduler": torch.optim.lr_scheduler.StepLR(opt, 1)}}
        if self.conf == "needs_trainer":
            steps = self.trainer.estimated_stepping_batches
            return [opt], [torch.optim.lr_scheduler.OneCycleLR(opt, 1e-2, total_steps=int(steps))]
        if self.conf == "reads_datamodule":  # more than the planned run's length: not answered before the fit
            return torch.optim.Adam(self.parameters(), lr=1e-3 * self.trainer.datamodule.batch_size)
        return opt


def test_schedule_is_added_when_named_and_left_out_of_the_default_plan():
    default = _plan(methods=None, max_epochs=10)  # it slowed a conv task (resnet18_cifar): do no harm
    assert default.choices == [] and default.callbacks == [] and "schedule" not in default.settings
    assert any("schedule made a conv task slower to its target (resnet18_cifar)" in n for n in default.notes)
    plan = _plan(max_epochs=10)
    assert [c.name for c in plan.choices] == ["schedule"]
    (choice,) = plan.choices
    assert "resnet18_cifar (slower with it)" in choice.note and "added because `methods` names it" in choice.note
    assert choice.chosen == 3.0 and choice.gain == 1.0 and choice.trials == 0  # nothing timed: it costs nothing
    assert "quarter epoch" in choice.note and "`methods=[]` to keep your learning rate" in choice.note
    (schedule,) = plan.callbacks
    assert isinstance(schedule, FastSchedule)
    assert schedule.peak_factor == 3.0 and schedule.decay == "linear" and schedule.base_batch_size is None
    assert schedule.warmup == pytest.approx(0.25 * STEPS_PER_EPOCH / (10 * STEPS_PER_EPOCH))  # a quarter epoch
    assert plan.settings["schedule"] == 3.0


def test_schedule_warmup_is_a_quarter_epoch_at_most_five_percent():
    assert schedule_warmup(45, 540) == pytest.approx(0.25 * 45 / 540)
    assert schedule_warmup(100, 200) == 0.05 and schedule_warmup(None, 100) == 0.05 and schedule_warmup(0, 9) == 0.05


@pytest.mark.parametrize(
    ("build", "kwargs", "why"),
    [
        (lambda: _Plain("lists"), {}, "`_Plain.configure_optimizers` already returns an LR scheduler"),
        (lambda: _Plain("dict"), {}, "`_Plain.configure_optimizers` already returns an LR scheduler"),
        (lambda: DemoClassifier(width=4, scheduler_config=SchedulerConfig("step")), {}, "already returns an LR"),
        # asked with a stand-in for the planned run (autotune.optim.PlannedRun), as the trials' optimizer is
        (lambda: _Plain("needs_trainer"), {}, "`_Plain.configure_optimizers` already returns an LR scheduler"),
        (
            lambda: _Plain("reads_datamodule"),
            {},
            "could not check whether it returns a scheduler: "
            "`configure_optimizers` cannot run outside a fit (AttributeError: "
            "'PlannedRun' object has no attribute 'datamodule')",
        ),
        (
            lambda: _Plain("sgd"),
            {},
            "its evidence is for Adam-type optimizers (Adam, AdamW, NAdam, RAdam, Adamax), "
            "and `configure_optimizers` returns SGD, whose learning rate is kept",
        ),
        (lambda: DemoClassifier(width=4, optimizer_config={"name": "sgd", "lr": 0.1}), {}, "returns SGD"),
        (lambda: _Plain(), {"max_epochs": -1}, "the run has no planned length (pass max_epochs or max_steps)"),
        (lambda: _Plain(), {"max_epochs": None}, "the run has no planned length"),
        (
            lambda: _Plain(),
            {"callbacks": [FastSchedule()]},
            "already has a callback that sets the learning rate (FastSchedule)",
        ),
        (lambda: _Plain(), {"callbacks": [StochasticWeightAveraging(swa_lrs=1e-2)]}, "(StochasticWeightAveraging)"),
        (lambda: _Plain(), {"callbacks": [LRFinder()]}, "sets the learning rate (LRFinder)"),
    ],
    ids=[
        "lists",
        "dict",
        "mixin-scheduler",
        "needs-trainer",
        "reads-datamodule",
        "sgd",
        "mixin-sgd",
        "unbounded",
        "no-max-epochs",
        "fast-schedule",
        "swa",
        "lr-finder",
    ],
)
def test_schedule_left_out_where_fast_schedule_cannot_run(build, kwargs, why):
    plan = _plan(build(), **kwargs)
    assert plan.choices == [] and not any(
        isinstance(cb, FastSchedule) and cb not in kwargs.get("callbacks", []) for cb in plan.callbacks
    )
    assert any(n.startswith("schedule not added: ") and why in n for n in plan.notes), plan.notes


def test_schedule_left_out_under_manual_optimization():
    model = _Plain()
    model.automatic_optimization = False
    plan = _plan(model)
    assert plan.callbacks == [] and any("manual optimization" in n for n in plan.notes)


def test_returns_scheduler_reads_every_return_form():
    opt = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, 1)
    plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(opt)
    without = [opt, [opt], (opt,), {"optimizer": opt}, {"optimizer": opt, "lr_scheduler": None}, ([opt], []), None]
    monitored = [{"optimizer": opt, "lr_scheduler": {"scheduler": plateau, "monitor": "val_loss"}}]
    with_one = [
        ([opt], [sched]),
        {"optimizer": opt, "lr_scheduler": sched},
        monitored,
        ([opt], [{"scheduler": sched}]),
        [opt, sched],
    ]
    assert not any(_returns_scheduler(c) for c in without)
    assert all(_returns_scheduler(c) for c in with_one)


def test_a_plain_modules_peak_follows_a_larger_batch_a_mixin_one_is_scaled_by_apply():
    settings = {"schedule": 3.0, "batch_scale": 2}
    (plain,) = method_callbacks(settings, {"max_epochs": 2}, [], _Plain(), 0.05, 32)
    assert (plain.base_batch_size, plain.batch_size, plain.lr_scaling) == (32, 64, "sqrt")
    (mixin,) = method_callbacks(settings, {"max_epochs": 2}, [], DemoClassifier(width=4), 0.05, 32)
    assert mixin.base_batch_size is None and mixin.batch_size is None  # TunePlan.apply scales its optimizer_config


def test_cached_plan_rebuilds_the_schedule_and_rechecks_the_model(tmp_path):
    first = _plan(cache=True, cache_dir=tmp_path)
    again = _plan(cache=True, cache_dir=tmp_path)
    assert again.from_cache and [type(cb) for cb in again.callbacks] == [FastSchedule]
    assert again.choices[0].as_dict() == first.choices[0].as_dict()
    unbounded = _plan(cache=True, cache_dir=tmp_path, max_epochs=-1)  # the same key, a run the schedule cannot take
    assert (
        unbounded.from_cache and unbounded.callbacks == [] and any("schedule not added" in n for n in unbounded.notes)
    )


class _LRs(L.Callback):
    def __init__(self) -> None:
        self.lrs: list[float] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.lrs.append(trainer.optimizers[0].param_groups[0]["lr"])


class _StopAfter(L.Callback):
    def __init__(self, epoch: int) -> None:
        self.epoch = epoch

    def on_train_epoch_end(self, trainer, pl_module):
        if trainer.current_epoch == self.epoch:
            trainer.should_stop = True


def _fit(root, ckpt_path: str | None = None, stop_after: int | None = None) -> tuple[_LRs, L.LightningModule]:
    L.seed_everything(0)
    model = DemoClassifier(width=4)
    plan = _plan(model, max_epochs=4)
    plan.apply(model)
    callbacks, kwargs = plan
    lrs = _LRs()
    stop = [_StopAfter(stop_after)] if stop_after is not None else []
    trainer = L.Trainer(
        callbacks=[*callbacks, lrs, *stop, ModelCheckpoint(dirpath=root, save_last=True)],
        **kwargs,
        default_root_dir=root,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, train_dataloaders=_loader(), ckpt_path=ckpt_path)
    return lrs, model


def test_fit_follows_warmup_peak_and_linear_decay_and_a_resume_continues_it(tmp_path):
    whole, model_whole = _fit(tmp_path / "whole")
    total = 4 * STEPS_PER_EPOCH
    warm = round(0.05 * 4 * STEPS_PER_EPOCH)  # a quarter epoch is 6%: capped at 5%
    assert len(whole.lrs) == total and whole.lrs[0] < 3e-3
    assert max(whole.lrs) == pytest.approx(3e-3) and whole.lrs[warm] == pytest.approx(3e-3)
    assert all(a > b for a, b in zip(whole.lrs[warm:], whole.lrs[warm + 1 :]))  # linear decay to the end
    assert whole.lrs[-1] == pytest.approx(3e-3 * (1 - (total - 1 - warm) / (total - warm)))
    # stopped after 2 of the 4 planned epochs, then resumed from the checkpoint: the same curve and the same weights
    first, _ = _fit(tmp_path / "legs", stop_after=1)
    assert first.lrs == pytest.approx(whole.lrs[: 2 * STEPS_PER_EPOCH])
    ckpt = torch.load(tmp_path / "legs" / "last.ckpt", weights_only=True)  # plain data: the factor is saved as a dict
    assert ckpt["lr_schedulers"][0]["last_epoch"] == 2 * STEPS_PER_EPOCH
    resumed, model_resumed = _fit(tmp_path / "legs", ckpt_path=str(tmp_path / "legs" / "last.ckpt"))
    assert resumed.lrs == pytest.approx(whole.lrs[2 * STEPS_PER_EPOCH :])
    for k, v in model_whole.state_dict().items():
        assert torch.allclose(v, model_resumed.state_dict()[k], atol=1e-6), k
