"""autotune's ``torch.compile`` candidate: kept only where the measured compile time is paid back in the planned run."""

from __future__ import annotations

import lightning_speedups.autotune.batching  # noqa: F401  (every other candidate registered first: compile goes last)
import lightning_speedups.autotune.data  # noqa: F401
from lightning_speedups.autotune.trials import (
    COMPARISON_STEPS,
    Choice,
    TrialContext,
    register_candidate,
)
from lightning_speedups.functional.compile import FIRST_COMPILE_PRIOR_S

__all__ = ["COMPILE_MIN_S"]

COMPILE_MIN_S = FIRST_COMPILE_PRIOR_S  # a first compile is slow on a small CPU: not tried inside a smaller budget


def _compile(ctx: TrialContext, share: float) -> Choice | None:
    budget = ctx.budget_left() * share
    if budget < COMPILE_MIN_S:
        ctx.notes.append(
            f"compile not tried: {budget:.0f}s of trial budget left, below the {COMPILE_MIN_S:.0f}s "
            "this trial takes at least"
        )
        return None
    eager = ctx.step(ctx.plan)
    t0 = ctx.clock()
    compiled = ctx.step({**ctx.plan, "compile": True})  # compiled as the fit's TorchCompile compiles it
    compiled()  # the compile happens here
    compile_s = ctx.clock() - t0
    result = ctx.compare({"eager": eager, "compiled": compiled}, "eager", share)
    saved = (result.medians["eager"] - result.medians["compiled"]) * ctx.planned_steps
    keep = result.winner == "compiled" and saved > compile_s
    ctx.plan["compile"] = keep
    lo, mid, hi = result.ratios["compiled"]
    note = f"compile {compile_s:.0f}s, saves {saved:.0f}s over {ctx.planned_steps} steps" + (
        "" if keep else ": not paid back"
    )
    return Choice("compile", keep, [False, True], mid if keep else 1.0, (lo, hi), result.trials, note, changed=keep)


def _price(ctx: TrialContext) -> float:
    """A plain comparison, and at least :data:`COMPILE_MIN_S` seconds for the compile itself (in plan steps)."""
    return max(float(COMPARISON_STEPS), COMPILE_MIN_S / max(ctx.step_s, 1e-12))


register_candidate("compile", _compile, steps=_price)
