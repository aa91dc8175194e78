"""autotune's optimization candidate: the module's optimizer raced in the fit against other rates, Muon and
schedule-free AdamW (:class:`~lightning_speedups.callbacks.optimizer_race.OptimizerRace`).

A step-time trial on copies cannot tell which optimization reaches a lower loss: only training does. So this
candidate spends no trial step: it puts an ``OptimizerRace`` in the plan, whose arms train beside the fit's own first
steps, and the winner's steps are training. It is left out, with a note, where the race cannot run (manual
optimization) or where the planned run is too short for the race to fit in its cost bound (10% of the run); the note
says what run length would be raced.
"""

from __future__ import annotations

from lightning_speedups.autotune.trials import Choice, TrialContext, register_candidate
from lightning_speedups.callbacks.optimizer_race import DEFAULT_ARMS
from lightning_speedups.optim.race import RacePlan, plan_race

__all__ = ["IN_FIT_RACE"]

IN_FIT_RACE = "in-fit race"  # the optimization choice's value until the fit's race decides


def _arm_count() -> int:
    """The arms the race will likely run: schedule-free only where its package is installed (the fit then leaves
    out what does not apply to the module, with a note)."""
    import importlib.util

    free = importlib.util.find_spec("schedulefree") is not None
    return sum(1 for a in DEFAULT_ARMS if free or not a.startswith("schedule_free"))


def _fitting_plan(planned_steps: int) -> tuple[int, RacePlan]:
    """The most arms whose race fits the run (the last ones give way, as in the fit), and its plan."""
    arms = _arm_count()
    plan = plan_race(planned_steps, arms)
    while plan.note is not None and arms > 2:
        arms -= 1
        plan = plan_race(planned_steps, arms)
    return arms, plan


def _blocker(ctx: TrialContext) -> str | None:
    if not getattr(ctx.model, "automatic_optimization", True):
        return "optimization not raced: manual optimization (the module steps its own optimizer)"
    _arms, plan = _fitting_plan(ctx.planned_steps)
    if plan.note is not None:
        return f"optimization {plan.note}"
    return None


def _race(ctx: TrialContext, share: float) -> Choice:
    ctx.plan["optimizer_race"] = True
    arms, plan = _fitting_plan(ctx.planned_steps)
    note = (
        f"raced on the fit's first {plan.steps} steps (OptimizerRace: {', '.join(DEFAULT_ARMS[:arms])}), each arm "
        "cooled down and scored on held-back batches; the winner trains on (at most 10% of the run)"
    )
    return Choice("optimization", IN_FIT_RACE, list(DEFAULT_ARMS), 1.0, (1.0, 1.0), 0, note, changed=True)


register_candidate("optimization", _race, steps=0.0, blocker=_blocker, before="compile")
