"""The optimization race's rules on replayed loss curves with seeded noise and a fake clock: no training, no timing."""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from lightning_speedups._errors import SpeedupConfigError
from lightning_speedups.optim.race import EVAL_STEP_SHARE, Race, decide, plan_race


@dataclass
class Clock:
    now: float = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass
class ReplayArm:
    """An arm whose loss after ``n`` steps is ``curve(n)``; a cool-down of ``c`` steps lowers it by ``cooldown_gain``
    of its noise floor (what a decayed rate gives); each step advances the fake clock by ``step_s``; scoring adds
    seeded noise of ``noise`` (relative) per held-back batch."""

    curve: Callable[[float], float]
    clock: Clock
    step_s: float
    rng: random.Random
    noise: float = 0.01
    cooldown_gain: float = 0.0
    decays: bool = True
    n: int = 0
    broken_scoring: bool = False
    cooled: int = 0
    steps_seen: list[float] = field(default_factory=list)

    def step(self, batch: object, lr_scale: float) -> float:
        self.clock.now += self.step_s
        self.steps_seen.append(lr_scale)
        if lr_scale < 1.0:
            self.cooled += 1
        else:
            self.n += 1
        return self.curve(self.n)

    def fork(self) -> ReplayArm:
        return ReplayArm(
            self.curve,
            self.clock,
            self.step_s,
            self.rng,
            self.noise,
            self.cooldown_gain,
            self.decays,
            self.n,
            self.broken_scoring,
        )

    def evaluate(self, batches: list[object]) -> list[float]:
        self.clock.now += EVAL_STEP_SHARE * self.step_s * len(batches)
        base = math.inf if self.broken_scoring else self.curve(self.n) - (self.cooldown_gain if self.cooled else 0.0)
        return [base * (1.0 + self.rng.gauss(0.0, self.noise)) for _ in batches]


def _curve(floor: float, speed: float) -> Callable[[float], float]:
    return lambda n: floor + 3.0 * math.exp(-speed * n)


def _race(arms: dict[str, ReplayArm], clock: Clock, steps: int = 20, cooldown: int = 5, own_s: float = 1.0) -> Race:
    """Run ``steps`` race steps with ``"own"`` stepped outside (as the fit does) at ``own_s`` per step."""
    race = Race(arms, "own", steps, cooldown, margin=0.02, external=frozenset({"own"}), clock=clock)
    for i in range(steps):
        arms["own"].step(i, 1.0)
        race.step(i, {"own": own_s})
    return race


def _arms(clock: Clock, seed: int, **curves: tuple[Callable[[float], float], float]) -> dict[str, ReplayArm]:
    rng = random.Random(seed)
    return {name: ReplayArm(curve, clock, step_s, rng) for name, (curve, step_s) in curves.items()}


@pytest.mark.parametrize("seed", range(5))
def test_race_keeps_the_better_candidate(seed: int) -> None:
    clock = Clock()
    arms = _arms(
        clock, seed, own=(_curve(1.0, 0.05), 1.0), muon=(_curve(1.0, 0.15), 1.1), slow=(_curve(1.0, 0.02), 1.0)
    )
    verdict = _race(arms, clock).finish(["held"] * 4)
    assert verdict.winner == "muon"
    assert verdict.gaps["muon"][0] > 0.02 and verdict.gaps["slow"][1] < 0
    assert verdict.note.startswith("chose muon")


def test_race_keeps_the_users_optimization_when_the_gap_is_inside_the_noise() -> None:
    kept = []
    for seed in range(40):
        clock = Clock()
        same = _curve(1.0, 0.05)
        arms = _arms(clock, seed, own=(same, 1.0), lr_x3=(same, 1.0), muon=(_curve(0.99, 0.05), 1.0))
        for arm in arms.values():
            arm.noise = 0.02
        kept.append(_race(arms, clock).finish(["held"] * 4).winner)
    assert kept == ["own"] * 40


def test_race_removes_a_diverging_arm_and_never_hands_it_the_weights() -> None:
    clock = Clock()
    arms = _arms(clock, 0, own=(_curve(1.0, 0.05), 1.0), hot=(lambda n: 0.5 if n < 6 else math.nan, 1.0))
    race = _race(arms, clock)
    assert "hot" in race.removed and "race step" in race.removed["hot"]
    verdict = race.finish(["held"] * 4)
    assert verdict.winner == "own" and "hot removed" in verdict.note


def test_race_removes_an_arm_that_diverges_in_its_cool_down_or_scoring() -> None:
    clock = Clock()
    arms = _arms(clock, 0, own=(_curve(1.0, 0.05), 1.0), odd=(_curve(0.5, 0.05), 1.0))
    arms["odd"].broken_scoring = True
    verdict = _race(arms, clock).finish(["held"] * 4)
    assert verdict.winner == "own" and "NaN or inf" in verdict.removed["odd"]


def test_equal_wall_time_a_slower_arm_takes_fewer_steps() -> None:
    clock = Clock()
    arms = _arms(clock, 0, own=(_curve(1.0, 0.05), 1.0), slow=(_curve(1.0, 0.05), 1.5), fast=(_curve(1.0, 0.05), 0.5))
    race = _race(arms, clock, steps=31)
    assert race.taken["own"] == 31
    assert 20 <= race.taken["slow"] <= 22  # 1 untimed step, then 30 s of 1.5 s steps
    assert race.taken["fast"] == 31  # one step per batch at most: a faster arm is not given more batches


def test_the_cool_down_decays_the_rate_and_only_where_it_can() -> None:
    clock = Clock()
    arms = _arms(clock, 0, own=(_curve(1.0, 0.05), 1.0), free=(_curve(1.0, 0.05), 1.0))
    arms["free"].decays = False
    race = _race(arms, clock, cooldown=4)
    forks: dict[str, ReplayArm] = {}
    for name, arm in arms.items():
        real_fork = arm.fork

        def fork(real_fork: Callable[[], ReplayArm] = real_fork, name: str = name) -> ReplayArm:
            forks[name] = real_fork()
            return forks[name]

        arm.fork = fork  # type: ignore[method-assign]
    race.finish(["held"] * 4)
    assert forks["own"].steps_seen == pytest.approx([0.8, 0.6, 0.4, 0.2])
    assert forks["free"].steps_seen == [1.0] * 4
    assert arms["own"].n == 20 and not arms["own"].cooled  # the winner goes on from before its cool-down


def test_short_horizon_guard_the_cool_down_can_turn_the_decision() -> None:
    """A large rate with a high noise floor loses without a cool-down and wins once both are cooled down."""
    clock = Clock()
    arms = _arms(clock, 0, own=(_curve(1.0, 0.05), 1.0), lr_x3=(_curve(2.3, 0.3), 1.0))
    arms["own"].cooldown_gain = 0.02
    arms["lr_x3"].cooldown_gain = 0.5
    assert _race(arms, clock, cooldown=0).finish(["held"] * 4).winner == "own"
    clock = Clock()
    arms = _arms(clock, 0, own=(_curve(1.0, 0.05), 1.0), lr_x3=(_curve(2.3, 0.3), 1.0))
    arms["own"].cooldown_gain = 0.02
    arms["lr_x3"].cooldown_gain = 0.5
    assert _race(arms, clock, cooldown=5).finish(["held"] * 4).winner == "lr_x3"


@pytest.mark.parametrize("planned", [300, 1000, 5000])
@pytest.mark.parametrize("slow", [1.0, 1.3])
def test_the_race_stays_within_its_cost_bound(planned: int, slow: float) -> None:
    plan = plan_race(planned, 3, max_cost=0.1)
    assert plan.steps >= 8 and plan.cost_steps <= plan.allowed_steps
    clock = Clock()
    arms = _arms(clock, 0, own=(_curve(1.0, 0.05), 1.0), lr_x3=(_curve(1.0, 0.08), slow), muon=(_curve(1.0, 0.1), slow))
    race = _race(arms, clock, steps=plan.steps, cooldown=plan.cooldown)
    race.finish(["held"] * plan.eval_batches)
    # the other arms' steps (equal time), every cool-down and every scoring, at most a tenth of the planned run
    # (slower arms cool down at their own speed, hence the slack of one cool-down)
    assert race.cost_s <= 0.1 * planned * 1.0 + plan.cooldown * (slow - 1.0) * 3 + 2 * slow


def test_plan_race_says_what_a_short_run_would_need() -> None:
    plan = plan_race(200, 4)
    assert plan.steps == 0 and plan.note is not None
    needed = int(plan.note.split("at least ")[-1].split(" steps")[0])
    assert plan_race(needed, 4).steps >= 8 and plan_race(needed - 1, 4).steps == 0


def test_plan_race_and_decide_refuse_bad_arguments() -> None:
    with pytest.raises(SpeedupConfigError, match="`arms`=1"):
        plan_race(1000, 1)
    with pytest.raises(SpeedupConfigError, match="`max_cost`=0"):
        plan_race(1000, 3, max_cost=0)


def test_decide_reports_each_gap_with_its_interval() -> None:
    verdict = decide({"own": [2.0, 2.0, 2.0, 2.0], "muon": [1.8, 1.9, 1.7, 1.8]}, "own", 0.02)
    lo, mid, hi = verdict.gaps["muon"]
    assert lo == pytest.approx(0.05) and mid == pytest.approx(0.1) and hi == pytest.approx(0.15)
    assert "muon +10.0% [+5.0%, +15.0%]" in verdict.note


def test_a_gap_is_relative_to_the_larger_value_so_a_zero_score_does_not_make_it_unbounded() -> None:
    # an accuracy to maximise comes negated; the module's own scores 0 on the first batch
    verdict = decide({"own": [-0.0, -0.5], "own_lr_x3": [-0.8, -0.9], "muon": [-0.0, -0.1]}, "own", margin=0.25)
    assert verdict.winner == "own_lr_x3"
    low, mid, high = verdict.gaps["own_lr_x3"]
    assert (low, high) == pytest.approx((0.4 / 0.9, 1.0))  # (0.9 - 0.5) / 0.9 and (0.8 - 0) / 0.8
    assert verdict.gaps["muon"][0] == pytest.approx(-0.8)  # (0.1 - 0.5) / 0.5: worse, and bounded too
    loss = decide({"own": [2.0, 2.0], "half": [1.0, 1.0], "double": [4.0, 4.0]}, "own", margin=0.25)
    assert loss.gaps["half"][1] == pytest.approx(0.5) and loss.gaps["double"][1] == pytest.approx(-0.5)
