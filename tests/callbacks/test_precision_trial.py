"""PrecisionTrial: bf16 autocast timed against fp32 on the fit's own steps, on a fake clock that the steps advance."""

from __future__ import annotations

import json
from typing import Any

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import Callback
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import lightning_speedups.callbacks.precision_trial as pt
from lightning_speedups._errors import SpeedupConfigError
from lightning_speedups.callbacks.precision_trial import BF16, FP32, PrecisionTrial
from tests.helpers import quiet_trainer

# the fake clock: a training step advances it by its model's cost for the precision it runs in (per process)
_NOW = {"t": 0.0}


def fake_clock() -> float:
    return _NOW["t"]


class Timed(L.LightningModule):
    """A small classifier whose steps cost ``fp32_cost`` or ``bf16_cost`` fake seconds, and record their autocast."""

    def __init__(
        self, bf16_cost: float = 0.5, fp32_cost: float = 1.0, fail_in_bf16: bool = False, overflow_in_bf16: bool = False
    ) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
        self.bf16_cost = bf16_cost
        self.fp32_cost = fp32_cost
        self.fail_in_bf16 = fail_in_bf16
        self.overflow_in_bf16 = overflow_in_bf16
        self.train_autocast: list[bool] = []
        self.val_autocast: list[bool] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        on = torch.is_autocast_enabled("cpu")
        if on and self.fail_in_bf16:
            raise RuntimeError("no bf16 kernel for this op")
        self.train_autocast.append(on)
        _NOW["t"] += self._cost(on)
        x, y = batch
        loss = nn.functional.cross_entropy(self.net(x), y)
        return loss * float("inf") if on and self.overflow_in_bf16 else loss

    def _cost(self, bf16: bool) -> float:
        return self.bf16_cost if bf16 else self.fp32_cost

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.val_autocast.append(torch.is_autocast_enabled("cpu"))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _loader(n: int = 64) -> DataLoader:
    g = torch.Generator().manual_seed(0)
    return DataLoader(TensorDataset(torch.randn(n, 8, generator=g), torch.randint(0, 2, (n,), generator=g)), 4)


@pytest.fixture
def bf16_units(monkeypatch):
    monkeypatch.setattr(pt, "cpu_bf16_units", lambda: "AVX512-BF16")  # the trial runs whatever CPU runs the test


def _fit(model: Timed, trial: PrecisionTrial, max_steps: int, ckpt_path: str | None = None, **kwargs: Any) -> L.Trainer:
    trainer = quiet_trainer(max_steps=max_steps, callbacks=[trial], limit_val_batches=1, **kwargs)
    trainer.fit(model, _loader(), _loader(8), ckpt_path=ckpt_path)
    return trainer


def test_precision_trial_misconfiguration(bf16_units):
    with pytest.raises(SpeedupConfigError, match=r"`margin`=-0\.1"):
        PrecisionTrial(margin=-0.1)
    with pytest.raises(SpeedupConfigError, match=r"`max_rounds`=2"):
        PrecisionTrial(max_rounds=2)
    with pytest.raises(SpeedupConfigError, match=r"`max_cost`=0"):
        PrecisionTrial(max_cost=0.0)
    model = Timed()
    with pytest.raises(SpeedupConfigError, match=r"`precision`='bf16-mixed'.*Allowed values: '32-true'"):
        _fit(model, PrecisionTrial(clock=fake_clock), 4, precision="bf16-mixed")
    assert model.train_autocast == []  # refused before any training step


def test_precision_trial_keeps_a_faster_bf16(bf16_units):
    decisions: list[tuple[str | None, int]] = []
    model = Timed(bf16_cost=0.5)
    trial = PrecisionTrial(clock=fake_clock, on_decision=lambda t: decisions.append((t.kept, t.rounds)))
    _fit(model, trial, 20)
    assert trial.kept == BF16 and trial.rounds == 3 and trial.ratio[1] == pytest.approx(2.0)
    assert decisions == [(BF16, 3)]  # told once, when decided
    # untimed fp32 and bf16 steps, then 3 rounds in alternating order, then bf16 for the rest of the fit
    assert model.train_autocast[:8] == [False, True, False, True, True, False, False, True]
    assert all(model.train_autocast[8:]) and len(model.train_autocast) == 20
    assert model.val_autocast and all(model.val_autocast)  # validation runs as precision="bf16-mixed" would
    assert not torch.is_autocast_enabled("cpu")  # nothing left entered after the fit
    assert "kept bf16-mixed: 2.00x faster" in trial.note


def test_precision_trial_times_whole_optimizer_steps_under_gradient_accumulation(bf16_units):
    model = Timed(bf16_cost=0.5)
    trial = PrecisionTrial(clock=fake_clock)
    _fit(model, trial, 10, accumulate_grad_batches=2)  # 10 optimizer steps: 20 batches
    assert trial.kept == BF16 and trial.rounds == 3 and trial.ratio[1] == pytest.approx(2.0)  # 2 batches a step
    steps = [model.train_autocast[i : i + 2] for i in range(0, 16, 2)]
    assert all(a == b for a, b in steps)  # an option holds for both batches of an optimizer step
    assert [a for a, _b in steps] == [False, True, False, True, True, False, False, True]
    assert all(model.train_autocast[16:])


def test_precision_trial_keeps_fp32_when_bf16_is_no_faster(bf16_units):
    model = Timed(bf16_cost=1.0)
    trial = PrecisionTrial(clock=fake_clock)
    _fit(model, trial, 16)
    assert trial.kept == FP32 and trial.rounds == 3 and "not 1.05x beyond noise" in trial.note
    assert not any(model.train_autocast[8:])


def test_precision_trial_stops_a_slow_bf16_within_its_cost(bf16_units):
    model = Timed(bf16_cost=10.0)
    trial = PrecisionTrial(max_cost=0.02, clock=fake_clock)
    _fit(model, trial, 100)  # 2% of 100 one-second steps: 2 s, which one 9 s slower round passes
    assert trial.kept == FP32 and trial.rounds == 1 and "`max_cost`=0.02" in trial.note
    assert sum(model.train_autocast) == 2  # the untimed bf16 step and one timed one


def test_precision_trial_on_a_cpu_without_bf16_units(monkeypatch):
    monkeypatch.setattr(pt, "cpu_bf16_units", lambda: None)
    model = Timed()
    trial = PrecisionTrial(clock=fake_clock)
    _fit(model, trial, 8)
    assert trial.kept == FP32 and "no bf16 units" in trial.note and not any(model.train_autocast)


def test_precision_trial_keeps_fp32_when_the_step_fails_in_bf16(bf16_units):
    decisions: list[str | None] = []
    model = Timed(fail_in_bf16=True)
    trial = PrecisionTrial(clock=fake_clock, on_decision=lambda t: decisions.append(t.kept))
    _fit(model, trial, 8)  # the fit goes on in fp32
    assert decisions == [FP32]
    assert trial.kept == FP32 and "fails under bf16 autocast (RuntimeError: no bf16 kernel" in trial.note
    assert len(model.train_autocast) == 8 and not any(model.train_autocast)


class _SkipsFirst(Timed):
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor | None:
        return None if batch_idx == 1 else super().training_step(batch, batch_idx)  # Lightning skips a None step


def test_precision_trial_checks_nothing_on_a_step_that_returns_no_loss(bf16_units):
    model = _SkipsFirst(bf16_cost=0.5)
    trial = PrecisionTrial(clock=fake_clock)
    _fit(model, trial, 20)  # the check on a copy meets the skipped batch: nothing to check, the trial goes on
    assert trial.kept == BF16 and "fails" not in trial.note


def test_precision_trial_keeps_fp32_when_bf16_overflows(bf16_units):
    model = Timed(overflow_in_bf16=True)
    trial = PrecisionTrial(clock=fake_clock)
    _fit(model, trial, 8)  # the check on a copy saw the non-finite loss: the real model never ran a bf16 step
    assert trial.kept == FP32 and "non-finite loss" in trial.note and not any(model.train_autocast)
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_precision_trial_resume(bf16_units, tmp_path):
    full_model = Timed()
    full = PrecisionTrial(clock=fake_clock)
    _fit(full_model, full, 12)
    half_model = Timed()
    half = PrecisionTrial(clock=fake_clock)
    trainer = _fit(half_model, half, 6)  # two untimed steps and two rounds: mid-trial
    trainer.save_checkpoint(tmp_path / "mid.ckpt")
    state = torch.load(tmp_path / "mid.ckpt", weights_only=True)["callbacks"]  # plain data
    assert next(iter(state.values()))["kept"] is None and half.rounds == 2
    model = Timed()
    resumed = PrecisionTrial(clock=fake_clock)
    trainer = _fit(model, resumed, 12, ckpt_path=str(tmp_path / "mid.ckpt"))
    # the two rounds carried over, both options warmed up again, one more round decides as without the stop
    assert resumed.kept == full.kept == BF16 and resumed.rounds == full.rounds == 3
    assert model.train_autocast == [False, True, False, True, True, True]
    trainer.save_checkpoint(tmp_path / "done.ckpt")
    told: list[PrecisionTrial] = []
    model = Timed()
    after = PrecisionTrial(clock=fake_clock, on_decision=told.append)
    _fit(model, after, 16, ckpt_path=str(tmp_path / "done.ckpt"))
    assert after.kept == BF16 and all(model.train_autocast)  # the decision holds: no step spent on fp32 again
    assert told == []  # a restored decision is not a new one


class _AnyCpu(PrecisionTrial):
    """The trial on whatever CPU runs the test (the spawned ranks do not see a monkeypatch)."""

    def _unsupported(self) -> str | None:
        return None


class _RankTimed(Timed):
    def _cost(self, bf16: bool) -> float:  # bf16 faster on rank 0 and slower on rank 1: rank 0 must decide for both
        return (0.5 if self.global_rank == 0 else 2.0) if bf16 else 1.0


class _Report(Callback):
    def __init__(self, path: Any) -> None:
        self.path = path

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        trial = next(c for c in trainer.callbacks if isinstance(c, PrecisionTrial))
        report = {"kept": trial.kept, "autocast": pl_module.train_autocast}
        (self.path / f"rank{trainer.global_rank}.json").write_text(json.dumps(report))


@pytest.mark.ddp
def test_precision_trial_ddp(tmp_path):
    trainer = quiet_trainer(
        max_steps=12,
        limit_val_batches=0,
        devices=2,
        strategy="ddp_spawn",
        callbacks=[_AnyCpu(clock=fake_clock), _Report(tmp_path)],
    )
    trainer.fit(_RankTimed(), _loader())
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert [r["kept"] for r in reports] == [BF16, BF16]
    assert reports[0]["autocast"] == reports[1]["autocast"] and all(reports[0]["autocast"][8:])


def test_precision_trial_copies_a_model_for_its_check_only_where_the_gpu_has_room(monkeypatch):
    def no_copy(*args, **kwargs):
        raise AssertionError("copied a model the GPU has no room for")

    model = Timed()
    size = sum(p.numel() * p.element_size() for p in model.parameters())
    monkeypatch.setattr(pt, "model_copy", no_copy)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda: (size, 10 * size))  # room for one more copy, not two
    assert pt._bf16_failure(model, (torch.randn(4, 8), torch.zeros(4, dtype=torch.long)), 0, "cuda") is None
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda: (4 * size, 10 * size))
    with pytest.raises(AssertionError, match="copied"):
        pt._bf16_failure(model, (torch.randn(4, 8), torch.zeros(4, dtype=torch.long)), 0, "cuda")
