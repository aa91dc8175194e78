"""autotune's candidates: each a small trial on copies of the user's model, decided by ``measure.compare``.

A trial gets the current plan (what earlier trials kept) and returns a :class:`Choice`: the option it keeps and the
evidence. Trials never touch the user's model, optimizer or dataloaders: they time training steps of deep copies
on a copy of the first training batch. New candidates register with :func:`register_candidate`, with the least
one decision of theirs takes (in steps of the current plan: the budget tries a candidate only when that much is left)
and their place in the order. Comparisons run :func:`~lightning_speedups.measure.compare` from 3 rounds on, after one
untimed call of each option that is not already warm, and stop as soon as the result is settled.
"""

from __future__ import annotations

import contextlib
import copy
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from lightning.fabric.utilities.apply_func import move_data_to_device
from torch import nn

from lightning_speedups._autotune_optim import trial_optimizer, with_implementation
from lightning_speedups._inputs import flat_tensors
from lightning_speedups.functional.channels_last import to_channels_last
from lightning_speedups.measure import Comparison, compare, interleaved_timings, median

__all__ = ["APPLIES", "CANDIDATES", "COMPARISON_STEPS", "MIN_ROUNDS", "PRICES", "Choice", "TrialContext",
           "register_candidate"]


@dataclass
class Choice:
    """One decision of the plan: the option kept, its measured gain over the previous plan, and why."""

    name: str
    chosen: Any
    options: list[Any] = field(default_factory=list)
    gain: float = 1.0  # median speed ratio of the kept option over the plan before this trial
    interval: tuple[float, float] = (1.0, 1.0)
    trials: int = 0
    note: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "chosen": self.chosen, "options": self.options, "gain": self.gain,
                "interval": list(self.interval), "trials": self.trials, "note": self.note}  # fmt: skip


# A comparison stops as soon as its interval clears (or misses) the margin, after at least MIN_ROUNDS rounds: a 2x
# effect separates in 3 (below 8 rounds the interval is the range of the per-round ratios, so all 3 must clear the
# margin: a candidate no faster than the plan does so with a chance of at most 1 in 8, and far less unless the noise
# is as large as the margin). Its admission price is the least it can take: the candidate's warm-up call and
# MIN_ROUNDS rounds of the (already warm) plan and the candidate, each priced at the plan's step: 1 + 2 * MIN_ROUNDS.
MIN_ROUNDS = 3
COMPARISON_STEPS = 1 + 2 * MIN_ROUNDS


@dataclass
class TrialContext:
    """What every trial sees: the user's model (read only), a batch, the plan so far, the budget."""

    model: nn.Module
    # the user's first training batch: every step-time trial times it, including after the batching trial kept
    # length-aware batches (whose batches are shorter): acceptable for now, since a ratio on one batch carries over
    batch: Any
    device: torch.device
    planned_steps: int
    margin: float
    deadline: float
    plan: dict[str, Any]
    clock: Callable[[], float] = time.perf_counter
    notes: list[str] = field(default_factory=list)
    loader: Any = None  # the user's training loader (iterated in trials with the RNG forked, never changed)
    datamodule: Any = None
    own_loader: bool = False  # the loader is the model's own train_dataloader(), not one the user passed
    step_s: float = 0.0  # the current plan's step (seconds): what comparisons are priced in
    warm: tuple[Any, Callable[[], None] | None] = (None, None)  # (plan, its step) already called: no warm-up needed

    def budget_left(self) -> float:
        return self.deadline - self.clock()

    def price(self, name: str) -> float:
        """Seconds one decision of candidate ``name`` takes at least (:data:`PRICES` steps of the plan's step)."""
        steps = PRICES.get(name, COMPARISON_STEPS)
        return (steps(self) if callable(steps) else steps) * self.step_s

    def step(self, plan: Mapping[str, Any], steps: int = 1) -> Callable[[], None]:
        """:func:`make_step` on this context: a warm one when ``plan`` is the one :meth:`remember` kept."""
        if steps == 1 and self.warm[1] is not None and _same_plan(self.warm[0], plan):
            return self.warm[1]
        return make_step(self, plan, steps)

    def remember(self, plan: Mapping[str, Any], step: Callable[[], None], seconds: float) -> None:
        """``step`` (already called) runs ``plan``, in ``seconds``: later comparisons reuse it and are priced by it."""
        self.warm, self.step_s = (dict(plan), step), seconds

    def compare(self, fns: Mapping[str, Callable[[], Any]], baseline: str, share: float,
                min_gain: float | None = None) -> Comparison:
        """``measure.compare`` within ``share`` of the remaining budget (``min_gain``: default ``margin``), after one
        untimed call of each function that :meth:`step` did not hand out warm."""
        budget = max(self.budget_left() * share, 1e-3)
        t0 = self.clock()
        for fn in fns.values():
            if fn is not self.warm[1]:
                fn()  # first-call costs (lazy init, allocator), untimed
        budget = max(budget - (self.clock() - t0), 1e-3)
        gain = self.margin if min_gain is None else min_gain
        return compare(fns, baseline, min_gain=gain, budget_s=budget, min_rounds=MIN_ROUNDS, warmup=0,
                       clock=self.clock)


_STEP_KEYS = ("precision", "channels_last", "implementation", "batch_scale", "optimizer_only")  # what make_step reads


def _same_plan(a: Mapping[str, Any] | None, b: Mapping[str, Any]) -> bool:
    """Whether ``a`` and ``b`` run the same training step (the data path, the methods and the rest aside)."""
    return a is not None and all(a.get(k, _DEFAULTS.get(k)) == b.get(k, _DEFAULTS.get(k)) for k in _STEP_KEYS)


def _loss(model: nn.Module, batch: Any) -> torch.Tensor:
    step = getattr(model, "training_step", None)
    out = step(batch, 0) if callable(step) else model(batch)
    if isinstance(out, Mapping):
        out = out["loss"]
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"training_step returned {type(out).__name__}, not a loss tensor")
    return out


def _scaled(batch: Any, k: int) -> Any:
    """``batch`` with every batched tensor repeated ``k`` times along dim 0 (a batch ``k`` times larger)."""
    if isinstance(batch, torch.Tensor):
        return torch.cat([batch] * k) if batch.dim() > 0 else batch
    if isinstance(batch, Mapping):
        return {key: _scaled(v, k) for key, v in batch.items()}
    if isinstance(batch, (tuple, list)):
        return type(batch)(_scaled(v, k) for v in batch)
    return batch


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    with warnings.catch_warnings():  # the copies have no Trainer: self.log() only warns
        warnings.filterwarnings("ignore", message=r".*self\.log\(\).*")
        warnings.filterwarnings("ignore", message=r".*self\.trainer.*")
        yield


def make_step(ctx: TrialContext, plan: Mapping[str, Any], steps: int = 1) -> Callable[[], None]:
    """One (or ``steps``) optimizer step(s) of a fresh copy of the model under ``plan``'s settings."""
    model = _detached_copy(ctx.model).to(ctx.device)
    scale = int(plan.get("batch_scale", 1))
    batch = move_data_to_device(_scaled(ctx.batch, scale), ctx.device)
    if plan.get("channels_last"):
        model = model.to(memory_format=torch.channels_last)
        batch = to_channels_last(batch)
    optimizer = _trial_optimizer(ctx, model, plan.get("implementation"))
    precision = plan.get("precision", "32-true")
    dtype = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}.get(precision)
    only = bool(plan.get("optimizer_only"))  # the optimizer's step alone, on the gradients of one training step
    scaler = torch.amp.GradScaler(ctx.device.type) if precision == "16-mixed" else None

    def backward() -> None:
        optimizer.zero_grad(set_to_none=True)
        # 32-true runs no autocast context at all, as the Trainer's does
        cast = torch.autocast(ctx.device.type, dtype=dtype) if dtype is not None else contextlib.nullcontext()
        with _quiet(), cast:
            loss = _loss(model, batch)
        (loss if scaler is None else scaler.scale(loss)).backward()

    def optimizer_step() -> None:
        if scaler is None:
            optimizer.step()
        else:  # unscale, inf check, step, update: what Lightning's 16-mixed runs
            scaler.step(optimizer)
            scaler.update()

    if only:
        backward()

    def step() -> None:
        for _ in range(steps):
            if not only:
                backward()
            optimizer_step()
        if ctx.device.type == "cuda":
            torch.cuda.synchronize()

    return step


def _trial_optimizer(ctx: TrialContext, model: nn.Module, implementation: str | None) -> torch.optim.Optimizer:
    """The optimizer the fit will step, built by ``model``'s (the copy's) own ``configure_optimizers``, with the
    plan's kernel; AdamW (noted once in the plan) when it cannot be built outside a fit."""
    optimizer, why = trial_optimizer(model)
    if optimizer is None:
        note = f"the trials timed AdamW (lr 1e-4), not the model's optimizer: {why}"
        if note not in ctx.notes:
            ctx.notes.append(note)
        optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    return with_implementation(optimizer, implementation)


def _detached_copy(module: nn.Module) -> nn.Module:
    """A train-mode deep copy that never copies an attached Trainer (its ``self.log`` then only warns)."""
    trainer = module.__dict__.get("_trainer")
    memo = {id(trainer): None} if trainer is not None else {}
    clone = copy.deepcopy(module, memo)
    return clone.train()


def _decide(ctx: TrialContext, name: str, options: Mapping[str, dict[str, Any]], share: float) -> Choice:
    """Time the plan with each option (the current plan is the baseline) and keep the winner in ``ctx.plan``."""
    current = "current"
    fns = {current: ctx.step(ctx.plan), **{k: make_step(ctx, {**ctx.plan, **v}) for k, v in options.items()}}
    result = ctx.compare(fns, current, share)
    chosen = result.winner
    if chosen != current:
        ctx.plan.update(options[chosen])
    ctx.remember(ctx.plan, fns[chosen], result.medians[chosen])
    value = {k: ctx.plan.get(k, _DEFAULTS.get(k)) for k in next(iter(options.values()))}
    lo, mid, hi = result.ratios.get(chosen, (1.0, 1.0, 1.0))
    note = result.note or (f"{chosen} {mid:.2f}x faster" if chosen != current else "no option beat the plan")
    return Choice(name, value if len(value) > 1 else next(iter(value.values())), ["current", *options], mid,
                  (lo, hi), result.trials, note)  # fmt: skip


_DEFAULTS: dict[str, Any] = {"precision": "32-true", "channels_last": False, "implementation": "for_loop",
                             "batch_scale": 1, "optimizer_only": False}


def _precision(ctx: TrialContext, share: float) -> Choice | None:
    options: dict[str, dict[str, Any]] = {}
    if ctx.device.type == "cuda":
        if torch.cuda.is_bf16_supported():
            options["bf16-mixed"] = {"precision": "bf16-mixed"}
        options["16-mixed"] = {"precision": "16-mixed"}
    elif not ctx.plan.get("no_bf16"):
        options["bf16-mixed"] = {"precision": "bf16-mixed"}  # ~10x slower without bf16 units: measured, not assumed
    options = {k: v for k, v in options.items() if v["precision"] != ctx.plan.get("precision")}
    if not options:
        ctx.notes.append("precision not tried: bf16 disabled (no_bf16=True) and no GPU for 16-mixed")
        return None
    return _decide(ctx, "precision", options, share)


def _channels_last(ctx: TrialContext, share: float) -> Choice | None:
    images = [t for t in flat_tensors(ctx.batch) if t.dim() == 4]
    if not images or not any(isinstance(m, nn.Conv2d) for m in ctx.model.modules()):
        ctx.notes.append("channels_last not tried: no 4-D input or no Conv2d")
        return None
    return _decide(ctx, "channels_last", {"channels_last": {"channels_last": True}}, share)


def _optimizer(ctx: TrialContext, share: float) -> Choice | None:
    from lightning_speedups.optim import SpeedupMixin

    if not isinstance(ctx.model, SpeedupMixin):  # the plan sets SpeedupMixin's optimizer_config, never user code
        ctx.notes.append(f"fused/foreach optimizer not tried: `{type(ctx.model).__name__}.configure_optimizers` builds "
                         "its own optimizer, which the plan does not rewrite. HINT: pass fused=True (or foreach=True) "
                         "to the optimizer there, or use SpeedupMixin, whose `optimizer_config` the plan sets")
        return None
    # Amdahl first: a faster optimizer kernel saves at most the optimizer's share of a step. Where that share is too
    # small for the margin even at zero cost (a small CNN's Adam: about 2% of a step), the comparison, which would need
    # many rounds to separate a 2% gain from the 5% margin, is not run
    fns = {"full": make_step(ctx, ctx.plan), "alone": make_step(ctx, {**ctx.plan, "optimizer_only": True})}
    times = interleaved_timings(fns, repeats=MIN_ROUNDS, warmup=1, sync=False, clock=ctx.clock)  # make_step syncs CUDA
    part = median(times["alone"]) / max(median(times["full"]), 1e-12)
    bound = 1.0 / (1.0 - part) if part < 1.0 else float("inf")
    current = ctx.plan.get("implementation", _DEFAULTS["implementation"])
    if bound < 1.0 + ctx.margin:
        note = (f"fused/foreach not tried: the optimizer step is {part:.1%} of a training step, so even a free one "
                f"would be at most {bound:.3f}x faster, below the {ctx.margin:.0%} margin")  # fmt: skip
        return Choice("optimizer", current, ["current", "foreach", "fused"], 1.0, (1.0, 1.0), MIN_ROUNDS, note)
    options = {"foreach": {"implementation": "foreach"}, "fused": {"implementation": "fused"}}
    return _decide(ctx, "optimizer", options, share)


# A doubled batch must raise samples/s by this factor (and the margin) to be kept: that many more samples were needed to
# reach the target per doubling on both end-to-end bench tasks (benchmarks/autotune_methods.py --batch 64 / 128, the
# lr scaled by the sqrt rule, with the EMA and the schedule, 5 seeds, 2026-12-01: digits median 6 -> 9 -> 15 quarter
# epochs at batch 32 -> 64 -> 128, shapes 3 -> 5 -> 8). A step-time trial cannot see epochs, so this is the bench's.
BATCH_DOUBLING_COST = 1.5


def _batch_blocker(ctx: TrialContext) -> str | None:
    """Why :meth:`TunePlan.apply` could not set a larger batch for this data (``None``: it can)."""
    from lightning_speedups.callbacks._batch_size_trials import fit_loader_problem
    from lightning_speedups.data import DeviceDataLoader

    if ctx.datamodule is not None or ctx.own_loader:
        if any(h is not None and hasattr(h, "batch_size") for h in (ctx.datamodule, ctx.model)):
            return None
        return ("neither the datamodule nor the model has a `batch_size` attribute to set" if ctx.datamodule is not None
                else "the model has no `batch_size` attribute for its train_dataloader() to read")
    if isinstance(ctx.loader, DeviceDataLoader):
        return None
    problem = fit_loader_problem(ctx.loader)
    return None if problem is None else f"the training data is {problem}, which cannot be rebuilt at another batch size"


def _batch_size(ctx: TrialContext, share: float) -> Choice | None:
    why = _batch_blocker(ctx)
    if why is not None:  # a doubled batch that apply() could not set must not be kept (nor scale the schedule's lr)
        ctx.notes.append(f"batch_size not tried: {why}")
        return None
    # the same samples per timed call: 2 steps at the current size vs 1 step at twice the size; x4 only if x2 won.
    # x2 gets half the share (at least its price), x4 what is left of it (at least its price: its steps cost twice)
    scale, rounds, gain, interval, stopped = 1, 0, 1.0, (1.0, 1.0), ""
    need = (1.0 + ctx.margin) * BATCH_DOUBLING_COST
    allowance, spent_from = ctx.budget_left() * share, ctx.clock()
    for trial in (2, 4):
        price = ctx.price("batch_size") * (trial // 2)
        budget = max(allowance / 2, price) if trial == 2 else allowance - (ctx.clock() - spent_from)
        if budget < price:
            stopped = (f"x{trial} vs x{trial // 2} not tried: {max(budget, 0.0):.2f}s of its trial share left, below "
                       f"the {price:.2f}s one comparison needs")
            break
        larger = {**ctx.plan, "batch_scale": trial}
        fns = {"smaller": make_step(ctx, {**ctx.plan, "batch_scale": trial // 2}, steps=2),
               "larger": make_step(ctx, larger, steps=1)}  # fmt: skip
        result = ctx.compare(fns, "smaller", min(1.0, budget / max(ctx.budget_left(), 1e-12)), min_gain=need - 1.0)
        rounds += result.trials
        if result.winner != "larger":
            measured = result.ratios.get("larger")
            why = (f"{measured[1]:.2f}x the samples/s, below the {need:.2f}x needed: a doubled batch needed "
                   f"{BATCH_DOUBLING_COST:g}x the samples to reach the target on the bench tasks, and the margin is "
                   f"{ctx.margin:.0%}"
                   if measured and not (result.note or "").startswith("only ") else result.note or "not faster")
            stopped = f"x{trial} vs x{trial // 2}: {why}"
            break
        lo, mid, hi = result.ratios["larger"]  # x4 is x2 times x4-over-x2: the gains and their bounds multiply
        scale, gain, interval = trial, gain * mid, (interval[0] * lo, interval[1] * hi)
        ctx.remember(larger, fns["larger"], result.medians["larger"])
    ctx.plan["batch_scale"] = scale
    kept = f"batch x{scale}: {gain:.2f}x the samples/s" if scale > 1 else "batch size kept"
    note = kept + (f" ({stopped})" if stopped and scale > 1 else f": {stopped}" if stopped else "")
    return Choice("batch_size", scale, [1, 2, 4], gain, interval, rounds, note)


# the order matters, since a small budget goes to the first ones: batching first for token data (it changes which
# batches the run trains on; _autotune_batching.py registers it), then precision (the largest effect on CPUs with bf16
# units and on GPUs), then channels_last, then the data path (_autotune_data.py), after the step-time choices that
# change its share (the faster the step, the larger the loader's share: measured before bf16, a per-sample loader that
# cost 1.2x per step in the bf16 fit showed 1.04-1.11x), compile last (_autotune_compile.py)
CANDIDATES: dict[str, Callable[[TrialContext, float], Choice | None]] = {}
# the least one decision of each candidate takes, in steps of the current plan (default: COMPARISON_STEPS), or a
# function of the context that says so (0: the trial only notes why it has nothing to time)
PRICES: dict[str, float | Callable[[TrialContext], float]] = {}
# whether a candidate has anything to try for this model and data (absent: always); one that has not is skipped
# silently, before its price is weighed against the budget
APPLIES: dict[str, Callable[[TrialContext], bool]] = {}


def register_candidate(name: str, trial: Callable[[TrialContext, float], Choice | None], *,
                       steps: float | Callable[[TrialContext], float] = COMPARISON_STEPS, before: str | None = None,
                       applies: Callable[[TrialContext], bool] | None = None) -> None:
    """Add a candidate ``trial(ctx, budget_share) -> Choice | None`` (``None``: not applicable, with a note).

    ``steps``: the least one decision takes, in steps of the current plan (or ``steps(ctx)``); autotune tries the
    candidate only when that much of the budget is left. ``before``: the name of a registered candidate to measure
    it before (default: last). ``applies(ctx)``: ``False`` when there is nothing to try for this data, and nothing
    to say either (token batching for image data)."""
    items = [(k, v) for k, v in CANDIDATES.items() if k != name]
    at = next((i for i, (k, _v) in enumerate(items) if k == before), len(items))
    items.insert(at, (name, trial))
    CANDIDATES.clear()
    CANDIDATES.update(items)
    PRICES[name] = steps
    if applies is not None:
        APPLIES[name] = applies


for _name, _trial, _steps in (
    ("precision", _precision, COMPARISON_STEPS),
    ("channels_last", _channels_last, COMPARISON_STEPS),
    # x2 vs x1 on the same samples: 2 steps against one step twice as large, both warmed up: 4 + 4 per round
    ("batch_size", _batch_size, 4 + 4 * MIN_ROUNDS),
    ("optimizer", _optimizer, COMPARISON_STEPS),  # the least: the check of the optimizer's share of a step
):
    register_candidate(_name, _trial, steps=_steps)
