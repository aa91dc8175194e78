"""ThroughputBatchSizeFinder on the demo task: restore exactness, OOM, LR scaling, accumulation, resume, DDP."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import Callback, GradientAccumulationScheduler, ModelCheckpoint
from torch.utils.data import DataLoader, TensorDataset

from lightning_speedups._errors import SpeedupConfigError
from lightning_speedups.callbacks.batch_size import ThroughputBatchSizeFinder
from lightning_speedups.demo import DemoClassifier, DigitsDataModule
from lightning_speedups.tuner import find_batch_size
from tests.helpers import quiet_trainer


def Digits(batch_size: int = 32) -> DigitsDataModule:  # noqa: N802
    return DigitsDataModule(batch_size=batch_size, size=16)


TINY = dict(steps_per_trial=1, warmup_steps=0, verbose=False, trial_min_time=None)


def finder(**kw: Any) -> ThroughputBatchSizeFinder:
    return ThroughputBatchSizeFinder(**{**TINY, **kw})


class OOMAbove(DemoClassifier):
    """Raises a (simulated) CUDA out-of-memory error for batches of ``limit`` or more (only on ``rank`` if given)."""

    def __init__(self, limit: int = 64, rank: int | None = None, **kw: Any) -> None:
        super().__init__(width=8, **kw)
        self.limit = limit
        self.oom_rank = rank

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        if batch[0].shape[0] >= self.limit and self.oom_rank in (None, self.global_rank):
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (simulated)")
        return super().training_step(batch, batch_idx)


class BatchSizes(Callback):
    """Records the batch sizes training actually used, per epoch."""

    def __init__(self) -> None:
        self.seen: dict[int, list[int]] = {}

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, idx: int) -> None:
        self.seen.setdefault(trainer.current_epoch, []).append(batch[0].shape[0])


def test_batch_size_misconfiguration():
    with pytest.raises(SpeedupConfigError, match="`init_val`=128 is larger than `max_val`=64"):
        ThroughputBatchSizeFinder(init_val=128, max_val=64)
    with pytest.raises(SpeedupConfigError, match="`init_val`=0 is invalid. Allowed values: a positive integer"):
        ThroughputBatchSizeFinder(init_val=0)
    with pytest.raises(SpeedupConfigError, match="`memory_budget`=0 is out of range"):
        ThroughputBatchSizeFinder(memory_budget=0)
    with pytest.raises(SpeedupConfigError, match="`memory_budget`=1.2 is out of range"):
        ThroughputBatchSizeFinder(memory_budget=1.2)
    with pytest.raises(SpeedupConfigError, match="`mode`='binsearch' is not supported"):
        ThroughputBatchSizeFinder(mode="binsearch")
    with pytest.raises(SpeedupConfigError, match=r"`lr_scaling`='cubic' is not supported. Allowed values: 'auto', "):
        ThroughputBatchSizeFinder(lr_scaling="cubic")
    with pytest.raises(SpeedupConfigError, match="`scale_lr`='cubic' is not supported"):
        ThroughputBatchSizeFinder(scale_lr="cubic")
    with pytest.raises(SpeedupConfigError, match="`lr_scaling`='linear' cannot be combined with `keep_global_batch`"):
        ThroughputBatchSizeFinder(lr_scaling="linear", keep_global_batch=True)
    with pytest.raises(SpeedupConfigError, match="`scale_lr`='linear' cannot be combined with `keep_global_batch`"):
        ThroughputBatchSizeFinder(scale_lr="linear", keep_global_batch=True)
    with pytest.raises(SpeedupConfigError, match="`scale_lr`='sqrt' and `lr_scaling`='linear' were both given"):
        ThroughputBatchSizeFinder(scale_lr="sqrt", lr_scaling="linear")
    with pytest.raises(SpeedupConfigError, match="`keep_global_batch`=-4 is invalid"):
        ThroughputBatchSizeFinder(keep_global_batch=-4)
    with pytest.raises(SpeedupConfigError, match="`attr_name`='batch size' is invalid"):
        ThroughputBatchSizeFinder(attr_name="batch size")
    with pytest.raises(SpeedupConfigError, match=r"`rerun_at_epochs`=\[-1\] is invalid"):
        ThroughputBatchSizeFinder(rerun_at_epochs=[-1])
    with pytest.raises(SpeedupConfigError, match="`exit_after_search`='yes' is invalid. Allowed values: True or False"):
        ThroughputBatchSizeFinder(exit_after_search="yes")
    with pytest.raises(SpeedupConfigError, match="`search_time`=0 is out of range"):
        ThroughputBatchSizeFinder(search_time=0)
    with pytest.raises(SpeedupConfigError, match="`clock`=3 is invalid. Allowed values: a callable returning seconds"):
        ThroughputBatchSizeFinder(clock=3)

    def fit(cb: Callback, dm: Any = None, loader: Any = None, **kw: Any) -> None:
        trainer = quiet_trainer(max_steps=1, callbacks=[cb] + kw.pop("extra", []), **kw)
        trainer.fit(DemoClassifier(width=8), train_dataloaders=loader, datamodule=dm)

    with pytest.raises(
        SpeedupConfigError,
        match="`attr_name`='micro_batch' was not found. Looked in: the model, "
        "the datamodule, `model.hparams` and `datamodule.hparams`",
    ):
        fit(finder(attr_name="micro_batch"), Digits())
    with pytest.raises(SpeedupConfigError, match="asks for 5000 samples per optimizer step but the training set has"):
        fit(finder(keep_global_batch=5000), Digits())
    with pytest.raises(SpeedupConfigError, match="target 8 is smaller than `init_val`=16"):
        fit(finder(keep_global_batch=8, init_val=16), Digits())
    with pytest.raises(SpeedupConfigError, match="cannot be used with a `GradientAccumulationScheduler`"):
        fit(finder(keep_global_batch=True), Digits(), extra=[GradientAccumulationScheduler({0: 2})])

    class MyLoader(DataLoader):
        pass

    data = TensorDataset(torch.randn(64, 3, 32, 32), torch.randint(0, 10, (64,)))
    with pytest.raises(SpeedupConfigError, match="is a `MyLoader`, whose batch size cannot be changed"):
        fit(finder(), loader=MyLoader(data, batch_size=8))

    class FixedDM(DigitsDataModule):
        def train_dataloader(self) -> DataLoader:
            return DataLoader(self.train_set, batch_size=10)

    with pytest.raises(SpeedupConfigError, match="was set to 16 but the train dataloader still uses batch size 10"):
        fit(finder(), FixedDM())
    assert os.listdir(".") == []


def _train(cb: Callback | None, steps: int = 2) -> dict[str, torch.Tensor]:
    L.seed_everything(0, verbose=False)
    dm = Digits(batch_size=32)
    model = DemoClassifier(width=8)
    trainer = quiet_trainer(max_steps=steps, limit_val_batches=0, callbacks=[cb] if cb else [])
    trainer.fit(model, datamodule=dm)
    return {
        **model.state_dict(),
        **{f"opt.{k}": v["exp_avg"] for k, v in trainer.optimizers[0].state_dict()["state"].items()},
    }


def test_batch_size_fit_restores_training_exactly():
    cb = finder(mode="max_fit", init_val=16, max_val=32, progress_bar=True)
    with_search = _train(cb)
    plain = _train(None)
    # trial steps changed weights, optimizer state, BN stats, metrics and RNG: all were put back bitwise
    assert cb.result is not None and [t.batch_size for t in cb.result.trials] == [16, 32]
    assert cb.result.chosen == 32 and cb.result.stop_reason == "max_val"
    assert set(with_search) == set(plain)
    assert all(torch.equal(with_search[k], plain[k]) for k in plain)
    assert os.listdir(".") == []


def test_batch_size_throughput_mode_logs_table(caplog):
    dm = Digits(batch_size=32)
    cb = ThroughputBatchSizeFinder(init_val=8, max_val=32, steps_per_trial=1, warmup_steps=0)
    model = DemoClassifier(width=8)
    model.train_acc.eval()  # a module left in eval mode stays in eval mode
    with caplog.at_level("INFO"):
        quiet_trainer(max_steps=1, limit_val_batches=0, callbacks=[cb]).fit(model, datamodule=dm)
    assert cb.result.chosen in [t.batch_size for t in cb.result.trials] and dm.batch_size == cb.result.chosen
    assert cb.result.stop_reason in ("plateau", "plateau (gain < min_gain)", "max_val")
    assert "samples/s" in caplog.text and "chosen" in caplog.text
    assert model.train_acc.training is False


def test_batch_size_trials_are_budgeted_and_warm_up_once():
    class Steps(DemoClassifier):
        def __init__(self) -> None:
            super().__init__(width=8)
            self.sizes: list[int] = []

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            self.sizes.append(batch[0].shape[0])
            return super().training_step(batch, batch_idx)

    model = Steps()
    # confirm_rounds=1: single trials, so the steps below are all there is (no re-measurement under noise)
    result = find_batch_size(
        quiet_trainer(max_epochs=1),
        model,
        Digits(),
        mode="sweep",
        init_val=16,
        max_val=128,
        steps_per_trial=3,
        warmup_steps=1,
        trial_samples=64,
        trial_time=None,
        verbose=False,
        confirm_rounds=1,
        trial_min_time=None,
    )
    # 16: one warm-up + 3 timed (48 samples < 64); 32: 2 timed (64 samples); 64 and 128: one step each; no warm-up
    # after the first size on CPU
    assert model.sizes == [16] * 4 + [32] * 2 + [64, 128]
    assert [len(t.step_times) for t in result.trials] == [3, 2, 1, 1]
    assert all(t.samples_per_s == max(t.batch_size / dt for dt in t.step_times) for t in result.trials)


def test_batch_size_trials_of_millisecond_steps_last_trial_min_time():
    """Steps of a few milliseconds: each trial goes on past ``trial_samples`` until its timed steps took
    ``trial_min_time`` (a CPU-bound neighbour's time slice is several milliseconds)."""
    result = find_batch_size(
        quiet_trainer(max_epochs=1),
        DemoClassifier(width=4),
        Digits(),
        mode="sweep",
        init_val=16,
        max_val=64,
        trial_samples=16,
        trial_min_time=0.05,
        verbose=False,
        confirm_rounds=1,
    )
    assert all(sum(t.step_times) >= 0.05 for t in result.trials)
    assert any(len(t.step_times) > 1 for t in result.trials)  # one 16-sample step would have ended every trial


def test_batch_size_restores_when_step_raises():
    class Boom(DemoClassifier):
        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            if batch[0].shape[0] == 32:
                raise ValueError("boom at 32")
            return super().training_step(batch, batch_idx)

    model = Boom(width=8)
    dm = Digits(batch_size=8)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.get_rng_state()
    with pytest.raises(ValueError, match="boom at 32"):
        quiet_trainer(max_steps=1, callbacks=[finder(init_val=16, max_val=64)]).fit(model, datamodule=dm)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert torch.equal(torch.get_rng_state(), rng)
    assert dm.batch_size == 8 and os.listdir(".") == []


def test_batch_size_injectable_clock():
    ticks = [0.0]

    def clock() -> float:  # every reading 0.5 s later: each step "takes" 0.5 s whatever its size
        ticks[0] += 0.5
        return ticks[0]

    cb = finder(init_val=16, max_val=64, steps_per_trial=3, trial_time=None, clock=clock)
    quiet_trainer(max_steps=1, limit_val_batches=0, callbacks=[cb]).fit(DemoClassifier(width=8), datamodule=Digits())
    # equal step times (no noise measured): the largest size trains the most samples/s, nothing to re-check
    assert [t.batch_size for t in cb.result.trials] == [16, 32, 64] and cb.result.chosen == 64
    assert all(t.step_times == [0.5] * len(t.step_times) and t.elapsed_s > 0.5 for t in cb.result.trials)
    assert not cb.result.remeasured and cb.result.search_time_s == pytest.approx(ticks[0] - 0.5)


def test_batch_size_simulated_oom_steps_back():
    cb = finder(mode="max_fit", init_val=16, max_val=1024)
    dm = Digits(batch_size=8)
    quiet_trainer(max_steps=1, limit_val_batches=0, callbacks=[cb]).fit(OOMAbove(limit=64), datamodule=dm)
    assert [(t.batch_size, t.status) for t in cb.result.trials] == [(16, "ok"), (32, "ok"), (64, "oom")]
    assert cb.result.chosen == 32 and dm.batch_size == 32 and cb.result.stop_reason == "out of memory"


def test_batch_size_keeps_the_loaders_size_when_every_size_runs_over_the_memory_budget():
    """A model whose own training state fills the memory budget (a 412M ViT in 23 GB) runs at every size, over the
    budget: no size is chosen by speed, the loader's size stays with a warning, and the fit trains as it would have
    without the finder (it used to stop the fit with a RuntimeError)."""
    cb = finder(init_val=16, max_val=64, memory_budget=1e-6)
    dm = Digits(batch_size=8)
    seen = BatchSizes()
    with pytest.warns(UserWarning, match=r"exceeds the memory budget.*batch size 8 is kept.*`memory_budget`"):
        quiet_trainer(max_steps=2, limit_val_batches=0, callbacks=[cb, seen]).fit(DemoClassifier(width=8), dm)
    assert [t.batch_size for t in cb.result.trials] == [16, 8, 4, 2, 1]
    assert all(t.status == "over_budget" for t in cb.result.trials)
    assert cb.result.chosen == 8 and dm.batch_size == 8 and seen.seen[0] == [8, 8]
    assert cb.result.stop_reason.startswith("no size within the memory budget")
    # a size that runs out of memory is another matter: the model cannot train here at any size
    with pytest.raises(RuntimeError, match="even batch size 1 runs out of memory"):
        quiet_trainer(max_steps=1, callbacks=[finder(init_val=4)]).fit(OOMAbove(limit=1), Digits(batch_size=8))


class WithScheduler(DemoClassifier):
    """SGD (or ``opt``) with a scheduler (``sched(optimizer)``, default StepLR) from ``configure_optimizers``."""

    def __init__(self, opt: Any = None, sched: Any = None, **kw: Any) -> None:
        super().__init__(width=8, **kw)
        self.make_opt = opt or (lambda p: torch.optim.SGD(p, lr=0.1))
        self.make_sched = sched or (lambda o: torch.optim.lr_scheduler.StepLR(o, 100))

    def configure_optimizers(self) -> Any:
        opt = self.make_opt(self.parameters())
        return {"optimizer": opt, "lr_scheduler": {"scheduler": self.make_sched(opt), "interval": "step"}}


@pytest.mark.parametrize("rule, factor", [("linear", 4.0), ("sqrt", 2.0)])
def test_batch_size_scale_lr(rule, factor):
    cb = finder(mode="max_fit", init_val=64, max_val=64, lr_scaling=rule)
    trainer = quiet_trainer(max_steps=1, limit_val_batches=0, callbacks=[cb])
    trainer.fit(WithScheduler(), datamodule=Digits(batch_size=16))
    assert cb.result.lr_factor == pytest.approx(factor)
    assert trainer.optimizers[0].param_groups[0]["lr"] == pytest.approx(0.1 * factor)
    assert trainer.lr_scheduler_configs[0].scheduler.base_lrs == [pytest.approx(0.1 * factor)]
    # SpeedupMixin model: its optimizer_config follows, so rebuilt optimizers keep the scaled lr
    model = DemoClassifier(width=8, optimizer_config={"name": "sgd", "lr": 0.1})
    cb = finder(mode="max_fit", init_val=64, max_val=64, lr_scaling=rule)
    trainer = quiet_trainer(max_steps=1, limit_val_batches=0, callbacks=[cb])
    trainer.fit(model, datamodule=Digits(batch_size=16))
    assert model.optimizer_config.lr == pytest.approx(0.1 * factor)
    for group in trainer.optimizers[0].param_groups:
        assert group["lr"] == pytest.approx(0.1 * factor * group.get("lr_mult", 1.0))
    # the deprecated name still works
    with pytest.deprecated_call(match="`scale_lr` is deprecated, pass `lr_scaling` instead"):
        old = finder(mode="max_fit", init_val=64, max_val=64, scale_lr=rule)
    assert old.lr_scaling == rule


@pytest.mark.parametrize(
    "make_opt, rule, factor",
    [
        (lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9), "linear", 4.0),
        (lambda p: torch.optim.SGD(p, lr=0.1), "linear", 4.0),
        (lambda p: torch.optim.AdamW(p, lr=0.1), "sqrt", 2.0),
        (lambda p: torch.optim.RMSprop(p, lr=0.1), "sqrt", 2.0),
        (lambda p: torch.optim.Adagrad(p, lr=0.1), "sqrt", 2.0),
    ],
    ids=["sgd-momentum", "sgd", "adamw", "rmsprop", "adagrad"],
)
def test_batch_size_auto_lr_scaling_by_optimizer(make_opt, rule, factor):
    cb = finder(mode="max_fit", init_val=64, max_val=64)  # lr_scaling="auto" by default
    trainer = quiet_trainer(max_steps=1, limit_val_batches=0, callbacks=[cb])
    trainer.fit(WithScheduler(make_opt), datamodule=Digits(batch_size=16))
    name = type(trainer.optimizers[0]).__name__
    assert cb.result.lr_factor == pytest.approx(factor) and trainer.optimizers[0].param_groups[0]["lr"] == (
        pytest.approx(0.1 * factor)
    )
    # the summary line says what the lr got and why
    assert f"learning rate for batch 16 -> 64: x{factor:g} by the {rule} rule ({name}: " in cb.result.table()
    # a SpeedupMixin's Adam (the demo default): sqrt, and its config follows
    model = DemoClassifier(width=8)
    cb = finder(mode="max_fit", init_val=64, max_val=64)
    quiet_trainer(max_steps=1, limit_val_batches=0, callbacks=[cb]).fit(model, datamodule=Digits(batch_size=16))
    assert cb.result.lr_factor == pytest.approx(2.0) and model.optimizer_config.lr == pytest.approx(2e-3)
    # lr_scaling=None and an optimizer no rule is known for leave the lr alone, and say so
    cb = finder(mode="max_fit", init_val=64, max_val=64, lr_scaling=None)
    trainer = quiet_trainer(max_steps=1, limit_val_batches=0, callbacks=[cb])
    trainer.fit(WithScheduler(make_opt), datamodule=Digits(batch_size=16))
    assert cb.result.lr_factor == 1.0 and trainer.optimizers[0].param_groups[0]["lr"] == pytest.approx(0.1)
    assert "not scaled (`lr_scaling`=None)" in cb.result.lr_note


def test_batch_size_lr_scaling_keeps_a_schedule_going():
    """A OneCycle schedule scaled by the finder runs on as the unscaled one times the factor (peak and floor too)."""

    def onecycle(opt: torch.optim.Optimizer) -> Any:
        return torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=20)

    def lrs(cb: Any) -> list[float]:
        seen: list[float] = []

        class Record(Callback):
            def on_train_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
                seen.append(trainer.optimizers[0].param_groups[0]["lr"])

        trainer = quiet_trainer(max_steps=6, limit_val_batches=0, callbacks=[c for c in (cb, Record()) if c])
        trainer.fit(WithScheduler(sched=onecycle), datamodule=Digits(batch_size=16 if cb else 64))
        return seen

    scaled = lrs(finder(mode="max_fit", init_val=64, max_val=64, lr_scaling="linear"))
    plain = lrs(None)
    assert scaled == pytest.approx([4.0 * x for x in plain])


@pytest.mark.parametrize(
    "keep, accumulate, max_val, chosen, accumulated",
    [
        (True, 2, 4096, 64, 1),  # 32 x 2 kept: 64 fits, accumulation drops to 1
        (64, 1, 16, 16, 4),  # an explicit target: 16 per step, 4 accumulated
    ],
)
def test_batch_size_keep_global_batch(keep, accumulate, max_val, chosen, accumulated):
    cb = finder(mode="max_fit", init_val=16, max_val=max_val, keep_global_batch=keep)
    trainer = quiet_trainer(max_steps=1, limit_val_batches=0, callbacks=[cb], accumulate_grad_batches=accumulate)
    dm = Digits(batch_size=32)
    trainer.fit(DemoClassifier(width=8), datamodule=dm)
    assert [t.batch_size for t in cb.result.trials][-1] == chosen and dm.batch_size == chosen
    assert trainer.accumulate_grad_batches == accumulated and cb.result.accumulate_grad_batches == accumulated


def test_batch_size_resume_does_not_search_again(tmp_path, monkeypatch):
    ckpt = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True)
    cb = finder(mode="max_fit", init_val=32, max_val=64, lr_scaling="linear")
    trainer = quiet_trainer(max_steps=2, limit_val_batches=0, callbacks=[cb, ckpt], enable_checkpointing=True)
    trainer.fit(DemoClassifier(width=8), datamodule=Digits(batch_size=16))
    assert cb.result.chosen == 64 and trainer.optimizers[0].param_groups[0]["lr"] == pytest.approx(4e-3)

    def no_trials(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("searched again on resume")

    monkeypatch.setattr(ThroughputBatchSizeFinder, "_trial", no_trials)
    resumed = finder(mode="max_fit", init_val=32, max_val=64, lr_scaling="linear")
    dm = Digits(batch_size=16)
    model = DemoClassifier(width=8)
    seen = BatchSizes()
    trainer = quiet_trainer(max_steps=4, limit_val_batches=0, callbacks=[resumed, seen])
    trainer.fit(model, datamodule=dm, ckpt_path=str(tmp_path / "ckpt" / "last.ckpt"))
    assert resumed.result.chosen == 64 and len(resumed.history) == 1 and dm.batch_size == 64
    assert trainer.optimizers[0].param_groups[0]["lr"] == pytest.approx(4e-3)  # from the checkpoint, not rescaled
    assert model.optimizer_config.lr == pytest.approx(4e-3)
    assert seen.seen == {0: [64, 64]} and trainer.global_step == 4


def test_batch_size_resume_keeps_the_auto_scaled_lr_once(tmp_path, monkeypatch):
    """``lr_scaling="auto"`` (sqrt for AdamW) with a scheduler: the checkpoint holds the scaled lr and base lrs, the
    finder's state loads with ``weights_only=True``, and a resumed fit neither searches nor scales again."""

    def adamw(p: Any) -> torch.optim.Optimizer:
        return torch.optim.AdamW(p, lr=0.01)

    ckpt = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True)
    cb = finder(mode="max_fit", init_val=64, max_val=64)
    trainer = quiet_trainer(max_steps=2, limit_val_batches=0, callbacks=[cb, ckpt], enable_checkpointing=True)
    trainer.fit(WithScheduler(adamw), datamodule=Digits(batch_size=16))
    assert cb.result.lr_factor == pytest.approx(2.0) and "x2 by the sqrt rule (AdamW: Adam-type)" in cb.result.lr_note
    assert trainer.lr_scheduler_configs[0].scheduler.base_lrs == [pytest.approx(0.02)]
    saved = torch.load(tmp_path / "ckpt" / "last.ckpt", weights_only=True)
    (state,) = [v for k, v in saved["callbacks"].items() if "ThroughputBatchSizeFinder" in k]
    assert state["history"][0]["lr_factor"] == pytest.approx(2.0) and state["history"][0]["chosen"] == 64
    assert saved["lr_schedulers"][0]["base_lrs"] == [pytest.approx(0.02)]

    def no_trials(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("searched again on resume")

    monkeypatch.setattr(ThroughputBatchSizeFinder, "_trial", no_trials)
    resumed = finder(mode="max_fit", init_val=64, max_val=64)
    trainer = quiet_trainer(max_steps=4, limit_val_batches=0, callbacks=[resumed])
    trainer.fit(WithScheduler(adamw), datamodule=Digits(batch_size=16), ckpt_path=str(tmp_path / "ckpt" / "last.ckpt"))
    assert trainer.optimizers[0].param_groups[0]["lr"] == pytest.approx(0.02)  # scaled once, from the checkpoint
    assert trainer.lr_scheduler_configs[0].scheduler.base_lrs == [pytest.approx(0.02)]
    assert resumed.result.lr_factor == pytest.approx(2.0) and len(resumed.history) == 1


def test_batch_size_rerun_at_later_epoch():
    cb = finder(mode="max_fit", init_val=16, max_val=32, rerun_at_epochs=(1,))

    class Shrink(Callback):  # change the search space after epoch 0 so the re-run must pick another size
        def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
            cb.config = dataclasses.replace(cb.config, max_val=16)

    seen = BatchSizes()
    trainer = quiet_trainer(max_epochs=2, limit_train_batches=2, limit_val_batches=0, callbacks=[cb, Shrink(), seen])
    trainer.fit(DemoClassifier(width=8), datamodule=Digits(batch_size=8))
    assert seen.seen == {0: [32, 32], 1: [16, 16]}
    assert [r.epoch for r in cb.history] == [0, 1] and trainer.global_step == 4 and trainer.current_epoch == 2


def test_batch_size_with_dataloader_passed_to_fit():
    data = TensorDataset(torch.randn(200, 3, 32, 32), torch.randint(0, 10, (200,)))
    cb = finder(mode="max_fit", init_val=16, max_val=64)
    seen = BatchSizes()
    trainer = quiet_trainer(max_steps=2, callbacks=[cb, seen])
    trainer.fit(DemoClassifier(width=8), train_dataloaders=DataLoader(data, batch_size=8, shuffle=True))
    assert cb.result.chosen == 64 and cb.result.base_batch_size == 8 and seen.seen == {0: [64, 64]}


class _WriteResult(Callback):
    def __init__(self, out: str) -> None:
        self.out = out

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        cb = next(c for c in trainer.callbacks if isinstance(c, ThroughputBatchSizeFinder))
        record = {
            "chosen": cb.result.chosen,
            "dm": trainer.datamodule.batch_size,
            "trials": [[t.batch_size, t.status] for t in cb.result.trials],
        }
        Path(self.out, f"rank{trainer.global_rank}.json").write_text(json.dumps(record))


@pytest.mark.ddp
def test_batch_size_ddp_ranks_agree(tmp_path):
    # only rank 1 runs out of memory at 64: both ranks must still stop there and train with 32
    cb = finder(mode="max_fit", init_val=16, max_val=128)
    trainer = quiet_trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp_spawn",
        max_steps=1,
        limit_val_batches=0,
        callbacks=[cb, _WriteResult(str(tmp_path))],
        default_root_dir=tmp_path,
    )
    trainer.fit(OOMAbove(limit=64, rank=1), datamodule=Digits(batch_size=8))
    records = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    for rec in records:
        assert rec["chosen"] == 32 and rec["dm"] == 32
        assert rec["trials"] == [[16, "ok"], [32, "ok"], [64, "oom"]]


class _TokenLM(L.LightningModule):
    """Embedding + linear head over dict batches of token ids (what pad_collate builds)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(32, 8)
        self.head = torch.nn.Linear(8, 32)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        logits = self.head(self.emb(batch["input_ids"]))
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(), ignore_index=-100)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _token_loader() -> DataLoader:
    from lightning_speedups.data import pad_collate

    samples = [{"input_ids": torch.arange(1, 2 + i % 7)} for i in range(64)]
    for s in samples:
        s["labels"] = s["input_ids"].clone()
    return DataLoader(samples, batch_size=4, collate_fn=pad_collate(multiple_of=1))


def test_batch_size_measures_tokens_per_s_on_token_data():
    logged: list[dict[str, float]] = []

    class Memory(L.pytorch.loggers.Logger):
        name = "memory"
        version = 0

        def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
            logged.append(dict(metrics))

        def log_hyperparams(self, *args: Any, **kwargs: Any) -> None:
            pass

    cb = finder(init_val=4, max_val=16, mode="sweep")
    quiet_trainer(max_steps=1, callbacks=[cb], logger=Memory()).fit(_TokenLM(), train_dataloaders=_token_loader())
    result = cb.result
    assert result is not None and result.unit == "tokens"
    for t in result.trials:  # real tokens of each timed step: the samples' lengths (1..7), not the padded length
        assert t.unit == "tokens" and len(t.step_tokens) == len(t.step_times) == 1
        assert t.batch_size <= t.step_tokens[0] <= 7 * t.batch_size
        assert t.tokens_per_s == pytest.approx(t.step_tokens[0] / t.step_times[0])
    assert "tokens/s" in result.table() and "measured in real (non-pad) tokens/s" in result.table()
    metrics = {k: v for d in logged for k, v in d.items()}
    assert metrics["batch_size_finder/tokens_per_s"] == pytest.approx(result.trial(result.chosen).tokens_per_s)
    # unit="samples" keeps samples/s on the same data; image data stays in samples/s under "auto"
    plain = finder(init_val=4, max_val=8, mode="sweep", unit="samples")
    quiet_trainer(max_steps=1, callbacks=[plain]).fit(_TokenLM(), train_dataloaders=_token_loader())
    assert plain.result.unit == "samples" and all(t.tokens_per_s is None for t in plain.result.trials)
    images = finder(init_val=8, max_val=16, mode="sweep")
    trainer = quiet_trainer(max_steps=1, limit_val_batches=0, callbacks=[images])
    trainer.fit(DemoClassifier(width=8), datamodule=Digits())
    assert images.result.unit == "samples" and all(not t.step_tokens for t in images.result.trials)


def test_batch_size_unit_misconfiguration():
    with pytest.raises(SpeedupConfigError, match="`unit`='tokens' is not supported. Allowed values: 'auto', 'samples'"):
        ThroughputBatchSizeFinder(unit="tokens")
    with pytest.raises(SpeedupConfigError, match=r"`pad_value`=1.5 is not an integer \(a float\)"):
        ThroughputBatchSizeFinder(pad_value=1.5)  # type: ignore[arg-type]
