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
from itertools import islice
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
from lightning_speedups.functional.batch_size.noise_scale import NoiseScale, gradient_noise_scale
from lightning_speedups.measure import compare, model_copy, training_step_loss

__all__ = ["BATCH_DOUBLING_COST", "NOISE_SCALE_BATCHES", "ONLY_WHEN_NAMED"]

# A doubled batch is kept when its samples/s rises by more than the extra samples it needs to the same loss (and the
# margin). With its learning rate scaled (sqrt rule for Adam-type optimizers, linear for SGD), a larger batch needs
# E(B) = E_min * (1 + B / B_noise) samples (McCandlish et al. 2018), so a doubling costs (1 + 2r) / (1 + r) times the
# samples, r = B / B_noise: nothing far below the gradient noise scale, twice the samples far above it. The trial
# measures r from the gradients of NOISE_SCALE_BATCHES of the user's batches
# (:func:`~lightning_speedups.functional.batch_size.noise_scale.gradient_noise_scale`, its upper bound: before
# training, where the noise scale is smallest), so the bar is that cost, between 1x and 2x. Where it cannot be
# measured (fewer than 3 full batches, no noise to measure) or the lr cannot follow the batch (a plain module's own
# configure_optimizers), the bar is the bound that holds on any task: at the same learning rate a doubled batch takes
# no more steps to the same loss, so it needs at most twice the samples (BATCH_DOUBLING_COST), and twice the
# samples/s never loses time. (The two image bench tasks needed 1.5x at an unscaled lr: docs/evidence.md, section
# "autotune".)
BATCH_DOUBLING_COST = 2.0
NOISE_SCALE_BATCHES = 8

# candidates measured only when named in ``candidates``, each with why the default plan leaves it out (one note)
ONLY_WHEN_NAMED: dict[str, str] = {
    # the bar is the measured sample cost of a larger batch (1x to 2x, see above); the end-to-end bench has measured
    # the default plan without it, and a larger batch changes the optimisation, not only the step time
    "batch_size": (
        "batch_size not tried by default: a larger batch changes the optimisation (its learning rate is scaled and "
        "it may need more samples to the target: kept only when its samples/s rises by more than the extra samples "
        "the gradient noise scale predicts, up to 2x, and the margin). HINT: name it in `candidates` to measure it, "
        "or use ThroughputBatchSizeFinder for the batch with the most samples/s"
    ),
    # a race that keeps the module's optimizer still costs its other arms' steps (up to 10% of the run): until the
    # suite shows it never slows a task, it is measured only when named
    "optimization": (
        "optimization not raced by default: the race (OptimizerRace: 3x the lr, Muon, schedule-free AdamW) costs up "
        "to 10% of the run even where the module's own optimizer wins. HINT: name it in `candidates` to race"
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
    return Choice(
        name,
        value if len(value) > 1 else next(iter(value.values())),
        ["current", *options],
        mid,
        (lo, hi),
        result.trials,
        note,
        changed=chosen != current,
    )


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
    spent = [0.0]
    starts = {}

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
        note = (
            f"channels_last not tried: the layers that take 4-D tensors are {part:.1%} of a forward pass, so "
            f"even free they would make a step at most {bound:.3f}x faster, below the {ctx.margin:.0%} "
            "margin"
        )
        return Choice("channels_last", False, ["current", "channels_last"], 1.0, (1.0, 1.0), 0, note)
    return _decide(ctx, "channels_last", {"channels_last": {"channels_last": True}}, share)


def _optimizer_share(ctx: TrialContext) -> float:
    """The optimizer step's share of a training step: the median of ``MIN_ROUNDS`` rounds of each, on copies."""
    fns = {"full": ctx.step(ctx.plan, fresh=True), "alone": ctx.step({**ctx.plan, "optimizer_only": True}, fresh=True)}
    result = compare(
        fns, "full", budget_s=math.inf, min_rounds=MIN_ROUNDS, max_rounds=MIN_ROUNDS, warmup=1, clock=ctx.clock
    )
    return result.medians["alone"] / max(result.medians["full"], 1e-12)


def _optimizer(ctx: TrialContext, share: float) -> Choice | None:
    # Amdahl first: a faster optimizer kernel saves at most the optimizer's share of a step. Where that share is too
    # small for the margin even at zero cost, the comparison, which would need many rounds to separate a gain that
    # small from the margin, is not run
    part = _optimizer_share(ctx)
    bound = 1.0 / (1.0 - part) if part < 1.0 else float("inf")
    current = ctx.plan.get("implementation", STEP_DEFAULTS["implementation"])
    if bound < 1.0 + ctx.margin:
        note = (
            f"fused/foreach not tried: the optimizer step is {part:.1%} of a training step, so even a free one "
            f"would be at most {bound:.3f}x faster, below the {ctx.margin:.0%} margin"
        )
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


def _noise_scale(ctx: TrialContext) -> tuple[NoiseScale | None, str]:
    """The gradient noise scale of the model at the user's batch, from ``NOISE_SCALE_BATCHES`` batches of the loader
    (the global RNG forked), on a copy; ``None`` and why when the bar stays at the bound."""
    from lightning_speedups.optim import SpeedupMixin

    if not isinstance(ctx.model, SpeedupMixin):
        return None, f"the lr of `{type(ctx.model).__name__}.configure_optimizers` cannot follow the batch"
    if ctx.loader is None:
        return None, "no training loader to measure the gradient noise scale on"
    model = model_copy(ctx.model, train=True).to(ctx.device)
    with torch.random.fork_rng(devices=[]):
        batches = [move_data_to_device(b, ctx.device) for b in islice(ctx.loader, NOISE_SCALE_BATCHES)]
        scale = gradient_noise_scale(model, batches, lambda m, b, i: training_step_loss(m, b, i, quiet=True))
    if scale is None:
        return None, f"the gradient noise scale could not be measured on {len(batches)} batches"
    return scale, (
        f"gradient noise scale ~{scale.b_simple:.0f} samples at batch {scale.batch_size} (upper bound of batch / "
        f"noise scale {scale.ratio_high:.2f}, {scale.batches} batches)"
    )


def _batch_size(ctx: TrialContext, share: float) -> Choice | None:
    """Keep a doubled (then quadrupled) batch, its lr scaled by its optimizer's rule, only when its samples/s rises
    by more than the extra samples it needs to the same loss and the margin.

    The extra samples are ``(1 + 2r) / (1 + r)`` (McCandlish et al. 2018, with the lr tuned for each size), ``r``
    the batch over the gradient noise scale measured on the user's batches (:func:`_noise_scale`, the upper bound
    of its jackknife interval, at initialisation where the noise scale is smallest): a measured bar between 1x and
    2x instead of the 2x bound, which is kept where ``r`` cannot be measured or the plan cannot scale the lr (a plain
    module's own ``configure_optimizers``): "do no harm", when unclear the user's batch stays. The note says which
    bar decided.
    """
    # the same samples per timed call: 2 steps at the current size vs 1 step at twice the size; x4 only if x2 won.
    # x2 gets half the share (at least its price), x4 what is left of it (at least its price: its steps cost twice)
    scale = 1
    rounds = 0
    gain = 1.0
    interval = (1.0, 1.0)
    stopped = ""
    noise, why = _noise_scale(ctx)
    allowance = ctx.budget_left() * share
    spent_from = ctx.clock()
    for trial in (2, 4):
        cost = BATCH_DOUBLING_COST if noise is None else noise.doubling_cost(trial // 2)
        need = (1.0 + ctx.margin) * cost
        price = (ctx.price("batch_size") - NOISE_SCALE_BATCHES * ctx.step_s) * (trial // 2)  # the comparison's
        budget = max(allowance / 2, price) if trial == 2 else allowance - (ctx.clock() - spent_from)
        if budget < price:
            stopped = (
                f"x{trial} vs x{trial // 2} not tried: {max(budget, 0.0):.2f}s of its trial share left, below "
                f"the {price:.2f}s one comparison needs"
            )
            break
        larger = {**ctx.plan, "batch_scale": trial}
        fns = {
            "smaller": ctx.step({**ctx.plan, "batch_scale": trial // 2}, steps=2, fresh=True),
            "larger": ctx.step(larger, fresh=True),
        }
        result = ctx.compare(fns, "smaller", min(1.0, budget / max(ctx.budget_left(), 1e-12)), min_gain=need - 1.0)
        rounds += result.trials
        if result.winner != "larger":
            not_larger = _not_larger(ctx, result.ratios.get("larger"), result.note, need, cost)
            stopped = f"x{trial} vs x{trial // 2}: {not_larger}"
            break
        lo, mid, hi = result.ratios["larger"]  # x4 is x2 times x4-over-x2: the gains and their bounds multiply
        scale = trial
        gain = gain * mid
        interval = (interval[0] * lo, interval[1] * hi)
        ctx.remember(larger, fns["larger"], result.medians["larger"])
    ctx.plan["batch_scale"] = scale
    kept = f"batch x{scale}: {gain:.2f}x the samples/s" if scale > 1 else "batch size kept"
    note = kept + (f" ({stopped})" if stopped and scale > 1 else f": {stopped}" if stopped else "")
    note += f"; bar: {why}" if noise is not None else f"; bar: at most 2x the samples ({why})"
    return Choice("batch_size", scale, [1, 2, 4], gain, interval, rounds, note, changed=scale > 1)


def _not_larger(
    ctx: TrialContext, measured: tuple[float, float, float] | None, note: str, need: float, cost: float
) -> str:
    """Why the larger batch was not kept: its samples/s on this run against what it needed, or the comparison's
    note (too few rounds)."""
    if measured and not (note or "").startswith("only "):
        return (
            f"{measured[1]:.2f}x the samples/s, below the {need:.2f}x needed: a doubled batch may need up to "
            f"{cost:.3g}x the samples to reach the target, and the margin is {ctx.margin:.0%}"
        )
    return note or "not faster"


for _name, _trial, _steps, _blocker in (
    ("precision", _precision, COMPARISON_STEPS, _precision_blocker),
    ("channels_last", _channels_last, COMPARISON_STEPS, _channels_last_blocker),
    # x2 vs x1 on the same samples: 2 steps against one step twice as large, both warmed up: 4 + 4 per round; and
    # the gradients of the batches that measure the noise scale (about a step each)
    ("batch_size", _batch_size, 4 + 4 * MIN_ROUNDS + NOISE_SCALE_BATCHES, _batch_size_blocker),
    # the least: the check of the optimizer's share of a step
    ("optimizer", _optimizer, COMPARISON_STEPS, None),
):
    register_candidate(_name, _trial, steps=_steps, blocker=_blocker)
