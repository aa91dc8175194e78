"""autotune against the user's own code: the trials time the optimizer ``configure_optimizers`` returns, and the plan
keeps only what :meth:`TunePlan.apply` can set for this model and data (issue 23)."""

from __future__ import annotations

import re

import lightning as L
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, SubsetRandomSampler

from lightning_speedups.autotune import autotune, trials
from lightning_speedups.autotune.optim import trial_optimizer, with_implementation
from lightning_speedups.callbacks.fast_schedule import FastSchedule
from lightning_speedups.callbacks.optimizer_kernel import OptimizerKernel
from lightning_speedups.demo import DemoClassifier
from tests.test_autotune import FakeMachine, _loader, _patched


class Plain(L.LightningModule):
    """A plain module: its own optimizer (SGD with momentum and two param groups), returned in ``form``."""

    def __init__(self, form: str = "optimizer") -> None:
        super().__init__()
        self.form = form
        self.body = nn.Sequential(nn.Conv2d(3, 4, 3), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.head = nn.Linear(4, 10)

    def training_step(self, batch, batch_idx):  # noqa: ANN001, ANN201
        x, y = batch
        loss = nn.functional.cross_entropy(self.head(self.body(x)), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):  # noqa: ANN201
        opt = torch.optim.SGD(
            [{"params": self.body.parameters()}, {"params": self.head.parameters(), "lr": 0.5}], lr=0.05, momentum=0.9
        )
        sched = torch.optim.lr_scheduler.StepLR(opt, 1)
        forms = {
            "optimizer": opt,
            "list": [opt],
            "tuple": (opt,),
            "pair": ([opt], [sched]),
            "dict": {"optimizer": opt, "lr_scheduler": sched},
            "dicts": [{"optimizer": opt}],
            "adam": torch.optim.Adam(self.parameters(), lr=1e-3),
        }
        if self.form == "trainer":
            return torch.optim.SGD(self.parameters(), lr=0.1 * self.trainer.max_epochs)
        if self.form == "planned":  # the usual schedule sized by the run (OneCycleLR, HF's linear warm-up)
            total = self.trainer.estimated_stepping_batches
            sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=[0.05, 0.5], total_steps=total)
            return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}
        return forms[self.form]


@pytest.mark.parametrize("form", ["optimizer", "list", "tuple", "pair", "dict", "dicts"])
def test_the_trials_time_the_optimizer_configure_optimizers_returns(form, monkeypatch):
    # before issue 23 every trial stepped AdamW(lr=1e-4), whatever the model's own optimizer was
    model = Plain(form)
    seen = set()
    real = torch.optim.Optimizer.zero_grad
    monkeypatch.setattr(torch.optim.Optimizer, "zero_grad", lambda opt, *a, **k: seen.add(opt) or real(opt, *a, **k))
    ctx = trials.TrialContext(model, next(iter(_loader())), torch.device("cpu"), 10, 0.05, float("inf"), {})
    trials.make_step(ctx, {})()
    (opt,) = seen  # the optimizer the trial stepped
    assert type(opt) is torch.optim.SGD and [g["lr"] for g in opt.param_groups] == [0.05, 0.5]
    assert opt.defaults["momentum"] == 0.9 and ctx.notes == []
    users = {id(p) for p in model.parameters()}
    assert not any(id(p) in users for g in opt.param_groups for p in g["params"])  # built on the copy's parameters
    assert all(p.grad is None for p in model.parameters())


def test_the_kernel_is_set_on_the_users_optimizer_class():
    model = Plain()
    opt, why = trial_optimizer(model)
    assert why is None
    foreach = with_implementation(opt, "foreach")
    assert type(foreach) is torch.optim.SGD and foreach.defaults["foreach"] is True
    assert [g["lr"] for g in foreach.param_groups] == [0.05, 0.5] and foreach.defaults["momentum"] == 0.9
    assert [len(g["params"]) for g in foreach.param_groups] == [len(g["params"]) for g in opt.param_groups]
    assert with_implementation(opt, None) is opt and with_implementation(opt, "for_loop") is opt
    adamw = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)  # its defaults hold a derived key
    for impl in ("fused", "foreach"):
        again = with_implementation(adamw, impl)
        assert again is not adamw and again.defaults[impl] is True and again.defaults["weight_decay"] == 0.1

    class NoKernels(torch.optim.SGD):  # a class that takes no fused/foreach: the optimizer as it was
        def __init__(
            self,
            params,
            lr=0.1,
            momentum=0.0,
            dampening=0.0,
            weight_decay=0.0,
            nesterov=False,  # noqa: ANN001
            maximize=False,
            differentiable=False,
        ) -> None:
            super().__init__(params, lr=lr, momentum=momentum)

    plain = NoKernels(model.parameters())
    assert with_implementation(plain, "fused") is plain


def test_a_configure_optimizers_that_needs_a_fit_falls_back_to_adamw_with_one_note():
    ctx = trials.TrialContext(Plain("trainer"), next(iter(_loader())), torch.device("cpu"), 10, 0.05, float("inf"), {})
    trials.make_step(ctx, {})()
    trials.make_step(ctx, {"implementation": "foreach"})()
    (note,) = ctx.notes
    assert note.startswith(
        "the trials timed AdamW (lr 1e-4), not the model's optimizer: `configure_optimizers` "
        "cannot run outside a fit (AttributeError"
    )
    assert "'max_epochs'" in note and "autotune answers only self.trainer's estimated_stepping_batches" in note


def test_a_configure_optimizers_sized_by_the_planned_run_is_timed_as_written(monkeypatch):
    # self.trainer.estimated_stepping_batches needs a fit: the trial's copy gets a stand-in for the planned run
    model = Plain("planned")
    seen = set()
    real = torch.optim.Optimizer.zero_grad
    monkeypatch.setattr(torch.optim.Optimizer, "zero_grad", lambda opt, *a, **k: seen.add(opt) or real(opt, *a, **k))
    ctx = trials.TrialContext(model, next(iter(_loader())), torch.device("cpu"), 40, 0.05, float("inf"), {})
    trials.make_step(ctx, {})()
    (opt,) = seen
    assert type(opt) is torch.optim.SGD and opt.defaults["momentum"] == 0.9 and ctx.notes == []
    with pytest.raises(RuntimeError, match="not attached to a `Trainer`"):
        model.trainer  # noqa: B018  (the user's model never had the stand-in)
    opt, why = trial_optimizer(Plain("planned"))  # no planned length given: the fit-only error as before
    assert opt is None and why.startswith("`configure_optimizers` cannot run outside a fit (RuntimeError")
    copy = Plain("planned")
    opt, why = trial_optimizer(copy, planned_steps=40)
    assert why is None and type(opt) is torch.optim.SGD
    with pytest.raises(RuntimeError, match="not attached"):
        copy.trainer  # noqa: B018  (detached again after the call)


def test_the_kernel_is_offered_to_a_plain_module_and_set_at_the_fits_start(monkeypatch):
    # issue 50: the plan declined a plain module's own optimizer ("builds its own optimizer, which the plan does not
    # rewrite"); it now times the kernel on that optimizer and sets it through OptimizerKernel
    machine = FakeMachine({"optimizer_only": 0.3, "fused": 0.7})
    _patched(monkeypatch, machine)
    plan = autotune(
        Plain("dict"),
        _loader(),
        candidates=["optimizer"],
        methods=[],
        cache=False,
        clock=machine.clock,
        budget_s=2000.0,
        max_epochs=1,
    )
    assert plan.settings["implementation"] == "fused" and re.search(r"optimizer +fused", plan.to_text())
    (kernel,) = [cb for cb in plan.callbacks if isinstance(cb, OptimizerKernel)]
    model = Plain("dict")
    plan.apply(model)
    assert not any("not applied" in n for n in plan.notes)
    assert [cb for cb in plan.callbacks if isinstance(cb, OptimizerKernel)] == [kernel]  # apply adds no second one
    trainer = L.Trainer(
        callbacks=plan.callbacks, max_steps=2, logger=False, enable_checkpointing=False, enable_progress_bar=False
    )
    trainer.fit(model, _loader())
    (opt,) = trainer.optimizers
    assert type(opt) is torch.optim.SGD and all(g["fused"] for g in opt.param_groups)
    assert trainer.lr_scheduler_configs[0].scheduler.optimizer is opt and kernel.replaced == ["SGD"]


def test_apply_rebuilds_a_plain_dataloader_at_the_planned_batch(monkeypatch):
    # issue 23: `plan.apply(model, loader)` raised "batch_size attribute should not be set after DataLoader is
    # initialized" whenever the plan doubled the batch
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
    assert plan.settings["batch_scale"] == 2 and plan.train_dataloaders is None
    assert re.search(r"batch_size +x2 ", plan.to_text())  # a multiple of the user's batch, not a batch of 2
    model = DemoClassifier(width=4)
    lr = model.optimizer_config.lr
    plan.apply(model, loader)
    rebuilt = plan.train_dataloaders
    assert isinstance(rebuilt, DataLoader) and rebuilt is not loader and rebuilt.batch_size == 16
    assert rebuilt.dataset is loader.dataset and loader.batch_size == 8 and len(rebuilt) == 2
    assert model.optimizer_config.lr == pytest.approx(lr * 2**0.5)  # the sqrt rule, for a batch that was applied


def test_a_loader_that_cannot_be_rebuilt_keeps_its_batch_and_says_so_at_tune_time(monkeypatch):
    machine = FakeMachine({"x2": 0.4, "x4": 1.0})
    _patched(monkeypatch, machine)
    data = _loader(n=32, batch_size=8).dataset
    loader = DataLoader(data, batch_size=8, sampler=SubsetRandomSampler(range(24)))
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
    assert plan.choices == [] and plan.settings.get("batch_scale", 1) == 1
    assert (
        "batch_size not tried: the training data is a DataLoader with a custom sampler or batch_sampler, which "
        "cannot be rebuilt at another batch size"
    ) in plan.explain(width=None)
    model = DemoClassifier(width=4)
    lr = model.optimizer_config.lr
    plan.apply(model, loader)  # nothing to apply, nothing raised
    assert plan.train_dataloaders is None and model.optimizer_config.lr == lr


def test_the_schedule_peak_does_not_follow_a_batch_that_was_not_applied(monkeypatch):
    machine = FakeMachine({"x2": 0.4, "x4": 1.0})
    _patched(monkeypatch, machine)
    plan = autotune(
        Plain("adam"),
        _loader(n=32, batch_size=8),
        candidates=["batch_size"],
        methods=["schedule"],
        cache=False,
        clock=machine.clock,
        budget_s=2000.0,
        max_epochs=2,
    )
    (schedule,) = [cb for cb in plan.callbacks if isinstance(cb, FastSchedule)]
    assert plan.settings["batch_scale"] == 2 and (schedule.base_batch_size, schedule.batch_size) == (8, 16)
    plan.apply(Plain("adam"))  # no data given, no `batch_size` attribute: the batch stays, and so must the peak
    assert any(n.startswith("batch x2 not applied") for n in plan.notes)
    assert schedule.base_batch_size is None and schedule.batch_size is None


class _CountingData(L.LightningDataModule):
    """Random images; counts its ``setup`` calls by stage (the expensive part of a user's DataModule)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def setup(self, stage: str) -> None:
        self.calls.append(getattr(stage, "value", stage))
        g = torch.Generator().manual_seed(len(self.calls))
        self.data = torch.utils.data.TensorDataset(torch.randn(16, 3, 8, 8, generator=g), torch.randint(0, 10, (16,)))

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.data, batch_size=8)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.data, batch_size=8)


@pytest.mark.parametrize("cached", [False, True])
def test_the_fit_reuses_the_setup_autotune_ran_once(cached, tmp_path):
    import pickle

    kw = {"candidates": [], "methods": [], "budget_s": 2.0, "cache_dir": str(tmp_path), "accelerator": "cpu"}
    if cached:
        autotune(Plain(), _CountingData(), max_steps=2, **kw)
    model = Plain()
    data = _CountingData()
    plan = autotune(model, data, max_steps=2, **kw)
    assert plan.from_cache is cached and data.calls == ["fit"]
    plan.apply(model, data)
    assert plan.notes[-1] == "_CountingData.setup('fit') already ran for autotune: the fit reuses it"
    assert pickle.loads(pickle.dumps(data)).calls == ["fit"]  # still pickles (ddp_spawn sends it to the ranks)
    trainer = L.Trainer(
        max_steps=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        callbacks=plan.callbacks,
    )
    trainer.fit(model, datamodule=data)
    assert data.calls == ["fit"] and trainer.global_step == 2 and "setup" not in vars(data)
    trainer.fit(model, datamodule=data)  # every later call runs the DataModule's own setup
    assert data.calls == ["fit", "fit"]
    plan.apply(model, data)
    data.setup("validate")  # another stage first: it runs, and the DataModule's own setup is back
    assert data.calls == ["fit", "fit", "validate"] and "setup" not in vars(data)


def test_a_datamodule_autotune_did_not_read_keeps_its_setup():
    model = Plain()
    read = _CountingData()
    other = _CountingData()
    plan = autotune(model, read, candidates=[], methods=[], cache=False, budget_s=2.0, accelerator="cpu", max_steps=2)
    plan.apply(model, other)
    assert "setup" not in vars(other) and not any("reuses" in n for n in plan.notes)
    trainer = L.Trainer(
        max_steps=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
    )
    trainer.fit(model, datamodule=other)
    assert other.calls == ["fit"]


def test_plan_fit_applies_the_plan_and_fits_in_one_call():
    class Seen(L.Callback):
        def __init__(self) -> None:
            self.callbacks: list[str] = []

        def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
            self.callbacks = [type(cb).__name__ for cb in trainer.callbacks]

    model = DemoClassifier(width=4)
    plan = autotune(model, _loader(), budget_s=0.5, cache=False, max_steps=3, logger=False)
    seen = Seen()
    trainer = plan.fit(model, _loader(), callbacks=[seen], enable_checkpointing=False, enable_progress_bar=False)
    assert trainer.global_step == 3 and trainer.max_steps == 3  # the plan's arguments, with the caller's added
    assert "Seen" in seen.callbacks
    assert all(type(cb).__name__ in seen.callbacks for cb in plan.callbacks)
