"""autotune's ``torch.compile`` candidate: kept only where the measured compile time is paid back in the planned run."""

from __future__ import annotations

import torch

from lightning_speedups._autotune_trials import (
    COMPARISON_STEPS,
    Choice,
    TrialContext,
    _detached_copy,
    register_candidate,
)

__all__ = ["COMPILE_MIN_S"]

COMPILE_MIN_S = 30.0  # inductor takes tens of seconds on a small CPU: not worth trying inside a smaller budget


def _compile(ctx: TrialContext, share: float) -> Choice | None:
    budget = ctx.budget_left() * share
    if budget < COMPILE_MIN_S:
        ctx.notes.append(f"compile not tried: {budget:.0f}s of trial budget left; compiling takes tens of seconds")
        return None
    eager = ctx.step(ctx.plan)
    t0 = ctx.clock()
    model = _detached_copy(ctx.model).to(ctx.device)
    compiled_ctx = TrialContext(torch.compile(model), ctx.batch, ctx.device, ctx.planned_steps, ctx.margin,
                                ctx.deadline, ctx.plan, ctx.clock)  # fmt: skip
    compiled = compiled_ctx.step(ctx.plan)
    compiled()  # the compile happens here
    compile_s = ctx.clock() - t0
    result = ctx.compare({"eager": eager, "compiled": compiled}, "eager", share)
    saved = (result.medians["eager"] - result.medians["compiled"]) * ctx.planned_steps
    keep = result.winner == "compiled" and saved > compile_s
    ctx.plan["compile"] = keep
    lo, mid, hi = result.ratios["compiled"]
    note = (f"compile {compile_s:.0f}s, saves {saved:.0f}s over {ctx.planned_steps} steps"
            + ("" if keep else ": not paid back"))  # fmt: skip
    return Choice("compile", keep, [False, True], mid if keep else 1.0, (lo, hi), result.trials, note)


def _price(ctx: TrialContext) -> float:
    """A plain comparison, and at least :data:`COMPILE_MIN_S` seconds for the compile itself (in plan steps)."""
    return max(float(COMPARISON_STEPS), COMPILE_MIN_S / max(ctx.step_s, 1e-12))


register_candidate("compile", _compile, steps=_price)
