"""``OptimizerRace`` in a fit: the winner's weights and optimizer state continue, schedules follow, resume and DDP."""

from __future__ import annotations

import json
from typing import Any

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from lightning_speedups._errors import SpeedupConfigError
from lightning_speedups.callbacks.optimizer_race import OptimizerRace
from lightning_speedups.optim.muon import MuonWithAdamW
from tests.fsdp_cpu import CPUFSDPStrategy
from tests.helpers import quiet_trainer


class Counter:
    """A fake clock: each call is one second later (so every timed step takes one second, on every rank)."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


class Regression(L.LightningModule):
    """A plain module as people write it: an MLP, its own AdamW, optionally a OneCycle schedule."""

    def __init__(self, lr: float = 1e-4, schedule: bool = False, steps: int = 120) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 1))
        self.lr = lr
        self.schedule = schedule
        self.steps = steps

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return F.mse_loss(self.net(x), y)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", F.mse_loss(self.net(x), y))

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.AdamW(self.parameters(), lr=self.lr, weight_decay=0.01)
        if not self.schedule:
            return optimizer
        sched = torch.optim.lr_scheduler.OneCycleLR(optimizer, self.lr, total_steps=self.steps)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def _data(n: int = 512, same: bool = False) -> DataLoader:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 8, generator=g)
    if same:  # every batch the same: a resumed epoch replays its batches, so the order cannot differ
        x = x[:16].repeat(n // 16, 1)
    y = torch.sin(x @ torch.linspace(-1, 1, 8)).unsqueeze(1)
    return DataLoader(TensorDataset(x, y), batch_size=16)


def _module(seed: int = 0, **kwargs: Any) -> Regression:
    L.seed_everything(seed, verbose=False)
    return Regression(**kwargs)


class RecordingRace(OptimizerRace):
    """Records the winner's weights when they are handed to the module, and the module's right after."""

    def _swap(self, trainer: Any, pl_module: Any, spec: Any, arm: Any) -> None:
        super()._swap(trainer, pl_module, spec, arm)
        if arm is not None:
            self.handed = {k: v.clone() for k, v in arm.module.state_dict().items()}
            self.taken = {k: v.clone() for k, v in pl_module.state_dict().items()}
            self.at_step = trainer.global_step


def test_the_winners_weights_and_optimizer_state_continue_the_fit() -> None:
    race = RecordingRace(max_cost=0.5, margin=0.02, clock=Counter())
    trainer = quiet_trainer(max_steps=120, limit_val_batches=4, callbacks=[race])
    module = _module()
    trainer.fit(module, _data(), _data(64))
    assert race.winner in {"own_lr_x3", "muon"}, race.note  # lr 1e-4 is too small for this task
    assert race.note.startswith(f"chose {race.winner}") and "race steps" in race.note
    for key, value in race.handed.items():
        torch.testing.assert_close(race.taken[key], value, msg=key)
    assert race.at_step == race.steps  # decided after the race's steps, then trained on: none repeated
    assert trainer.global_step == 120
    optimizer = trainer.optimizers[0]
    assert isinstance(optimizer, MuonWithAdamW) == (race.winner == "muon")
    assert all(len(s) for s in optimizer.state.values())  # the winner's moments came along
    assert race.gaps[race.winner][0] > race.margin


def test_a_schedule_follows_the_winning_learning_rate() -> None:
    def fit(arms: list[str]) -> tuple[OptimizerRace, L.Trainer]:
        race = OptimizerRace(arms, max_cost=0.5, margin=0.02, clock=Counter())
        trainer = quiet_trainer(max_steps=120, limit_val_batches=4, callbacks=[race])
        trainer.fit(_module(lr=1e-4, schedule=True, steps=120), _data(), _data(64))
        return race, trainer

    race, trainer = fit(["own", "own_lr_x3"])
    assert race.winner == "own_lr_x3", race.note
    alone, plain = fit(["own", "own_lr_x0.3"])  # a slower arm loses: the module's own schedule runs as written
    assert alone.winner == "own"
    scheduler = trainer.lr_scheduler_configs[0].scheduler
    assert scheduler.optimizer is trainer.optimizers[0]
    for raced, own in zip(trainer.optimizers[0].param_groups, plain.optimizers[0].param_groups):
        assert raced["lr"] == pytest.approx(3 * own["lr"])
        assert raced["max_lr"] == pytest.approx(3 * own["max_lr"])


def test_a_race_the_module_wins_leaves_its_run_as_without_a_race() -> None:
    """The arms' steps draw dropout masks from a forked generator: the fit's own draws, and so its weights, are those
    of a fit without the race."""

    class Dropped(Regression):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(8, 32), nn.Dropout(0.3), nn.Tanh(), nn.Linear(32, 1))

    def fit(callbacks: list[Any]) -> Regression:
        L.seed_everything(0, verbose=False)
        module = Dropped()
        quiet_trainer(max_steps=120, limit_val_batches=2, callbacks=callbacks).fit(module, _data(), _data(64))
        return module

    race = OptimizerRace(["own", "own_lr_x0.3"], max_cost=0.5, margin=0.99, clock=Counter())
    raced = fit([race])
    assert race.winner == "own" and race.note.startswith("kept own")
    for (key, a), b in zip(fit([]).state_dict().items(), raced.state_dict().values(), strict=True):
        torch.testing.assert_close(b, a, msg=key)


class Travelled(Regression):
    """Logs, beside its loss, how far its weights moved from where they started (``val_dist``): a metric on which
    the smaller learning rate scores better and the larger worse, whatever the loss says."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("start", torch.nn.utils.parameters_to_vector(self.net.parameters()).detach().clone())

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        super().validation_step(batch, batch_idx)
        moved = torch.nn.utils.parameters_to_vector(self.net.parameters()) - self.start
        self.log_dict({"val_dist": moved.norm(), "val_name": 0.0})


def _race_on(callbacks: list[Any], **kwargs: Any) -> OptimizerRace:
    race = OptimizerRace(["own", "own_lr_x3"], max_cost=0.5, margin=0.05, clock=Counter(), **kwargs)
    L.seed_everything(0, verbose=False)
    quiet_trainer(max_steps=120, limit_val_batches=2, callbacks=[race, *callbacks]).fit(Travelled(), _data(), _data(64))
    return race


def test_the_arms_are_scored_on_the_monitored_metric_in_its_direction() -> None:
    by_loss = _race_on([])  # lr 1e-4 is too small: on the loss the 3x rate wins
    assert by_loss.winner == "own_lr_x3" and "loss gap" in by_loss.note, by_loss.note
    nearer = _race_on([], monitor="val_dist", mode="min")  # the module's own rate moved the weights less
    assert nearer.winner == "own" and "no arm's val_dist was better" in nearer.note, nearer.note
    assert nearer.gaps["own_lr_x3"][2] < 0
    farther = _race_on([EarlyStopping(monitor="val_dist", mode="max", patience=10**6)])  # the fit's monitor and mode
    assert farther.winner == "own_lr_x3" and "val_dist gap over own" in farther.note, farther.note
    assert farther.gaps["own_lr_x3"][0] > 0.5  # about 3x as far: a gap of about (3 - 1) / 3, relative to the larger
    named = _race_on([EarlyStopping(monitor="val_dist", mode="max", patience=10**6)], monitor="loss")
    assert named.winner == "own_lr_x3" and "loss gap" in named.note


def test_a_metric_the_validation_step_does_not_log_is_scored_on_the_loss_with_a_note() -> None:
    race = _race_on([], monitor="val_acc", mode="max")
    assert race.winner == "own_lr_x3" and "loss gap" in race.note
    assert "scored on the loss: validation_step logs no 'val_acc' (it logs val_dist, val_loss, val_name)" in race.note


def test_a_run_too_short_is_not_raced_and_keeps_its_optimizer() -> None:
    race = OptimizerRace()
    trainer = quiet_trainer(max_steps=20, limit_val_batches=0, callbacks=[race])
    trainer.fit(_module(), _data())
    assert race.winner == "own" and race.note.startswith("not raced")
    assert "would be raced" in race.note
    assert type(trainer.optimizers[0]) is torch.optim.AdamW


def test_a_race_whose_measured_cost_passes_max_cost_stops_and_keeps_the_optimizer(monkeypatch) -> None:
    """Copies that take long (a large model on a slow disk, say): the race stops before its first scoring."""
    import lightning_speedups.callbacks.optimizer_race as race_module

    clock = Counter()
    real_copy = race_module.model_copy

    def slow_copy(module: Any, train: bool | None = None) -> Any:
        clock.now += 100.0  # each copy takes as long as 100 of the module's steps
        return real_copy(module, train)

    monkeypatch.setattr(race_module, "model_copy", slow_copy)
    race = OptimizerRace(["own", "own_lr_x3"], max_cost=0.5, margin=0.02, clock=clock)
    trainer = quiet_trainer(max_steps=120, limit_val_batches=2, callbacks=[race])
    trainer.fit(_module(), _data(), _data(64))
    assert race.winner == "own" and race.note.startswith("stopped after 2 race steps")
    assert race.own_step_s == 1.0 and race.cost_s > 100  # the copy alone is 100 of the module's steps
    assert type(trainer.optimizers[0]) is torch.optim.AdamW and trainer.global_step == 120


@pytest.mark.parametrize("copy_steps", [5.0, 20.0])
def test_the_race_sizes_itself_with_its_copies_counted_and_stays_within_max_cost(monkeypatch, copy_steps) -> None:
    """Copies that cost 5 or 20 of the module's steps each: the arms' copies at the start and their forks at the end
    both stay within max_cost (with the forks left out of its sizing, the race of 20-step copies spent 76 steps of the
    60 allowed)."""
    import lightning_speedups.callbacks.optimizer_race as race_module

    clock = Counter()
    real_copy = race_module.model_copy

    def slow_copy(module: Any, train: bool | None = None) -> Any:
        clock.now += copy_steps
        return real_copy(module, train)

    monkeypatch.setattr(race_module, "model_copy", slow_copy)
    race = OptimizerRace(["own", "own_lr_x3"], max_cost=0.5, margin=0.02, clock=clock)
    trainer = quiet_trainer(max_steps=120, limit_val_batches=2, callbacks=[race])
    trainer.fit(_module(), _data(), _data(64))
    if copy_steps == 5.0:
        assert race.note.startswith("chose own_lr_x3") and "race steps" in race.note, race.note
    spent = race.cost_s - (race.own_step_s * race.steps if race.winner != "own" else 0.0)  # the winner's steps train
    assert spent <= 0.5 * 120 * race.own_step_s, (spent, race.note)


@pytest.mark.parametrize("monitor", [None, "val_loss"])
def test_the_race_prices_its_scoring_as_measured_and_stays_within_max_cost(monkeypatch, monitor) -> None:
    """Each held-back batch's scoring costs 6 of the module's steps (a validation batch many times a training batch):
    the race prices the measured forward, not a fixed share of a step, and the forks' scoring stays within max_cost
    (priced at a third of a step, the race spent 82 of the 60 allowed steps)."""
    import lightning_speedups.callbacks.optimizer_race as race_module

    clock = Counter()
    real_score = race_module._Fit.score

    def slow_score(fit: Any, module: Any, batch: Any, batch_idx: int) -> float:
        clock.now += 6.0
        return real_score(fit, module, batch, batch_idx)

    monkeypatch.setattr(race_module._Fit, "score", slow_score)
    race = OptimizerRace(["own", "own_lr_x3"], max_cost=0.5, margin=0.02, monitor=monitor, clock=clock)
    trainer = quiet_trainer(max_steps=120, limit_val_batches=2, callbacks=[race])
    trainer.fit(_module(), _data(), _data(64))
    assert race.winner is not None and race.scored_on == (monitor or "loss"), race.note
    spent = race.cost_s - (race.own_step_s * race.steps if race.winner != "own" else 0.0)  # the winner's steps train
    assert spent <= 0.5 * 120 * race.own_step_s, (spent, race.note)


def test_arms_that_do_not_apply_are_named() -> None:
    race = OptimizerRace(["muon", "schedule_free_adamw"], max_cost=0.5, margin=0.02, clock=Counter())

    class SGDModule(Regression):
        def configure_optimizers(self) -> Any:
            optimizer = torch.optim.SGD(self.parameters(), lr=0.01)
            sched = torch.optim.lr_scheduler.StepLR(optimizer, 10)
            return {"optimizer": optimizer, "lr_scheduler": sched}

    L.seed_everything(0, verbose=False)
    trainer = quiet_trainer(max_steps=120, limit_val_batches=0, callbacks=[race])
    trainer.fit(SGDModule(), _data())
    assert "muon not raced: SGD is not Adam-type" in race.note
    assert "schedule_free_adamw not raced: an LR scheduler steps the optimizer" in race.note
    assert race.winner == "own"


def test_resume_mid_race_equals_the_uninterrupted_fit(tmp_path) -> None:
    def fit(ckpt_path: str | None = None) -> tuple[Regression, OptimizerRace]:
        race = OptimizerRace(["own", "own_lr_x3", "muon"], max_cost=0.5, margin=0.02, clock=Counter())
        every = ModelCheckpoint(dirpath=tmp_path, filename="{step}", every_n_train_steps=5, save_top_k=-1)
        trainer = quiet_trainer(max_steps=120, limit_val_batches=2, enable_checkpointing=True, callbacks=[race, every])
        module = _module()
        trainer.fit(module, _data(same=True), _data(64), ckpt_path=ckpt_path)
        return module, race

    full, race = fit()
    assert race.steps > 10 and race.winner != "own"
    state = torch.load(tmp_path / "step=10.ckpt", weights_only=True)  # mid-race: every arm's state is in it
    assert set(state["callbacks"][next(iter(state["callbacks"]))]["race"]["arms"]) == {"own_lr_x3", "muon"}
    resumed, again = fit(str(tmp_path / "step=10.ckpt"))
    assert again.winner == race.winner
    for (key, a), b in zip(full.state_dict().items(), resumed.state_dict().values(), strict=True):
        torch.testing.assert_close(b, a, msg=key)
    after = torch.load(tmp_path / "step=40.ckpt", weights_only=True)  # after the race: the winner's optimizer
    resumed_after, last = fit(str(tmp_path / "step=40.ckpt"))
    assert last.winner == race.winner and "race" not in after["callbacks"][next(iter(after["callbacks"]))]
    for (key, a), b in zip(full.state_dict().items(), resumed_after.state_dict().values(), strict=True):
        torch.testing.assert_close(b, a, msg=key)


def test_bad_arguments_and_unsupported_fits_are_refused_before_a_step() -> None:
    with pytest.raises(SpeedupConfigError, match=r"`arms`='adam' is not supported"):
        OptimizerRace(["own", "adam"])
    with pytest.raises(SpeedupConfigError, match=r"`arms`='muon' is not a list"):
        OptimizerRace("muon")
    with pytest.raises(SpeedupConfigError, match=r"`max_cost`=0"):
        OptimizerRace(max_cost=0)
    with pytest.raises(SpeedupConfigError, match=r"`monitor`=3 is not a metric name. Allowed values: None, 'loss'"):
        OptimizerRace(monitor=3)  # type: ignore[arg-type]
    with pytest.raises(SpeedupConfigError, match=r"`mode`='maximum' is not supported.*'min', 'max'"):
        OptimizerRace(mode="maximum")

    class Manual(Regression):
        def __init__(self) -> None:
            super().__init__()
            self.automatic_optimization = False

        def training_step(self, batch: Any, batch_idx: int) -> None:
            raise AssertionError("no step may run")

    with pytest.raises(SpeedupConfigError, match="automatic_optimization"):
        quiet_trainer(max_steps=2, callbacks=[OptimizerRace()]).fit(Manual(), _data())
    fsdp = quiet_trainer(max_steps=2, strategy=CPUFSDPStrategy(), callbacks=[OptimizerRace()])
    with pytest.raises(SpeedupConfigError, match="OptimizerRace"):
        fsdp.fit(_module(), _data())


class _ReportRank(L.Callback):
    def __init__(self, path: Any, race: OptimizerRace) -> None:
        self.path = path
        self.race = race

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        race = next(cb for cb in trainer.callbacks if isinstance(cb, OptimizerRace))
        report = {
            "winner": race.winner,
            "checksum": float(sum(p.detach().double().sum() for p in pl_module.parameters())),
        }
        (self.path / f"rank{trainer.global_rank}.json").write_text(json.dumps(report))


@pytest.mark.ddp
def test_optimizer_race_under_ddp_rank_zero_decides_and_ranks_agree(tmp_path) -> None:
    race = OptimizerRace(["own", "own_lr_x3", "muon"], max_cost=0.5, margin=0.02, clock=Counter())
    trainer = quiet_trainer(
        max_steps=120,
        devices=2,
        strategy="ddp_spawn",
        limit_val_batches=2,
        callbacks=[race, _ReportRank(tmp_path, race)],
    )
    trainer.fit(_module(), _data(1024), _data(64))
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert reports[0]["winner"] == reports[1]["winner"] != "own"
    assert reports[0]["checksum"] == pytest.approx(reports[1]["checksum"], rel=1e-9)


def test_autotune_races_the_optimization_when_named_and_says_why_not_otherwise() -> None:
    from lightning_speedups.autotune import autotune

    plan = autotune(_module(), _data(), candidates=["optimization"], cache=False, budget_s=1.0, max_steps=400)
    (choice,) = [c for c in plan.choices if c.name == "optimization"]
    assert choice.chosen == "in-fit race" and "OptimizerRace" in choice.note
    (race,) = [cb for cb in plan.callbacks if isinstance(cb, OptimizerRace)]
    trainer = quiet_trainer(callbacks=plan.callbacks, limit_val_batches=2, **plan.trainer_kwargs)
    trainer.fit(_module(), _data(), _data(64))
    assert race.winner is not None and f"race: {race.note}" in plan.explain(width=None)
    line = next(line for line in plan.to_text().splitlines() if line.strip().startswith("optimization"))
    assert f"the race kept {race.winner}" in line or f"the race chose {race.winner}: " in line, line
    assert len(line) <= 120

    short = autotune(_module(), _data(), candidates=["optimization"], cache=False, budget_s=1.0, max_steps=100)
    assert not [cb for cb in short.callbacks if isinstance(cb, OptimizerRace)]
    assert any(n.startswith("optimization not raced") and "would be raced" in n for n in short.notes)
    default = autotune(_module(), _data(), cache=False, budget_s=1.0, max_steps=400)
    assert any(n.startswith("optimization not raced by default") for n in default.notes)


def test_the_plan_names_the_race_winner_with_its_gap_and_interval() -> None:
    from types import SimpleNamespace

    from lightning_speedups.autotune.plan import _race_outcome

    gaps = {"own_lr_x3": (0.744, 0.758, 0.759), "muon": (-0.05, -0.044, -0.04)}
    chose = SimpleNamespace(winner="own_lr_x3", gaps=gaps, scored_on="val_acc")
    assert _race_outcome(chose) == "the race chose own_lr_x3: val_acc +75.8% [+74.4%, +75.9%]"
    kept = SimpleNamespace(winner="own", gaps=gaps, scored_on="loss")
    assert _race_outcome(kept) == "the race kept own (best: own_lr_x3 loss +75.8% [+74.4%, +75.9%])"
    assert _race_outcome(SimpleNamespace(winner="own", gaps={})) == "the race kept own"
    assert _race_outcome(SimpleNamespace(winner=None)) == "raced on the fit's first steps"
