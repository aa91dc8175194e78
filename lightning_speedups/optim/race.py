"""The optimization race: optimizers trained side by side from the same weights on the same batches, the winner kept.

A step-time trial can time an option on any batch; an optimizer's worth is the loss it reaches, which only training
shows. So each *arm* of a race (the user's optimizer as it is, the same at another learning rate, Muon,
schedule-free AdamW) trains its own copy of the model from the same starting weights on the fit's own batches, and
is scored on held-back batches:

- **At equal wall time.** After one untimed step each (first-call costs), an arm takes a race step only while its
  training seconds trail the baseline's, so an arm whose steps are 10% slower takes about 10% fewer of them.
- **After a short cool-down.** A large learning rate looks worse mid-run than it ends (its noise floor is higher),
  and a small one looks better early than it ends (short-horizon bias, Wu et al. 2018). A cool-down from any point
  of a constant-rate run gives about the loss a run of that length ends at (Hägele et al. 2024), so each arm is
  scored on a *fork* that trains ``cooldown`` more steps with its rate decaying linearly to zero, on the race's last
  batches. The forks are thrown away: the winner continues from its state before the cool-down. Arms whose
  optimizer has no schedule to decay (schedule-free) train those steps at their rate and are scored at their
  average weights.
- **Clearly ahead, or the user's.** On each held-back batch the gap is the baseline's loss minus the arm's, relative
  to the baseline's. An arm wins only when the low end of the interval of its per-batch gaps
  (:func:`~lightning_speedups.measure.median_interval`: with a few batches, the smallest gap) clears ``margin``;
  otherwise the baseline stays. An arm whose loss turns NaN or inf leaves the race with a note.
- **Within its cost.** :func:`plan_race` sizes the race before any step so that what it adds (the other arms' steps,
  every arm's cool-down and scoring) stays within ``max_cost`` of the planned run, counted in the baseline's steps
  (at equal wall time each arm costs about as much as the baseline's race steps). A run too short for
  ``min_steps`` race steps is not raced, and the note says how many steps it would need.

:class:`Race` holds the logic and nothing of Lightning: an arm is any object with ``step``, ``fork`` and
``evaluate`` (:class:`Arm`), and time comes from ``clock``, so a test replays loss curves on a fake clock.
:class:`~lightning_speedups.callbacks.optimizer_race.OptimizerRace` runs one inside a fit.

Example::

    >>> plan = plan_race(planned_steps=2000, arms=4)
    >>> plan.steps, plan.cooldown, plan.note is None
    (48, 12, True)
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from lightning_speedups._errors import check_int, check_range
from lightning_speedups.measure import median, median_interval

__all__ = [
    "EVAL_STEP_SHARE",
    "Arm",
    "Race",
    "RacePlan",
    "RaceVerdict",
    "decide",
    "plan_race",
]

# one scoring forward on a held-back batch, in training steps (forward only, no backward or optimizer step)
EVAL_STEP_SHARE = 0.35


class Arm(Protocol):
    """One optimization in a race: a model with its optimizer."""

    decays: bool  # whether its learning rate can cool down (False: schedule-free, scored at its average)

    def step(self, batch: Any, lr_scale: float) -> float:
        """One training step on ``batch`` with every learning rate times ``lr_scale``; the training loss."""

    def fork(self) -> Arm:
        """An independent copy (model and optimizer state) to cool down and score."""

    def evaluate(self, batches: Sequence[Any]) -> list[float]:
        """The loss on each held-back batch (no gradient, evaluation weights)."""


@dataclass(frozen=True)
class RacePlan:
    """How long a race runs: ``steps`` race steps of the baseline (0: not raced, ``note`` says why), each arm then
    ``cooldown`` steps on a fork, scored on ``eval_batches`` held-back batches; ``cost_steps`` is what that adds, in
    the baseline's steps, against ``allowed_steps``."""

    steps: int
    cooldown: int
    eval_batches: int
    cost_steps: float
    allowed_steps: float
    note: str | None = None


def _cost(steps: int, arms: int, cooldown: int, eval_batches: int) -> float:
    return (arms - 1) * steps + arms * (cooldown + eval_batches * EVAL_STEP_SHARE)


def plan_race(
    planned_steps: int,
    arms: int,
    *,
    max_cost: float = 0.1,
    cooldown_fraction: float = 0.25,
    eval_batches: int = 4,
    min_steps: int = 8,
    max_steps: int = 200,
) -> RacePlan:
    """Size a race of ``arms`` arms (the baseline included) on a run of ``planned_steps`` optimizer steps.

    The race takes ``steps`` steps of the fit (the baseline's are the fit's own), ``cooldown`` = ``cooldown_fraction``
    of them on each arm's fork, and scores every arm on ``eval_batches`` batches; the steps are the most that keep
    that cost within ``max_cost`` of the planned run, at most ``max_steps``.

    Example::

        >>> plan_race(planned_steps=100, arms=3).note.split("; ")[-1]
        'a run of at least 262 steps would be raced'
    """
    check_int("arms", arms, 2)
    check_range("max_cost", max_cost, 0.0, 1.0, low_inclusive=False)
    check_range("cooldown_fraction", cooldown_fraction, 0.0, 1.0)
    check_int("eval_batches", eval_batches, 1)
    check_int("min_steps", min_steps, 2)
    allowed = max_cost * max(0, int(planned_steps))
    per_step = (arms - 1) + arms * cooldown_fraction
    fixed = arms * eval_batches * EVAL_STEP_SHARE
    steps = min(max_steps, int((allowed - fixed) // per_step)) if allowed > fixed else 0
    while steps >= min_steps and _cost(steps, arms, math.ceil(cooldown_fraction * steps), eval_batches) > allowed:
        steps -= 1  # the cool-down rounds up
    if steps < min_steps:
        need = _cost(min_steps, arms, math.ceil(cooldown_fraction * min_steps), eval_batches)
        note = (
            f"not raced: {arms} arms need at least {min_steps} race steps each (about {need:.0f} steps of cost), "
            f"more than max_cost={max_cost:g} of a {planned_steps}-step run allows ({allowed:.0f} steps); a run of at "
            f"least {math.ceil(need / max_cost)} steps would be raced"
        )
        return RacePlan(0, 0, eval_batches, 0.0, allowed, note)
    cooldown = math.ceil(cooldown_fraction * steps)
    return RacePlan(steps, cooldown, eval_batches, _cost(steps, arms, cooldown, eval_batches), allowed)


@dataclass(frozen=True)
class RaceVerdict:
    """A race's decision: the ``winner``, each scored arm's relative loss gap over the baseline as ``(low, median,
    high)`` (> 0: lower loss than the baseline), the arms removed with why, and one line that says it."""

    winner: str
    gaps: dict[str, tuple[float, float, float]]
    removed: dict[str, str]
    note: str


def decide(
    losses: Mapping[str, Sequence[float]],
    baseline: str,
    margin: float,
    removed: Mapping[str, str] | None = None,
    scored_on: str = "loss",
) -> RaceVerdict:
    """The arm whose per-batch loss gap over ``baseline`` clears ``margin`` at the low end of its interval (the best
    median gap among those that do), else ``baseline``. ``losses[name][j]`` is arm ``name``'s loss on held-back
    batch ``j`` (any score where lower is better: a metric to maximise comes negated); an arm with a non-finite loss
    is removed. ``scored_on`` names the score in the note.

    A batch's gap is the difference relative to the larger of the two values, so it stays within +-100%: a loss the
    arm halves is +50%, an accuracy it raises from 0.2 to 0.8 is +75%, and a batch on which the baseline scores an
    accuracy of 0 gives +100%, not an unbounded gap that no interval could judge.

    Example::

        >>> decide({"own": [2.0, 2.1, 1.9], "muon": [1.6, 1.7, 1.5]}, "own", margin=0.02).winner
        'muon'
        >>> decide({"own": [2.0, 2.1, 1.9], "muon": [1.9, 2.2, 1.8]}, "own", margin=0.02).winner
        'own'
    """
    gone = dict(removed or {})
    base = [float(x) for x in losses[baseline]]
    gaps: dict[str, tuple[float, float, float]] = {}
    for name, values in losses.items():
        if name == baseline or name in gone:
            continue
        if not all(math.isfinite(float(v)) for v in values):
            gone[name] = f"its held-back {scored_on} is NaN or inf"
            continue
        per_batch = [(b - float(v)) / max(abs(b), abs(float(v)), 1e-12) for b, v in zip(base, values)]
        lo, hi = median_interval(per_batch)
        gaps[name] = (lo, median(per_batch), hi)
    ahead = {n: g for n, g in gaps.items() if g[0] > margin}
    winner = max(ahead, key=lambda n: ahead[n][1]) if ahead else baseline
    listed = ", ".join(f"{n} {g[1]:+.1%} [{g[0]:+.1%}, {g[2]:+.1%}]" for n, g in gaps.items())
    dropped = "".join(f"; {n} removed: {why}" for n, why in gone.items())
    if winner == baseline:
        note = (
            f"kept {baseline}: no arm's {scored_on} was better by {margin:.0%} beyond noise ({listed or 'none scored'})"
        )
    else:
        note = f"chose {winner}: {scored_on} gap over {baseline} {listed}"
    return RaceVerdict(winner, gaps, gone, note + dropped)


@dataclass
class Race:
    """A race of ``arms`` (``baseline`` among them) over ``steps`` race steps, then cool-down and scoring.

    Call :meth:`step` once per race step with the batch (arms named in ``external`` are trained by someone else,
    the fit, and only report their seconds), then :meth:`finish` with the held-back batches. ``cost_s`` is every
    second the race spent on the other arms, their cool-downs and the scoring.

    Args:
        arms: the arms by name.
        baseline: the arm kept unless another is clearly ahead.
        steps: race steps (the first is untimed: first-call costs).
        cooldown: steps of each arm's fork before scoring, on the race's last batches.
        margin: the relative loss gap an arm must clear beyond noise.
        external: arms stepped outside the race (their seconds go to :meth:`step`).
        clock: seconds as a float.
        scored_on: what the arms' ``evaluate`` returns (lower is better), named in the verdict's note.
    """

    arms: dict[str, Arm]
    baseline: str
    steps: int
    cooldown: int
    margin: float = 0.25
    external: frozenset[str] = frozenset()
    clock: Callable[[], float] = time.perf_counter
    scored_on: str = "loss"
    done: int = 0
    seconds: dict[str, float] = field(default_factory=dict)
    taken: dict[str, int] = field(default_factory=dict)
    removed: dict[str, str] = field(default_factory=dict)
    recent: list[Any] = field(default_factory=list)
    cost_s: float = 0.0

    def __post_init__(self) -> None:
        for name in self.arms:
            self.seconds.setdefault(name, 0.0)
            self.taken.setdefault(name, 0)

    @property
    def running(self) -> list[str]:
        return [n for n in self.arms if n not in self.removed]

    def due(self) -> list[str]:
        """The arms (not external) that take the coming race step: all on the first, then those whose training
        seconds trail the baseline's by at least half their own last step."""
        names = [n for n in self.running if n not in self.external]
        if self.done == 0:
            return names
        mark = self.seconds[self.baseline]
        last = {n: self.seconds[n] / max(1, self.taken[n] - 1) for n in names}
        return [n for n in names if n == self.baseline or self.seconds[n] + 0.5 * last[n] <= mark]

    def step(self, batch: Any, seconds: Mapping[str, float] | None = None, due: Sequence[str] | None = None) -> None:
        """One race step on ``batch``: the external arms' ``seconds``, then each due arm's own step, timed.

        The baseline is stepped first (when not external) so the others are due against its seconds."""
        for name, s in (seconds or {}).items():
            self._count(name, s)
        names = list(self.due() if due is None else due)
        if self.baseline in names:
            names.remove(self.baseline)
            names.insert(0, self.baseline)
        for name in names:
            if name in self.removed:
                continue
            start = self.clock()
            loss = self.arms[name].step(batch, 1.0)
            spent = self.clock() - start
            if name != self.baseline:
                self.cost_s += spent
            if not math.isfinite(loss):
                self.removed[name] = f"its training loss was {loss} at race step {self.done}"
                continue
            self._count(name, spent)
        self.recent = [*self.recent, batch][-max(1, self.cooldown) :]
        self.done += 1

    def _count(self, name: str, spent: float) -> None:
        if self.done > 0:  # the first step of each arm is untimed
            self.seconds[name] += spent
        self.taken[name] += 1

    def finish(self, held_back: Sequence[Any]) -> RaceVerdict:
        """Cool each running arm's fork down on the race's last batches, score it on ``held_back``, decide."""
        losses: dict[str, list[float]] = {}
        start = self.clock()
        for name in self.running:
            arm = self.arms[name]
            fork = arm.fork()
            diverged = False
            for i in range(self.cooldown):
                scale = (self.cooldown - i) / (self.cooldown + 1) if arm.decays else 1.0
                batch = self.recent[i % len(self.recent)]
                if not math.isfinite(fork.step(batch, scale)):
                    diverged = True
                    break
            if diverged:
                self.removed[name] = "its loss turned NaN or inf in the cool-down"
                continue
            losses[name] = [float(x) for x in fork.evaluate(held_back)]
        self.cost_s += self.clock() - start
        if self.baseline not in losses:  # the baseline is the user's run: nothing to compare against
            return RaceVerdict(self.baseline, {}, dict(self.removed), f"kept {self.baseline}: it could not be scored")
        return decide(losses, self.baseline, self.margin, self.removed, self.scored_on)
