"""autotune's step-time candidates: precision, channels_last, the batch size and the fused/foreach optimizer.

Each times the current plan against the plan with one option changed, on copies of the model
(:meth:`TrialContext.compare <lightning_speedups.autotune.trials.TrialContext.compare>`), and keeps an option only
when it beats the plan by the margin beyond noise.

The order matters, since a small budget goes to the first candidates: token batching first for token data (it
changes which batches the run trains on; ``batching.py`` registers it), then precision (the largest effect on CPUs
with bf16 units and on GPUs), then channels_last, then the data path (``data.py``), after the step-time choices that
change its share (the faster the step, the larger the loader's share), then the batch size and the optimizer, and
compile last (``compile.py``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from lightning.fabric.utilities.apply_func import move_data_to_device
from torch import nn

from lightning_speedups._inputs import flat_tensors
from lightning_speedups.autotune.trials import (
    COMPARISON_STEPS,
    MIN_ROUNDS,
    STEP_DEFAULTS,
    Choice,
    TrialContext,
    register_candidate,
)
from lightning_speedups.measure import compare, model_copy, training_step_loss

__all__ = ["BATCH_DOUBLING_COST", "ONLY_WHEN_NAMED"]

# A doubled batch must raise samples/s by this factor (and the margin) to be kept. A step-time trial cannot see how
# many more samples the larger batch needs to the target, and that varies by task; what holds on any task is the
# bound: at the same learning rate a doubled batch takes no more steps to the same loss (it averages twice the
# samples per step), so it needs at most twice the samples, and twice the samples/s never loses time. (The two
# image bench tasks needed 1.5x: docs/evidence.md, section "autotune"; a constant fitted to them was not a rule.)
BATCH_DOUBLING_COST = 2.0

# candidates measured only when named in ``candidates``, each with why the default plan leaves it out (one note)
ONLY_WHEN_NAMED: dict[str, str] = {
    # the bound above asks a step at twice the batch to take less time than the current step (2 x 1.05 the
    # samples/s): a step does more work at a larger batch, so only noise could keep it, and its comparison (the
    # costliest, 16 steps) would spend the budget of the candidates that can win. In every committed workload row it
    # was never kept; its largest measured ratio was 2.07x, on the MLP, whose millisecond steps are all overhead
    "batch_size": (
        "batch_size not tried by default: a doubled batch is kept only at 2.1x the samples/s (it may need twice the "
        "samples to reach the target), which means a step at twice the batch running faster than the current one; "
        "steps take longer as the batch grows, so the comparison would only spend the budget. HINT: name it in "
        "`candidates` to measure it, or use ThroughputBatchSizeFinder for the batch with the most samples/s"
    ),
}


def _decide(ctx: TrialContext, name: str, options: Mapping[str, dict[str, Any]], share: float) -> Choice:
    """Time the plan with each option (the current plan is the baseline) and keep the winner in ``ctx.plan``."""
    current = "current"
    fns = {current: ctx.step(ctx.plan), **{k: ctx.step({**ctx.plan, **v}, fresh=True) for k, v in options.items()}}
    result = ctx.compare(fns, current, share)
    chosen = result.winner
    if chosen != current:
        ctx.plan.update(options[chosen])
    ctx.remember(ctx.plan, fns[chosen], result.medians[chosen])
    value = {k: ctx.plan.get(k, STEP_DEFAULTS.get(k)) for k in next(iter(options.values()))}
    lo, mid, hi = result.ratios.get(chosen, (1.0, 1.0, 1.0))
    note = result.note or (f"{chosen} {mid:.2f}x faster" if chosen != current else "no option beat the plan")
    return Choice(name, value if len(value) > 1 else next(iter(value.values())), ["current", *options], mid,
                  (lo, hi), result.trials, note, changed=chosen != current)  # fmt: skip


def _precision(ctx: TrialContext, share: float) -> Choice | None:
    options: dict[str, dict[str, Any]] = {}
    if ctx.device.type == "cuda":
        if torch.cuda.is_bf16_supported():
            options["bf16-mixed"] = {"precision": "bf16-mixed"}
        options["16-mixed"] = {"precision": "16-mixed"}
    elif not ctx.no_bf16:
        options["bf16-mixed"] = {"precision": "bf16-mixed"}  # far slower on CPUs without bf16 units: measured here
    options = {k: v for k, v in options.items() if v["precision"] != ctx.plan.get("precision")}
    return _decide(ctx, "precision", options, share) if options else None


def _precision_blocker(ctx: TrialContext) -> str | None:
    """Nothing to time on a CPU with ``no_bf16``; a CPU without bf16 units emulates bf16 at about a tenth of the fp32
    speed: its trial would only spend steps. Said whatever the budget left."""
    from lightning_speedups._peak import NO_BF16_UNITS, cpu_bf16_units

    if ctx.device.type == "cpu" and ctx.no_bf16:
        return "precision not tried: bf16 disabled (no_bf16=True) and no GPU for 16-mixed"
    if ctx.device.type == "cpu" and cpu_bf16_units() is None:
        return f"precision not tried: {NO_BF16_UNITS}"
    return None


def _channels_last_blocker(ctx: TrialContext) -> str | None:
    images = [t for t in flat_tensors(ctx.batch) if t.dim() == 4]
    if not images or not any(isinstance(m, nn.Conv2d) for m in ctx.model.modules()):
        return "channels_last not tried: no 4-D input or no Conv2d"
    return None


def _layout_share(ctx: TrialContext) -> float:
    """The share of a forward pass (the model's ``training_step`` without grad) spent in the leaf modules that take
    a 4-D tensor: the convolutions and the norms, poolings and activations between them, the only work channels_last
    can change. Timed with hooks on a copy, after one untimed pass; 1.0 where it cannot be timed (on a GPU, whose
    kernels run asynchronously, or where the clock did not advance)."""
    if ctx.device.type != "cpu":
        return 1.0
    model = model_copy(ctx.model, train=True).to(ctx.device)
    batch = move_data_to_device(ctx.batch, ctx.device)
    spent, starts = [0.0], {}

    def before(module: nn.Module, args: tuple[Any, ...]) -> None:
        if any(isinstance(a, torch.Tensor) and a.dim() == 4 for a in args):
            starts[id(module)] = ctx.clock()

    def after(module: nn.Module, args: tuple[Any, ...], out: Any) -> None:
        t0 = starts.pop(id(module), None)
        if t0 is not None:
            spent[0] += ctx.clock() - t0

    leaves = [m for m in model.modules() if next(m.children(), None) is None]
    handles = [h for m in leaves for h in (m.register_forward_pre_hook(before), m.register_forward_hook(after))]
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            training_step_loss(model, batch, 0, quiet=True)  # untimed: first-call costs
            spent[0] = 0.0
            t0 = ctx.clock()
            training_step_loss(model, batch, 0, quiet=True)
            total = ctx.clock() - t0
    finally:
        for handle in handles:
            handle.remove()
    return min(1.0, spent[0] / total) if total > 0 else 1.0


def _channels_last(ctx: TrialContext, share: float) -> Choice | None:
    # Amdahl first, as for the optimizer kernel: channels_last changes only the work on 4-D tensors. Where that is so
    # small a share of the step that even free it could not clear the margin (a ViT's patch embedding), the 7-step
    # comparison, which trains nothing, is not run
    part = _layout_share(ctx)
    bound = 1.0 / (1.0 - part) if part < 1.0 else float("inf")
    if bound < 1.0 + ctx.margin:
        note = (f"channels_last not tried: the layers that take 4-D tensors are {part:.1%} of a forward pass, so "
                f"even free they would make a step at most {bound:.3f}x faster, below the {ctx.margin:.0%} "
                "margin")  # fmt: skip
        return Choice("channels_last", False, ["current", "channels_last"], 1.0, (1.0, 1.0), 0, note)
    return _decide(ctx, "channels_last", {"channels_last": {"channels_last": True}}, share)


def _optimizer_share(ctx: TrialContext) -> float:
    """The optimizer step's share of a training step: the median of ``MIN_ROUNDS`` rounds of each, on copies."""
    fns = {"full": ctx.step(ctx.plan, fresh=True), "alone": ctx.step({**ctx.plan, "optimizer_only": True}, fresh=True)}
    result = compare(fns, "full", budget_s=math.inf, min_rounds=MIN_ROUNDS, max_rounds=MIN_ROUNDS, warmup=1,
                     clock=ctx.clock)  # fmt: skip
    return result.medians["alone"] / max(result.medians["full"], 1e-12)


def _optimizer_blocker(ctx: TrialContext) -> str | None:
    from lightning_speedups.optim import SpeedupMixin

    if isinstance(ctx.model, SpeedupMixin):  # the plan sets SpeedupMixin's optimizer_config, never user code
        return None
    return (
        f"fused/foreach optimizer not tried: `{type(ctx.model).__name__}.configure_optimizers` builds "
        "its own optimizer, which the plan does not rewrite. HINT: pass fused=True (or foreach=True) "
        "to the optimizer there, or use SpeedupMixin, whose `optimizer_config` the plan sets"
    )


def _optimizer(ctx: TrialContext, share: float) -> Choice | None:
    # Amdahl first: a faster optimizer kernel saves at most the optimizer's share of a step. Where that share is too
    # small for the margin even at zero cost, the comparison, which would need many rounds to separate a gain that
    # small from the margin, is not run
    part = _optimizer_share(ctx)
    bound = 1.0 / (1.0 - part) if part < 1.0 else float("inf")
    current = ctx.plan.get("implementation", STEP_DEFAULTS["implementation"])
    if bound < 1.0 + ctx.margin:
        note = (f"fused/foreach not tried: the optimizer step is {part:.1%} of a training step, so even a free one "
                f"would be at most {bound:.3f}x faster, below the {ctx.margin:.0%} margin")  # fmt: skip
        return Choice("optimizer", current, ["current", "foreach", "fused"], 1.0, (1.0, 1.0), MIN_ROUNDS, note)
    options = {"foreach": {"implementation": "foreach"}, "fused": {"implementation": "fused"}}
    return _decide(ctx, "optimizer", options, share)


def _batch_blocker(ctx: TrialContext) -> str | None:
    """Why :meth:`TunePlan.apply` could not set a larger batch for this data (``None``: it can)."""
    from lightning_speedups.callbacks.batch_size.loaders import fit_loader_problem
    from lightning_speedups.data import DeviceDataLoader

    if ctx.datamodule is not None or ctx.own_loader:
        if any(h is not None and hasattr(h, "batch_size") for h in (ctx.datamodule, ctx.model)):
            return None
        return (
            "neither the datamodule nor the model has a `batch_size` attribute to set"
            if ctx.datamodule is not None
            else "the model has no `batch_size` attribute for its train_dataloader() to read"
        )
    if isinstance(ctx.loader, DeviceDataLoader):
        return None
    problem = fit_loader_problem(ctx.loader)
    return None if problem is None else f"the training data is {problem}, which cannot be rebuilt at another batch size"


def _batch_size_blocker(ctx: TrialContext) -> str | None:
    why = _batch_blocker(ctx)  # a doubled batch that apply() could not set must not be kept (nor scale the lr)
    return None if why is None else f"batch_size not tried: {why}"


def _batch_size(ctx: TrialContext, share: float) -> Choice | None:
    # the same samples per timed call: 2 steps at the current size vs 1 step at twice the size; x4 only if x2 won.
    # x2 gets half the share (at least its price), x4 what is left of it (at least its price: its steps cost twice)
    scale, rounds, gain, interval, stopped = 1, 0, 1.0, (1.0, 1.0), ""
    need = (1.0 + ctx.margin) * BATCH_DOUBLING_COST
    allowance, spent_from = ctx.budget_left() * share, ctx.clock()
    for trial in (2, 4):
        price = ctx.price("batch_size") * (trial // 2)
        budget = max(allowance / 2, price) if trial == 2 else allowance - (ctx.clock() - spent_from)
        if budget < price:
            stopped = (
                f"x{trial} vs x{trial // 2} not tried: {max(budget, 0.0):.2f}s of its trial share left, below "
                f"the {price:.2f}s one comparison needs"
            )
            break
        larger = {**ctx.plan, "batch_scale": trial}
        fns = {"smaller": ctx.step({**ctx.plan, "batch_scale": trial // 2}, steps=2, fresh=True),
               "larger": ctx.step(larger, fresh=True)}  # fmt: skip
        result = ctx.compare(fns, "smaller", min(1.0, budget / max(ctx.budget_left(), 1e-12)), min_gain=need - 1.0)
        rounds += result.trials
        if result.winner != "larger":
            stopped = f"x{trial} vs x{trial // 2}: {_not_larger(ctx, result.ratios.get('larger'), result.note, need)}"
            break
        lo, mid, hi = result.ratios["larger"]  # x4 is x2 times x4-over-x2: the gains and their bounds multiply
        scale, gain, interval = trial, gain * mid, (interval[0] * lo, interval[1] * hi)
        ctx.remember(larger, fns["larger"], result.medians["larger"])
    ctx.plan["batch_scale"] = scale
    kept = f"batch x{scale}: {gain:.2f}x the samples/s" if scale > 1 else "batch size kept"
    note = kept + (f" ({stopped})" if stopped and scale > 1 else f": {stopped}" if stopped else "")
    return Choice("batch_size", scale, [1, 2, 4], gain, interval, rounds, note, changed=scale > 1)


def _not_larger(ctx: TrialContext, measured: tuple[float, float, float] | None, note: str, need: float) -> str:
    """Why the larger batch was not kept: its samples/s on this run against what it needed, or the comparison's
    note (too few rounds)."""
    if measured and not (note or "").startswith("only "):
        return (
            f"{measured[1]:.2f}x the samples/s, below the {need:.2f}x needed: a doubled batch may need up to "
            f"{BATCH_DOUBLING_COST:g}x the samples to reach the target (no fewer steps), and the margin is "
            f"{ctx.margin:.0%}"
        )
    return note or "not faster"


for _name, _trial, _steps, _blocker in (
    ("precision", _precision, COMPARISON_STEPS, _precision_blocker),
    ("channels_last", _channels_last, COMPARISON_STEPS, _channels_last_blocker),
    # x2 vs x1 on the same samples: 2 steps against one step twice as large, both warmed up: 4 + 4 per round
    ("batch_size", _batch_size, 4 + 4 * MIN_ROUNDS, _batch_size_blocker),
    # the least: the check of the optimizer's share of a step
    ("optimizer", _optimizer, COMPARISON_STEPS, _optimizer_blocker),
):
    register_candidate(_name, _trial, steps=_steps, blocker=_blocker)
