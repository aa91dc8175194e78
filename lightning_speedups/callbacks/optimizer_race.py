"""OptimizerRace: the fit's first steps race the module's optimizer against other optimizations; the winner trains on.

The rules of the race (equal wall time, a cool-down before scoring, clearly ahead or the user's, the cost bound) are
:class:`~lightning_speedups.optim.race.Race`'s; this callback runs one inside a fit.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from itertools import islice
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info
from torch import nn
from typing_extensions import override

from lightning_speedups._compat import retarget_scheduler
from lightning_speedups._errors import SpeedupConfigError, check_choice, check_int, check_range
from lightning_speedups._inputs import eval_mode
from lightning_speedups._rebuild import clone_optimizer
from lightning_speedups._registry import TechniqueInfo, register_technique
from lightning_speedups._strategies import refuse_manual_optimization, refuse_sharded
from lightning_speedups.measure import model_copy, training_step_loss, validation_step_metrics
from lightning_speedups.optim.lr_scaling import RATE_KEYS, scale_optimizer_lrs
from lightning_speedups.optim.muon import MuonWithAdamW, assign_muon, muon_from_optimizer
from lightning_speedups.optim.race import Race, RaceVerdict, plan_race
from lightning_speedups.optim.schedule_free import (
    create_schedule_free_adamw,
    eval_weights_into_checkpoint,
    fit_eval_weights,
    fit_train_batches,
    fit_train_weights,
    is_schedule_free,
)

__all__ = ["ARMS", "DEFAULT_ARMS", "OptimizerRace"]


@dataclass(frozen=True)
class ArmSpec:
    """An arm by what it trains with: the module's optimizer (``"own"``), the Muon hybrid made from it
    (``"muon"``) or schedule-free AdamW at its rates (``"schedule_free_adamw"``), each at ``lr_factor`` times the
    module's learning rates."""

    kind: str
    lr_factor: float = 1.0


ARMS: dict[str, ArmSpec] = {
    "own": ArmSpec("own"),
    "own_lr_x0.3": ArmSpec("own", 0.3),
    "own_lr_x3": ArmSpec("own", 3.0),
    "own_lr_x10": ArmSpec("own", 10.0),
    "muon": ArmSpec("muon"),
    "muon_lr_x3": ArmSpec("muon", 3.0),
    "schedule_free_adamw": ArmSpec("schedule_free_adamw"),
}
DEFAULT_ARMS = ("own", "own_lr_x3", "muon", "schedule_free_adamw")
BASELINE = "own"


def _param_map(source: nn.Module, target: nn.Module) -> dict[int, nn.Parameter]:
    theirs = dict(target.named_parameters(remove_duplicate=False))
    return {id(p): theirs[name] for name, p in source.named_parameters(remove_duplicate=False)}


def _build(spec: ArmSpec, own: torch.optim.Optimizer, module: nn.Module, warmup: int | None) -> tuple[Any, list[int]]:
    """The arm's optimizer on ``module`` (whose parameters ``own`` holds) at ``own``'s rates (the factor is applied
    per step), and for each of its groups the index of ``own``'s group it came from."""
    if spec.kind == "muon":
        hybrid = muon_from_optimizer(own, module, "adamw", **({} if warmup is None else {"warmup_steps": warmup}))
        return hybrid, list(hybrid.group_sources)
    if spec.kind == "schedule_free_adamw":
        groups = [
            {"params": list(g["params"]), "lr": g["lr"], "weight_decay": g.get("weight_decay", 0.0)}
            for g in own.param_groups
        ]
        betas = own.defaults.get("betas", (0.9, 0.999))
        warm = {} if warmup is None else {"warmup_steps": warmup}
        optimizer = create_schedule_free_adamw(groups, lr=own.defaults["lr"], betas=betas, **warm)
        return optimizer, list(range(len(groups)))
    params = {id(p): p for g in own.param_groups for p in g["params"]}
    return clone_optimizer(own, params), list(range(len(own.param_groups)))


class _ModuleArm:
    """A model and its optimizer in the race: steps as the fit would (its precision, clipping, DDP's gradient
    average), its learning rates following the module's schedule (``lrs``, set by the callback each step) times its
    factor."""

    def __init__(self, module: nn.Module, optimizer: Any, sources: list[int], spec: ArmSpec, fit: _Fit) -> None:
        self.module = module
        self.optimizer = optimizer
        self.sources = sources
        self.spec = spec
        self.fit = fit
        self.decays = not is_schedule_free(optimizer)

    def step(self, batch: Any, lr_scale: float) -> float:
        with torch.random.fork_rng(devices=self.fit.rng_devices()):  # the fit's own draws stay as without a race
            return self._step(batch, lr_scale)

    def _step(self, batch: Any, lr_scale: float) -> float:
        self.module.train()
        if is_schedule_free(self.optimizer):
            self.optimizer.train()
        lrs = self.fit.lrs
        for group, source in zip(self.optimizer.param_groups, self.sources):
            if not is_schedule_free(self.optimizer):
                group["lr"] = lrs[source] * self.spec.lr_factor * lr_scale
        with self.fit.forward_context():
            loss = training_step_loss(self.module, batch, self.fit.batch_idx, quiet=True)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.fit.reduce_grads(self.module)
        self.fit.clip(self.module)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(loss.detach())

    def fork(self) -> _ModuleArm:
        module = model_copy(self.module)
        optimizer = clone_optimizer(self.optimizer, _param_map(self.module, module))
        return _ModuleArm(module, optimizer, self.sources, self.spec, self.fit)

    def evaluate(self, batches: Sequence[Any]) -> list[float]:
        if is_schedule_free(self.optimizer):
            self.optimizer.eval()
        self.module.eval()
        with torch.random.fork_rng(devices=self.fit.rng_devices()), torch.no_grad(), self.fit.forward_context():
            return [self.fit.score(self.module, batch, i) for i, batch in enumerate(batches)]


class _Fit:
    """What the arms need of the running fit: the module's current lrs, the batch index, precision, clipping, DDP."""

    def __init__(self, trainer: L.Trainer) -> None:
        self.trainer = trainer
        self.lrs: list[float] = []
        self.batch_idx = 0
        self.monitor: str | None = None  # the metric the arms are scored on (None: the training_step's loss)
        self.sign = 1.0  # -1 for a metric to maximise: the race's scores are lower-is-better

    def score(self, module: nn.Module, batch: Any, batch_idx: int) -> float:
        """``module``'s score on one held-back batch, lower is better: ``monitor`` as its ``validation_step`` logs
        it (NaN where that step did not log it), else its training loss."""
        if self.monitor is None:
            return float(training_step_loss(module, batch, batch_idx, quiet=True))
        return self.sign * validation_step_metrics(module, batch, batch_idx).get(self.monitor, math.nan)

    def forward_context(self) -> Any:
        return self.trainer.precision_plugin.forward_context()

    def rng_devices(self) -> list[int]:
        """The CUDA device whose generator an arm's step must leave as it found it (none on other devices)."""
        root = self.trainer.strategy.root_device
        return [root.index or 0] if root.type == "cuda" else []

    def reduce_grads(self, module: nn.Module) -> None:
        if self.trainer.world_size <= 1:
            return
        for p in module.parameters():
            if p.grad is not None:
                p.grad.copy_(self.trainer.strategy.reduce(p.grad, reduce_op="mean"))

    def clip(self, module: nn.Module) -> None:
        value = self.trainer.gradient_clip_val
        if not value:
            return
        params = [p for p in module.parameters() if p.grad is not None]
        if self.trainer.gradient_clip_algorithm == "value":
            torch.nn.utils.clip_grad_value_(params, value)
        else:
            torch.nn.utils.clip_grad_norm_(params, value)


class OptimizerRace(Callback):
    """Race the module's own optimizer against other optimizations on the fit's first steps, and train on the winner.

    The fit's own steps train the module with its own optimizer (arm ``"own"``); beside each of them the other arms
    train copies of the module, made at the first step, on the same batch. After the race's steps every arm's fork
    cools down and is scored on ``eval_batches`` validation batches (training batches when the fit has no
    validation), and an arm whose loss is lower than the module's by ``margin`` beyond noise wins: its weights and
    optimizer state replace the module's and its optimizer, the LR schedulers follow it (scaled by its learning-rate
    factor), and the fit goes on. So the winner's race steps were training, and what the race costs is the other
    arms' steps, the cool-downs and the scoring, sized before any step to at most ``max_cost`` of the planned fit (a
    fit too short for ``min_steps`` race steps is not raced: one note says what length would be). The rules, at
    equal wall time and after a cool-down, are :class:`~lightning_speedups.optim.race.Race`'s.

    The arms (``arms``, in order: where the run is too short for all of them the last ones give way): ``"own"``
    (always, the baseline), ``"own_lr_x3"`` / ``"own_lr_x10"`` / ``"own_lr_x0.3"``
    (the module's optimizer at that factor of its learning rates, its schedule kept), ``"muon"`` / ``"muon_lr_x3"``
    (the Muon hybrid of :func:`~lightning_speedups.optim.muon.muon_from_optimizer`: hidden matrices on Muon, the
    rest on AdamW, the module's groups, rates and schedule kept; only for Adam-type optimizers and models with a
    hidden matrix) and ``"schedule_free_adamw"`` (schedule-free AdamW at the module's rates; only where no LR
    scheduler steps the optimizer, since it takes none, and with ``schedulefree`` installed). An arm that does not
    apply is left out, with a note.

    Under DDP the arms' gradients are averaged over the ranks as the module's are, and rank 0's scores decide for
    every rank. A checkpoint saved during the race holds every arm's weights and optimizer state, and the resumed
    fit races on; after the race it holds the decision, and a resumed fit rebuilds the winner's optimizer before
    Lightning restores its state.

    The arms are scored on ``monitor``, the metric the module's ``validation_step`` logs (by default the one the
    fit's ``EarlyStopping`` or ``ModelCheckpoint`` monitors, with its mode), else on the loss its ``training_step``
    returns. The metric the user judges the run by is the better judge: on the suite's graph network a 3x learning
    rate had 62% validation accuracy after 16 steps where the module's own had 14%, while its loss was lower by only
    0.5%.

    Where it does not help: a run whose optimizer is already well tuned pays the race's cost (at most ``max_cost``)
    for nothing. A race of a few steps judges the start of training; the cool-down makes that fairer, not certain.

    Args:
        arms: the arms to race (``"own"`` is added when missing); see :data:`ARMS`.
        max_cost: the largest share of the planned fit's steps the race may add.
        margin: the relative loss gap over ``"own"`` a winner must clear on every scored batch (0.25: a quarter lower
            loss). A race of a few steps flatters a larger learning rate (it gains fastest early, and may end worse):
            on the suite's dev tasks a 3x rate that helped the byte-level GPT led by 30-45% after the race, one that
            hurt the ViT by 10-18%; a smaller margin takes the second too.
        cooldown_fraction: each fork's cool-down, as a share of the race's steps.
        eval_batches: held-back batches each arm is scored on.
        min_steps: the fewest race steps worth deciding on.
        monitor: the metric to score the arms on, as ``validation_step`` logs it on one batch (``self.log`` or
            ``self.log_dict``); ``"loss"``: the loss ``training_step`` returns; ``None``: the monitor of the fit's
            ``EarlyStopping`` or ``ModelCheckpoint`` where one has a monitor, else the loss. Where the validation step
            does not log it, the arms are scored on the loss, with a note.
        mode: ``"min"`` or ``"max"``, whether a lower or a higher ``monitor`` is better (``None``: the mode of the
            callback whose monitor is used, else ``"min"``).
        warmup_steps: the learning-rate warm-up of the Muon and schedule-free arms (``None``: each one's default,
            the warm-up it would train on with after winning: 10 steps for Muon, 100 for schedule-free).
        clock: seconds as a float (tests inject a fake one).
        on_decision: called with the callback on rank 0 once the race decides (``winner``, ``note`` set).

    Raises:
        SpeedupConfigError: at construction for an unknown arm or an argument out of range; at ``setup`` under a
            sharded strategy (FSDP, DeepSpeed) or manual optimization.

    Example::

        >>> trainer = L.Trainer(max_epochs=20, callbacks=[OptimizerRace()])  # doctest: +SKIP
    """

    def __init__(
        self,
        arms: Sequence[str] = DEFAULT_ARMS,
        *,
        max_cost: float = 0.1,
        margin: float = 0.25,
        cooldown_fraction: float = 0.25,
        eval_batches: int = 4,
        min_steps: int = 8,
        monitor: str | None = None,
        mode: str | None = None,
        warmup_steps: int | None = None,
        clock: Callable[[], float] = time.perf_counter,
        on_decision: Callable[[Any], None] | None = None,
    ) -> None:
        if isinstance(arms, str) or not arms:
            raise SpeedupConfigError(f"`arms`={arms!r} is not a list of arms. Allowed values: a list of {list(ARMS)}.")
        for name in arms:
            check_choice("arms", name, list(ARMS))
        check_range("max_cost", max_cost, 0.0, 1.0, low_inclusive=False, hint="0.1: a tenth of the planned fit")
        check_range("margin", margin, 0.0, 1.0, hint="0.25: a winner's loss is at least 25% lower")
        check_range("cooldown_fraction", cooldown_fraction, 0.0, 1.0)
        check_int("eval_batches", eval_batches, 1)
        check_int("min_steps", min_steps, 2)
        check_int("warmup_steps", warmup_steps, 0, optional=True)
        if monitor is not None and (not isinstance(monitor, str) or not monitor):
            raise SpeedupConfigError(
                f"`monitor`={monitor!r} is not a metric name. Allowed values: None, 'loss' or the name a "
                "validation_step logs, such as 'val_acc'."
            )
        if mode is not None:
            check_choice("mode", mode, ["min", "max"])
        self.arms = [BASELINE, *[a for a in dict.fromkeys(arms) if a != BASELINE]]
        self.max_cost = float(max_cost)
        self.margin = float(margin)
        self.cooldown_fraction = float(cooldown_fraction)
        self.eval_batches = int(eval_batches)
        self.min_steps = int(min_steps)
        self.monitor = monitor
        self.mode = mode
        self.warmup_steps = warmup_steps
        self.clock = clock
        self.on_decision = on_decision
        self.winner: str | None = None
        self.note = ""
        self.notes: list[str] = []
        self.gaps: dict[str, tuple[float, float, float]] = {}
        self.scored_on = "loss"  # what the gaps are of: the loss, or the monitored metric
        self.cost_s = 0.0
        self.steps = 0
        self._cooldown = 0  # each fork's cool-down steps, from the race's plan
        self.own_step_s = 0.0  # the module's mean race step (seconds), what cost_s is priced against
        self._race: Race | None = None
        self._fit: _Fit | None = None
        self._raced: list[str] = []
        self._saved: dict[str, Any] | None = None
        self._t0: float | None = None
        self._own_s = 0.0
        self._copy_s = 0.0  # one arm's copy (model and optimizer), measured when the race starts
        self._score_s = 0.0  # one held-back batch's scoring forward, measured when the race starts
        self._held: list[Any] = []  # the held-back batches the arms are scored on, fetched when the race starts

    # --- before the first step -----------------------------------------------------------------------------------

    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        refuse_sharded(trainer, "OptimizerRace", "its arms need whole parameters on one rank; use 'ddp'.")
        refuse_manual_optimization(pl_module, "OptimizerRace")

    @override
    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._fit = _Fit(trainer)
        self._fit.monitor, mode = self._scored_on(trainer)
        self._fit.sign = -1.0 if mode == "max" else 1.0
        if self.winner is not None:  # a resumed fit: the winner's optimizer, before Lightning restores its state
            if self.winner != BASELINE and self.winner in ARMS:
                self._swap(trainer, pl_module, ARMS[self.winner], None)
            return
        if self._saved is not None:  # a fit resumed mid-race races on with the arms the checkpoint holds
            return
        why = self._blocker(trainer)
        self._raced = [] if why else self._applicable(trainer, pl_module)
        if why is None and len(self._raced) < 2:
            why = "no arm but the module's own applies"
        plan = None
        while why is None:
            plan = plan_race(
                int(trainer.estimated_stepping_batches),
                len(self._raced),
                max_cost=self.max_cost,
                cooldown_fraction=self.cooldown_fraction,
                eval_batches=self.eval_batches,
                min_steps=self.min_steps,
            )
            if plan.note is None or len(self._raced) <= 2:
                why = plan.note
                break
            # too short for every arm: the last ones (in the order of `arms`) give way, as autotune's budget does
            dropped = self._raced.pop()
            self.notes.append(f"{dropped} not raced: the run is too short for {len(self._raced) + 1} arms")
        if why is not None or plan is None:
            self._decide(trainer, BASELINE, why if why.startswith("not raced") else f"not raced: {why}")
            return
        self.steps = plan.steps
        self._cooldown = plan.cooldown

    def _scored_on(self, trainer: L.Trainer) -> tuple[str | None, str]:
        """The metric the arms are scored on (``None``: the loss) and its mode."""
        if self.monitor == "loss":
            return None, "min"
        if self.monitor is not None:
            return self.monitor, self.mode or "min"
        for callback in [*trainer.early_stopping_callbacks, *trainer.checkpoint_callbacks]:
            name = getattr(callback, "monitor", None)
            if isinstance(name, str) and name:
                return name, self.mode or str(getattr(callback, "mode", "min"))
        return None, "min"

    def _blocker(self, trainer: L.Trainer) -> str | None:
        if len(trainer.optimizers) != 1:
            return f"the module has {len(trainer.optimizers)} optimizers (the race takes one)"
        if not math.isfinite(trainer.estimated_stepping_batches):
            return "the planned fit has no length (max_steps or max_epochs sizes the race)"
        if trainer.accumulate_grad_batches > 1:
            return f"accumulate_grad_batches={trainer.accumulate_grad_batches} (the race steps every batch)"
        if is_schedule_free(trainer.optimizers[0]):
            return "the optimizer is schedule-free already"
        return None

    def _applicable(self, trainer: L.Trainer, pl_module: L.LightningModule) -> list[str]:
        optimizer = trainer.optimizers[0]
        scheduled = any(c.scheduler.optimizer is optimizer for c in trainer.lr_scheduler_configs)
        kept = []
        for name in self.arms:
            kind = ARMS[name].kind
            why = None
            if kind == "muon":
                if isinstance(optimizer, MuonWithAdamW):
                    why = "the optimizer is Muon already"
                elif "betas" not in optimizer.defaults:
                    why = f"{type(optimizer).__name__} is not Adam-type (Muon carries an AdamW learning rate)"
                else:
                    try:
                        assign_muon(pl_module, "adamw")
                    except SpeedupConfigError as err:
                        why = str(err).split(". ")[0]
            elif kind == "schedule_free_adamw":
                if scheduled:
                    why = "an LR scheduler steps the optimizer, and schedule-free takes none"
                else:
                    try:
                        create_schedule_free_adamw([nn.Parameter(torch.zeros(1))])
                    except SpeedupConfigError as err:
                        why = str(err).split(". ")[0]
            if why is None:
                kept.append(name)
            else:
                self.notes.append(f"{name} not raced: {why}")
        return kept

    # --- the race ------------------------------------------------------------------------------------------------

    def _start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> Race:
        """The arms: copies of the module with their optimizers (a resumed race loads their saved state), and the
        held-back batches the arms will be scored on. Their time counts in the race's cost, so the race's length
        is sized knowing what a copy and the scoring's batches cost (the forks at the end are copies too)."""
        start = self.clock()
        fit = self._fit
        assert fit is not None, "on_fit_start sets the fit's view before the first batch"
        own = trainer.optimizers[0]
        arms: dict[str, Any] = {
            BASELINE: _ModuleArm(pl_module, own, list(range(len(own.param_groups))), ARMS[BASELINE], fit)
        }
        saved = self._saved or {}
        for name in self._raced[1:]:
            module = model_copy(pl_module)
            params = _param_map(pl_module, module)
            base = clone_optimizer(own, params)
            optimizer, sources = _build(ARMS[name], base, module, self.warmup_steps)
            state = saved.get("arms", {}).get(name)
            if state is not None:
                module.load_state_dict(state["module"])
                optimizer.load_state_dict(state["optimizer"])
            arms[name] = _ModuleArm(module, optimizer, sources, ARMS[name], fit)
        self._copy_s = (self.clock() - start) / max(1, len(arms) - 1)
        with torch.random.fork_rng(devices=fit.rng_devices()):  # a loader's iterator draws from the generator
            self._held = self._held_back(trainer, pl_module)
            self._probe(next(a for n, a in arms.items() if n != BASELINE), self._held[0])
        race = Race(arms, BASELINE, self.steps, self._cooldown, self.margin, frozenset({BASELINE}), self.clock)
        race.scored_on = self.scored_on = fit.monitor or "loss"
        if saved:
            race.done = int(saved["done"])
            race.seconds.update({k: float(v) for k, v in saved["seconds"].items()})
            race.taken.update({k: int(v) for k, v in saved["taken"].items()})
            race.removed.update(saved["removed"])
            race.recent = list(saved.get("recent", []))
            race.cost_s = float(saved["cost_s"])
            self._own_s = float(saved["own_s"])
        race.cost_s += self.clock() - start
        self._saved = None
        return race

    @override
    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        fit_train_weights(trainer)
        if self.winner is not None:
            return
        if self._race is None:
            self._race = self._start(trainer, pl_module)
        assert self._fit is not None
        self._fit.lrs = [g["lr"] for g in trainer.optimizers[0].param_groups]
        self._fit.batch_idx = batch_idx
        self._t0 = self._now(pl_module)

    def _now(self, pl_module: L.LightningModule) -> float:
        if pl_module.device.type == "cuda":
            torch.cuda.synchronize()
        return self.clock()

    @override
    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self.winner is not None or self._race is None or self._t0 is None:
            return
        own_s = self._now(pl_module) - self._t0
        self._t0 = None
        race = self._race
        self._own_s += own_s if race.done > 0 else 0.0
        due = race.due() if trainer.is_global_zero else None
        due = trainer.strategy.broadcast(due, src=0)  # every rank steps the same arms: their gradients are reduced
        race.step(batch, {BASELINE: own_s}, due)
        steps = self._steps_that_fit(trainer, race) if trainer.is_global_zero else None
        steps = trainer.strategy.broadcast(steps, src=0)
        if steps < self.min_steps:  # not even min_steps fit: stop now, the module's own optimization goes on
            self._race = None
            self._held = []
            self.cost_s = race.cost_s
            self.own_step_s = self._own_s / max(1, race.done - 1)
            self._decide(
                trainer,
                BASELINE,
                f"stopped after {race.done} race steps: its measured cost ({race.cost_s:.1f}s so far, copies and "
                f"first steps included) would pass max_cost={self.max_cost:g} of the planned fit before "
                f"{self.min_steps} race steps; the module's own optimization goes on",
            )
            return
        if steps < self.steps:
            self.notes.append(f"the race was cut from {self.steps} to {steps} steps to stay within max_cost")
            self.steps = steps
        if race.done >= self.steps:
            self._finish(trainer, pl_module, race)

    def _steps_that_fit(self, trainer: L.Trainer, race: Race) -> int:
        """The race's length that keeps what it spent (its one-off costs included: copies, first steps), its
        remaining steps, cool-downs and scoring within ``max_cost`` of the planned fit, as measured so far (never
        below the steps already taken); below ``min_steps`` the race stops."""
        if race.done < 2:
            return self.steps
        own_step = self._own_s / (race.done - 1)
        arm_steps = {n: race.seconds[n] / max(1, race.taken[n] - 1) for n in race.running}
        others = sum(s for n, s in arm_steps.items() if n != BASELINE)
        scoring = self.eval_batches * self._score_s
        finish = sum(s * self._cooldown + scoring + self._copy_s for s in arm_steps.values())  # each fork is a copy
        allowed = self.max_cost * trainer.estimated_stepping_batches * own_step
        room = allowed - race.cost_s - finish
        more = int(room // others) if others > 0 and room > 0 else 0
        return max(min(self.steps, race.done + more), race.done)

    def _held_back(self, trainer: L.Trainer, pl_module: L.LightningModule) -> list[Any]:
        """``eval_batches`` validation batches, topped up with training batches where the validation has fewer."""
        loaders = trainer.val_dataloaders
        loader = loaders[0] if isinstance(loaders, (list, tuple)) and loaders else loaders
        batches: list[Any] = []
        if loader is not None and not isinstance(loaders, Mapping):
            try:
                batches = [trainer.strategy.batch_to_device(b) for b in islice(loader, self.eval_batches)]
            except Exception:  # a loader the fit has not set up yet: the training batches instead
                batches = []
        missing = self.eval_batches - len(batches)
        if missing > 0:
            self.notes.append(f"scored on {missing} training batch(es): the validation has {len(batches)}")
            batches += list(fit_train_batches(trainer, pl_module, missing))
        return batches

    def _probe(self, arm: _ModuleArm, batch: Any) -> None:
        """Score on the loss, with a note, where ``validation_step`` does not log the monitored metric; then time
        one held-back batch's scoring as the forks are scored (a validation batch can be many times a training
        batch, so no fixed share of a step prices it). On an arm's copy of the module, before its first step, in
        evaluation mode and then back in the modes it had: the step may update the copy's metric objects, never the
        module's, and no further copy is paid for."""
        fit = self._fit
        assert fit is not None
        with eval_mode(arm.module), torch.no_grad(), fit.forward_context():
            if fit.monitor is not None:
                logged = validation_step_metrics(arm.module, batch, 0)
                if fit.monitor not in logged:
                    found = ", ".join(sorted(logged)) or "nothing"
                    self.notes.append(f"scored on the loss: validation_step logs no {fit.monitor!r} (it logs {found})")
                    fit.monitor = None
            start = self.clock()
            fit.score(arm.module, batch, 0)
            self._score_s = self.clock() - start

    def _finish(self, trainer: L.Trainer, pl_module: L.LightningModule, race: Race) -> None:
        verdict: RaceVerdict = race.finish(self._held)
        self._held = []
        decision = (verdict.winner, verdict.note, verdict.gaps) if trainer.is_global_zero else None
        winner, note, gaps = trainer.strategy.broadcast(decision, src=0)
        self.gaps = {k: tuple(v) for k, v in gaps.items()}
        self.cost_s = race.cost_s + (self._own_s if winner != BASELINE else 0.0)
        if winner != BASELINE:
            self._swap(trainer, pl_module, ARMS[winner], race.arms[winner])
        self._race = None
        self.own_step_s = self._own_s / max(1, race.done - 1)
        planned = trainer.estimated_stepping_batches * self.own_step_s
        share = f"{self.cost_s:.1f}s, {self.cost_s / planned:.0%} of the planned fit" if planned > 0 else ""
        self._decide(trainer, winner, f"{note} after {race.done} race steps ({share})")

    def _swap(self, trainer: L.Trainer, pl_module: L.LightningModule, spec: ArmSpec, arm: _ModuleArm | None) -> None:
        """The module trains on with ``spec``'s optimization: ``arm``'s weights and optimizer state (``None``: the
        optimizer only, its state restored by Lightning from a checkpoint)."""
        own = trainer.optimizers[0]
        optimizer, sources = _build(spec, own, pl_module, self.warmup_steps)
        schedulers = [c.scheduler for c in trainer.lr_scheduler_configs if c.scheduler.optimizer is own]
        for scheduler in schedulers:
            retarget_scheduler(scheduler, optimizer, sources)
        if not is_schedule_free(optimizer):
            scale_optimizer_lrs(optimizer, schedulers, spec.lr_factor)
        if arm is not None:
            with torch.no_grad():
                pl_module.load_state_dict(arm.module.state_dict())
            _load_state(optimizer, arm.optimizer.state_dict(), keep_rates=not is_schedule_free(optimizer))
        trainer.strategy.optimizers = [optimizer]

    def _decide(self, trainer: L.Trainer, winner: str, note: str) -> None:
        self.winner = winner
        self.note = "; ".join([note, *self.notes])
        rank_zero_info(f"OptimizerRace: {self.note}")
        if self.on_decision is not None and trainer.is_global_zero:
            self.on_decision(self)

    # --- schedule-free winners, checkpoints ----------------------------------------------------------------------

    @override
    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        fit_eval_weights(trainer, pl_module, 0)

    @override
    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        fit_eval_weights(trainer, pl_module, 0)
        if self.winner is None and self._race is not None:
            self.note = f"undecided: the fit ended after {self._race.done} of {self.steps} race steps"
            rank_zero_info(f"OptimizerRace: {self.note}")

    @override
    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        eval_weights_into_checkpoint(pl_module, trainer.optimizers, checkpoint)

    @override
    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {
            "winner": self.winner,
            "note": self.note,
            "gaps": {k: list(v) for k, v in self.gaps.items()},
            "scored_on": self.scored_on,
            "cost_s": self.cost_s,
            "steps": self.steps,
        }
        race = self._race
        if race is not None and self.winner is None:
            state["race"] = {
                "raced": list(self._raced),
                "cooldown": self._cooldown,
                "done": race.done,
                "seconds": dict(race.seconds),
                "taken": dict(race.taken),
                "removed": dict(race.removed),
                "cost_s": race.cost_s,
                "own_s": self._own_s,
                "recent": [b for b in race.recent if _plain(b)],
                "arms": {
                    n: {"module": a.module.state_dict(), "optimizer": a.optimizer.state_dict()}
                    for n, a in race.arms.items()
                    if n != BASELINE
                },
            }
        return state

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.winner = state_dict["winner"]
        self.note = str(state_dict["note"])
        self.gaps = {k: tuple(v) for k, v in state_dict["gaps"].items()}
        self.scored_on = str(state_dict.get("scored_on", "loss"))
        self.cost_s = float(state_dict["cost_s"])
        self.steps = int(state_dict["steps"])
        race = state_dict.get("race")
        if race is not None:
            self._saved = race
            self._raced = list(race["raced"])
            self._cooldown = int(race["cooldown"])


def _load_state(optimizer: torch.optim.Optimizer, state: dict[str, Any], keep_rates: bool) -> None:
    """Load ``state`` into ``optimizer``; with ``keep_rates`` its groups keep their own learning rates (those the
    schedulers were scaled to: the arm's groups carry the module's ``initial_lr``, ``max_lr``...) and take the rest
    (a Muon group's warm-up count) from ``state``."""
    if keep_rates:
        groups = []
        for mine, theirs in zip(optimizer.param_groups, state["param_groups"]):
            rates = {k: mine[k] for k in RATE_KEYS if k in mine}
            groups.append({**theirs, **rates})
        state = {**state, "param_groups": groups}
    optimizer.load_state_dict(state)


def _plain(batch: Any) -> bool:
    """Whether ``batch`` is tensors in lists, tuples and dicts of strings (what ``weights_only=True`` loads)."""
    if isinstance(batch, torch.Tensor):
        return True
    if isinstance(batch, (list, tuple)):
        return all(_plain(b) for b in batch)
    if isinstance(batch, dict):
        return all(isinstance(k, str) and _plain(v) for k, v in batch.items())
    return isinstance(batch, (int, float, str, bool)) or batch is None


register_technique(
    TechniqueInfo(
        name="optimizer_race",
        callback=OptimizerRace,
        functional=plan_race,
        summary="race the module's optimizer against a 3x lr, Muon and schedule-free AdamW; the winner trains on",
        ways=(2,),
    )
)
