"""InFitTrial: two ways of running the same training step, timed on the fit's own first steps, the faster kept.

An offline trial times copies of the model on one batch before the fit, and that time is lost to training. Here the
trial *is* training: the first optimizer steps of the fit alternate between a baseline option and a candidate, each
a real step on a real batch, timed from ``on_train_batch_start`` to ``on_train_batch_end`` (forward, backward,
optimizer step; data loading is outside). When the rounds settle (:func:`~lightning_speedups.measure.settle`, the
rule of :func:`~lightning_speedups.measure.compare`), the rest of the fit runs the winner. What the trial costs is
only the extra time of the slower option's steps, never the steps themselves, and a slower option is dropped once
its extra time passes ``max_cost`` of the planned fit.

Only options that leave the step's result the same (a precision, a memory layout) can be trialled this way: the
steps of both train the one model. Subclasses say how to run an option (:meth:`InFitTrial._enter` /
:meth:`InFitTrial._leave`), when the candidate cannot run here, and how to check it once before its first step.
Two trials in one fit take turns: a trial starts its rounds once every trial before it in the Trainer's callbacks has
decided, so no step is timed under two changes at once.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info
from typing_extensions import override

from lightning_speedups._errors import check_int, check_range
from lightning_speedups.measure import look_rounds, median, settle

__all__ = ["MIN_ROUNDS", "InFitTrial"]

MIN_ROUNDS = 3  # as autotune's comparisons: below 8 rounds the interval is the range, so all 3 must clear


class InFitTrial(Callback):
    """The round machinery of an in-fit trial; a subclass names its two options and runs them.

    Class attributes of a subclass: ``BASELINE`` and ``CANDIDATE`` (the options' names, kept in ``kept``) and
    ``LABELS`` (how notes name them: ``{"32-true": "fp32", "bf16-mixed": "bf16"}``).

    Args:
        margin: the candidate must be this much faster per step (0.05: 5%) beyond noise to be kept.
        max_rounds: rounds at most (one step of each option per round); at least 3.
        max_cost: the largest share of the planned fit (its steps times the baseline's step) that the slower
            option's extra time may take before the trial stops and keeps the baseline.
        clock: seconds as a float (tests inject a fake one).
        on_decision: called with the callback on rank 0 once the fit decides (``kept``, ``ratio``, ``rounds`` and
            ``note`` set), not again for a decision a checkpoint restored. It must not raise, and under
            ``ddp_spawn`` it must pickle.
    """

    BASELINE = "baseline"
    CANDIDATE = "candidate"
    LABELS: dict[str, str] = {}

    def __init__(
        self,
        margin: float = 0.05,
        max_rounds: int = 12,
        max_cost: float = 0.02,
        *,
        clock: Callable[[], float] = time.perf_counter,
        on_decision: Callable[[Any], None] | None = None,
    ) -> None:
        check_range(
            "margin", margin, 0.0, 1.0, hint=f"0.05 keeps {self._label(self.CANDIDATE)} only when at least 5% faster"
        )
        check_int("max_rounds", max_rounds, MIN_ROUNDS, 1000)
        check_range("max_cost", max_cost, 0.0, 1.0, low_inclusive=False, hint="0.02: 2% of the planned fit")
        self.margin = float(margin)
        self.max_rounds = int(max_rounds)
        self.max_cost = float(max_cost)
        self.clock = clock
        self.on_decision = on_decision
        self.kept: str | None = None  # BASELINE or CANDIDATE once decided
        self.times: dict[str, list[float]] = {self.BASELINE: [], self.CANDIDATE: []}  # complete rounds only
        self.ratio: tuple[float, float, float] = (1.0, 1.0, 1.0)
        self.note = ""
        self.arm: str | None = None  # the option of the step running now (None: the kept one, or waiting)
        self._slot = 0  # optimizer steps of this trial since the fit (or the resume) started, while the rounds run
        self._accumulate = 1  # batches per optimizer step: one step of an option is that many batches, timed together
        self._group: tuple[int, float] = (0, 0.0)  # batches of the current step so far, and their seconds
        self._pending: float | None = None  # the first half of a round
        self._t0: float | None = None
        self._device_type = "cpu"
        self._planned_steps = math.inf

    @property
    def rounds(self) -> int:
        return len(self.times[self.BASELINE])

    def _label(self, option: str) -> str:
        return self.LABELS.get(option, option)

    # --- what a subclass provides ------------------------------------------------------------------------------

    def _enter(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, option: str) -> None:
        """Run the coming training step in ``option`` (called before its timing starts)."""

    def _leave(self) -> None:
        """Undo what :meth:`_enter` set for one step only (called after the step, on exceptions and teardown)."""

    def _check(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int) -> str | None:
        """Why the candidate must not run on this model (checked once, before its first step), or ``None``."""
        return None

    # --- the rounds ----------------------------------------------------------------------------------------------

    def _decide_unsupported(self, why: str | None) -> None:
        """Keep the baseline without a step spent on the candidate, where ``why`` says it cannot run here."""
        if why is not None and self.kept is None:
            self.kept = self.BASELINE
            self.note = f"{self._label(self.CANDIDATE)} not tried: {why}"
            rank_zero_info(f"{type(self).__name__}: {self.note}; the fit runs in {self._label(self.BASELINE)}.")

    @override
    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # a resumed trial warms both options up again
        self._slot = 0
        self._pending = None
        self._group = (0, 0.0)
        self._accumulate = max(1, int(trainer.accumulate_grad_batches))
        self._planned_steps = float(trainer.estimated_stepping_batches)

    def _waiting(self, trainer: L.Trainer) -> bool:
        """Whether a trial before this one in the Trainer's callbacks is still timing its rounds."""
        for cb in trainer.callbacks:  # type: ignore[attr-defined]
            if cb is self:
                return False
            if isinstance(cb, InFitTrial) and cb.kept is None:
                return True
        return False

    def _arm_now(self) -> str | None:
        if self.kept is not None:
            return None
        if self._slot < 2:  # untimed first step of each option
            return (self.BASELINE, self.CANDIDATE)[self._slot]
        return self._order()[(self._slot - 2) % 2]

    def _order(self) -> tuple[str, str]:
        """The options' order in the current round: alternated from round to round (no position bias)."""
        pair = (self.BASELINE, self.CANDIDATE)
        return pair if self.rounds % 2 == 0 else (pair[1], pair[0])

    def _now(self) -> float:
        if self._device_type == "cuda":
            torch.cuda.synchronize()
        return self.clock()

    @override
    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        waiting = self.kept is None and self._waiting(trainer)
        if not waiting and self.kept is None and self._slot == 1 and self._group[0] == 0:
            why = self._check(trainer, pl_module, batch, batch_idx) if trainer.is_global_zero else None
            why = trainer.strategy.broadcast(why, src=0)
            if why is not None:  # before the candidate's first step: it fails here
                self.kept = self.BASELINE
                self.note = f"kept {self._label(self.BASELINE)}: {why}"
                self._t0 = None
                self._decided(trainer)
        self.arm = None if waiting else self._arm_now()
        option = self.arm or (self.BASELINE if waiting else self.kept) or self.BASELINE
        self._enter(trainer, pl_module, batch, option)
        self._t0 = self._now() if self.arm is not None else None

    @override
    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._leave()
        if self._t0 is None:
            return
        seconds = self._now() - self._t0
        self._t0 = None
        batches = self._group[0] + 1
        seconds = self._group[1] + seconds
        if batches < self._accumulate:  # the option holds until the optimizer steps (gradient accumulation)
            self._group = (batches, seconds)
            return
        self._group = (0, 0.0)
        slot = self._slot
        self._slot = self._slot + 1
        if slot < 2:
            return
        if (slot - 2) % 2 == 0:
            self._pending = seconds
            return
        first, second = self._order()
        self.times[first].append(float(self._pending or 0.0))
        self.times[second].append(seconds)
        self._pending = None
        self._decide(trainer)

    def _decide(self, trainer: L.Trainer) -> None:
        """After each round: rank 0's decision (at the looks, or on cost), the same on every rank."""
        decision = self._decision() if trainer.is_global_zero else None
        decision = trainer.strategy.broadcast(decision, src=0)
        if decision is None:
            return
        self.kept = decision[0]
        self.ratio = tuple(decision[1])
        self.note = decision[2]
        self._decided(trainer)

    def _decided(self, trainer: L.Trainer) -> None:
        rank_zero_info(f"{type(self).__name__}: {self.note}")
        if self.on_decision is not None and trainer.is_global_zero:
            self.on_decision(self)

    def _decision(self) -> tuple[str, tuple[float, float, float], str] | None:
        """The option to keep, its ratio and the note, or ``None`` while the rounds go on."""
        rounds = self.rounds
        ratio = (1.0, 1.0, 1.0)
        base = self._label(self.BASELINE)
        cand = self._label(self.CANDIDATE)
        if rounds >= MIN_ROUNDS:
            result = settle(self.times, self.BASELINE, min_gain=self.margin)
            ratio = result.ratios[self.CANDIDATE]
            if rounds >= self.max_rounds or (result.settled and rounds in look_rounds(MIN_ROUNDS, self.max_rounds)):
                return self._verdict(result.winner, ratio)
        extra = sum(self.times[self.CANDIDATE]) - sum(self.times[self.BASELINE])
        allowed = self.max_cost * median(self.times[self.BASELINE]) * self._planned_steps
        if extra > allowed:  # a slower candidate: more rounds only cost more
            return (
                self.BASELINE,
                ratio,
                (
                    f"kept {base}: the {cand} steps took {extra:.2f}s more than the {base} ones in {rounds} round(s), "
                    f"above `max_cost`={self.max_cost:g} of the planned fit ({allowed:.2f}s)"
                ),
            )
        return None

    def _verdict(self, winner: str, ratio: tuple[float, float, float]) -> tuple[str, tuple[float, float, float], str]:
        lo, mid, hi = ratio
        base = self._label(self.BASELINE)
        cand = self._label(self.CANDIDATE)
        if winner == self.CANDIDATE:
            return (
                self.CANDIDATE,
                ratio,
                f"kept {self.CANDIDATE}: {mid:.2f}x faster per step [{lo:.2f}, {hi:.2f}] in {self.rounds} rounds",
            )
        return (
            self.BASELINE,
            ratio,
            (
                f"kept {base}: {cand} ran at {mid:.2f}x [{lo:.2f}, {hi:.2f}] the {base} speed in {self.rounds} "
                f"rounds, not {1 + self.margin:.2f}x beyond noise"
            ),
        )

    @override
    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.kept is None:  # a fit shorter than the rounds: say so rather than leave the note empty
            self.note = (
                f"undecided: the fit ended after {self.rounds} of at most {self.max_rounds} rounds; a "
                "resumed fit goes on with them"
            )
            rank_zero_info(f"{type(self).__name__}: {self.note}")

    @override
    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        self._leave()

    @override
    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._leave()

    @override
    def state_dict(self) -> dict[str, Any]:
        return {
            "kept": self.kept,
            "times": {k: list(v) for k, v in self.times.items()},
            "ratio": list(self.ratio),
            "note": self.note,
        }

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.kept = state_dict["kept"]
        self.times = {k: [float(x) for x in v] for k, v in state_dict["times"].items()}
        self.ratio = tuple(state_dict["ratio"])  # type: ignore[assignment]
        self.note = str(state_dict["note"])
