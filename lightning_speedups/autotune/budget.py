"""autotune's trial budget: the step that sizes it, the candidates tried within it, and the note on what did not fit.

The budget (``budget_s``, or :data:`BUDGET_SHARE` = 5% of the planned run) bounds every cost of autotune's first run
that trains nothing, and counts from before the sizing steps: one untimed step of the unchanged model (its copy and
first call), then three timed ones whose median prices everything else. That warm copy becomes the baseline of the
first comparison, so its first-call cost is paid once. A candidate is tried only when what is left covers the least
one decision of it takes (:data:`~lightning_speedups.autotune.trials.PRICES` steps of the current plan,
:data:`~lightning_speedups.autotune.trials.COMPARISON_STEPS` = 1 + 2 x 3 for a plain comparison: the candidate's
warm-up call and three rounds of both; the data trial adds the copy of its device twin), and gets an even share of
what is left, but at least that price. The model copies of a trial are counted as they happen (the deadline is the
clock's). The in-fit precision trial's own cost, the check of one bf16 step on a copy (:data:`IN_FIT_STEPS`), is
taken from the budget before any offline candidate; its rounds train, and the slower option's extra time in them is
bounded by :class:`~lightning_speedups.callbacks.precision_trial.PrecisionTrial`'s ``max_cost``.

A run too short to pay back: where the default budget is below :data:`MIN_BUDGET_S`, it is of the order of those
fixed costs, and a target reached early in such a run turns even a budget spent in full into harm (issue 50's 1-D CNN
reached its target in under 3 s of a 13 s plan: its 0.65 s budget alone is a fifth of that). There nothing is tried,
the in-fit trial included (candidates that could not be tried anyway still say why): where the untimed first step (an
upper bound of the step) already shows it, the three timed steps are not spent either, and one note says what run
length would be needed. An explicit ``budget_s`` is the user's to spend: it is never cut.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from lightning_speedups.autotune.trials import APPLIES, BLOCKERS, CANDIDATES, Choice, TrialContext

__all__ = [
    "BUDGET_SHARE",
    "IN_FIT",
    "IN_FIT_MIN_STEPS",
    "IN_FIT_STEPS",
    "MIN_BUDGET_S",
    "SIZING_STEPS",
    "InFitRecord",
    "Skipped",
    "budget_note",
    "in_fit_precision",
    "precision_in_fit",
    "run_candidates",
    "short_run",
    "short_run_note",
    "size_step",
    "too_short",
]

SIZING_STEPS = 3  # timed, after one untimed: the median of three, so one slow step on a busy machine cannot size it
BUDGET_SHARE = 0.05  # the default budget: this share of the planned run (its steps at the median sizing step)
# below this default budget nothing is tried: about what a first run spends that trains nothing whatever it tries (a
# model copy and first calls, the in-fit trial's check on a copy, a device twin), 0.1-0.2 s for a small CNN on a
# 2-core CPU, more on a GPU; a planned run of at least MIN_BUDGET_S / BUDGET_SHARE = 20 s gets its trials
MIN_BUDGET_S = 1.0


@dataclass(frozen=True)
class Skipped:
    """A candidate the budget could not fit: what was left when it came up and what one decision of it needs."""

    name: str
    left: float
    need: float


def size_step(ctx: TrialContext, enough_s: float = 0.0) -> float:
    """The median step of the unchanged model (seconds, data time not counted), remembered in ``ctx`` with its
    warm step, which the first comparison then times as its baseline without another warm-up.

    The first call is not a step's price (it carries the first-call costs) but bounds it from above: when it is below
    ``enough_s`` (a run too short for anything the median would price, see :func:`too_short`), the timed steps are
    not spent and that bound is returned."""
    one = ctx.step(ctx.plan)
    t0 = ctx.clock()
    one()  # untimed as a price: first-call costs
    first_s = ctx.clock() - t0
    if first_s < enough_s:
        ctx.remember(ctx.plan, one, first_s)
        return first_s
    times = []
    for _ in range(SIZING_STEPS):
        t0 = ctx.clock()
        one()
        times.append(ctx.clock() - t0)
    step_s = sorted(times)[SIZING_STEPS // 2]
    ctx.remember(ctx.plan, one, step_s)
    return step_s


def too_short(planned_steps: int, step_s: float) -> bool:
    """Whether the default budget of a run of ``planned_steps`` steps of ``step_s`` seconds is below
    :data:`MIN_BUDGET_S`: a run too short for any trial to pay back, where nothing is tried."""
    return BUDGET_SHARE * planned_steps * step_s < MIN_BUDGET_S


def short_run(ctx: TrialContext, names: list[str]) -> list[str]:
    """On a run :func:`too_short` for trials: the names of ``names`` not tried for that reason, after one note that
    says so (first among the notes; the others still say why they could not be tried anyway)."""
    names = [n for n in names if n not in APPLIES or APPLIES[n](ctx)]
    blocked = {n: BLOCKERS[n](ctx) for n in names if n in BLOCKERS}
    ctx.notes += [why for why in blocked.values() if why is not None]
    left = [n for n in names if blocked.get(n) is None]
    if left:
        ctx.notes.insert(0, short_run_note(left, ctx.planned_steps, ctx.step_s))
    return left


def short_run_note(names: list[str], planned_steps: int, step_s: float) -> str:
    """The one note of a run :func:`too_short` for trials: what its budget would be, and the run length that would
    pay back."""
    run_s = planned_steps * step_s
    need_s = MIN_BUDGET_S / BUDGET_SHARE
    need_steps = math.ceil(need_s / max(step_s, 1e-12))
    return (
        f"{', '.join(names)} not tried: the planned run ({planned_steps} steps of about {step_s:.3f}s, about "
        f"{run_s:.1f}s) is too short for a trial to pay back: its {BUDGET_SHARE:.0%} trial budget "
        f"({BUDGET_SHARE * run_s:.2f}s) is of the order of what a first run spends that trains nothing (model copies "
        "and first calls, the in-fit precision check on a copy, a device twin of the data), and a target reached "
        f"early in the run would pay for it. A planned run of at least {need_s:.0f}s (about {need_steps} steps of "
        "this model) would be needed. HINT: pass `budget_s` to measure anyway; the plan runs as you wrote it."
    )


def run_candidates(ctx: TrialContext, names: list[str]) -> tuple[list[Choice], list[Skipped]]:
    """Try ``names`` in order within ``ctx``'s deadline: the choices made and the candidates the budget skipped."""
    choices: list[Choice] = []
    skipped: list[Skipped] = []
    names = [n for n in names if n not in APPLIES or APPLIES[n](ctx)]  # nothing to try, nothing to say
    for i, name in enumerate(names):
        why = BLOCKERS[name](ctx) if name in BLOCKERS else None
        if why is not None:  # the real reason, whatever the budget left
            ctx.notes.append(why)
            continue
        left = ctx.budget_left()
        need = ctx.price(name)
        if left < need:  # below the least it takes, a trial only spends time (a later, cheaper one may still fit)
            skipped.append(Skipped(name, left, need))
            continue
        # an even share of what is left, but at least one decision: a small budget goes to the candidates in order
        # (the largest effects first) instead of being split into shares too small for any of them
        share = max(1.0 / (len(names) - i), min(1.0, need / max(left, 1e-12)))
        choice = CANDIDATES[name](ctx, share)
        if choice is not None:
            choices.append(choice)
    return choices, skipped


# the in-fit precision trial costs the slower option's extra time (at most PrecisionTrial's max_cost, 2% of the fit)
# plus about two steps (its bf16 warm-up and the check of one bf16 step on a copy): it is planned only where those two
# steps are within the same 2%
IN_FIT_MIN_STEPS = 100
# what the in-fit trial spends that trains nothing, taken from the trial budget: the check of one bf16 step on a copy
# (its bf16 warm-up is a step of the fit, and its rounds train)
IN_FIT_STEPS = 1
IN_FIT = "in-fit trial"  # the precision choice's value while the fit's own steps decide it

_DEFAULT_NOTE = (
    "bf16 timed against fp32 on the fit's own first steps (PrecisionTrial): those steps train as they measure, so "
    "the comparison costs only the slower option's extra time (at most 2% of the fit), where an offline comparison "
    "spends 7 or more steps that train nothing; the other candidates are timed in fp32"
)
_BUDGET_NOTE = (
    "bf16 timed against fp32 on the fit's own first steps (PrecisionTrial): the trial budget could not fit an "
    "offline comparison, and those steps train as they measure"
)


def precision_in_fit(ctx: TrialContext) -> bool:
    """Whether precision is timed on the fit's own steps from the start rather than offline: on a CPU with bf16
    units, with bf16 allowed, on a run of at least :data:`IN_FIT_MIN_STEPS` steps. There bf16 is the only option, the
    one :class:`~lightning_speedups.callbacks.precision_trial.PrecisionTrial` times, and the in-fit trial costs less
    than the offline one in every outcome: a faster bf16 trains faster during its own rounds, a slower one costs its
    extra time, never whole steps. On a GPU the offline comparison stays first (it also times ``16-mixed``)."""
    from lightning_speedups._peak import cpu_bf16_units

    return (
        ctx.device.type == "cpu"
        and not ctx.no_bf16
        and ctx.planned_steps >= IN_FIT_MIN_STEPS
        and cpu_bf16_units() is not None
    )


def in_fit_precision(ctx: TrialContext, *, by_default: bool = False) -> Choice:
    """The precision choice timed on the fit's own first steps
    (:class:`~lightning_speedups.callbacks.precision_trial.PrecisionTrial`, in the plan's callbacks), which train as
    they measure: ``by_default`` where :func:`precision_in_fit` holds, else because the budget could not fit the
    offline comparison, so the plan still measures the candidate that matters most on bf16 hardware."""
    ctx.plan["precision_trial"] = True
    note = _DEFAULT_NOTE if by_default else _BUDGET_NOTE
    return Choice("precision", IN_FIT, ["32-true", "bf16-mixed"], 1.0, (1.0, 1.0), 0, note, changed=True)


@dataclass(frozen=True)
class InFitRecord:
    """Writes the in-fit precision decision into the cached plan ``key`` under ``cache_dir``
    (:class:`~lightning_speedups.callbacks.precision_trial.PrecisionTrial`'s ``on_decision``): a later run of the
    plan then starts in the kept precision, with the measured ratio, and spends no step on the trial. Plain strings,
    so it pickles under ``ddp_spawn``; a failed write warns and the fit goes on."""

    cache_dir: str
    key: str

    def __call__(self, trial: Any) -> None:
        import warnings

        from lightning_speedups.measure import PlanCache

        store = PlanCache(self.cache_dir)
        try:
            entry = store.get(self.key)
            if entry is None or not entry.get("settings", {}).get("precision_trial"):
                return  # the entry is gone or already decided
            store.put(self.key, _decided_entry(entry, trial.kept, tuple(trial.ratio), trial.rounds, trial.note))
        except (OSError, KeyError, TypeError, ValueError) as err:  # the cache, never the user's fit, pays for it
            warnings.warn(
                f"autotune: the in-fit precision decision was not cached ({type(err).__name__}: {err}); "
                "the next run times it again",
                stacklevel=2,
            )


def _decided_entry(
    entry: dict[str, Any], kept: str, ratio: tuple[float, float, float], rounds: int, note: str
) -> dict[str, Any]:
    """The cached plan ``entry`` with its in-fit precision replaced by the fit's decision: the Trainer's
    ``precision`` set, no ``PrecisionTrial``, and the precision choice holding the measured ratio."""
    settings = {k: v for k, v in entry["settings"].items() if k != "precision_trial"}
    settings["precision"] = kept
    bf16 = kept != "32-true"
    lo, mid, hi = ratio
    choice = Choice(
        "precision",
        kept,
        ["32-true", "bf16-mixed"],
        mid if bf16 else 1.0,
        (lo, hi) if bf16 else (1.0, 1.0),
        rounds,
        f"{note} (timed on the fit's own steps)",
        changed=bf16,
    ).as_dict()
    choices = [choice if c.get("name") == "precision" else c for c in entry["choices"]]
    return {**entry, "settings": settings, "choices": choices}


def _listed(values: list[tuple[str, float]]) -> str | None:
    """``None`` when every candidate has the same value, else the values with the names that share each one."""
    groups: dict[str, list[str]] = {}
    for name, value in values:
        groups.setdefault(f"{value:.2f}s", []).append(name)
    return None if len(groups) == 1 else "; ".join(f"{', '.join(names)} {v}" for v, names in groups.items())


def budget_note(skipped: list[Skipped], budget_s: float, planned_run_s: float | None, measured: bool) -> str:
    """The one note on the candidates the budget skipped: what was left, what one decision needs, and the
    ``budget_s`` that would have fit the cheapest of them; it opens with "nothing measured" when nothing was."""
    names = ", ".join(s.name for s in skipped)
    run = f", 5% of a planned run of about {planned_run_s:.1f}s" if planned_run_s is not None else ""
    lefts = _listed([(s.name, max(s.left, 0.0)) for s in skipped])
    left = (
        f"{max(skipped[0].left, 0.0):.2f}s of {budget_s:.2f}s{run}"
        if lefts is None
        else f"of {budget_s:.2f}s{run}; when each came up: {lefts}"
    )
    needs = _listed([(s.name, s.need) for s in skipped])
    need = f"the {skipped[0].need:.2f}s one comparison needs" if needs is None else f"what one decision needs ({needs})"
    cheapest = min(skipped, key=lambda s: s.need)
    fits = budget_s - cheapest.left + cheapest.need  # what ran before it (the sizing steps at least), plus it
    head = "" if measured else "nothing measured: the run is too short for one comparison; "
    return (
        f"{head}{names} not tried: what was left of the trial budget ({left}) is below {need}. HINT: pass a "
        f"larger `budget_s` (at least {fits:.1f}s to measure {cheapest.name}); the plan is cached: a later call "
        "with the same budget skips the trials, a larger `budget_s` measures again."
    )
