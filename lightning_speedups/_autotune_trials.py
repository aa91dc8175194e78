"""autotune's candidates: each a small trial on copies of the user's model, decided by ``measure.compare``.

A trial gets the current plan (what earlier trials kept) and returns a :class:`Choice`: the option it keeps and the
evidence. Trials never touch the user's model, optimizer or dataloaders: they time training steps of deep copies
on a copy of the first training batch. New candidates register with :func:`register_candidate`.
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

__all__ = ["CANDIDATES", "Choice", "TrialContext", "register_candidate"]


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


@dataclass
class TrialContext:
    """What every trial sees: the user's model (read only), a batch, the plan so far, the budget."""

    model: nn.Module
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

    def budget_left(self) -> float:
        return self.deadline - self.clock()

    def compare(self, fns: Mapping[str, Callable[[], Any]], baseline: str, share: float,
                min_gain: float | None = None) -> Comparison:
        """``measure.compare`` within ``share`` of the remaining budget (``min_gain``: default ``margin``)."""
        budget = max(self.budget_left() * share, 1e-3)
        gain = self.margin if min_gain is None else min_gain
        return compare(fns, baseline, min_gain=gain, budget_s=budget, min_rounds=5, warmup=1, clock=self.clock)


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
    fns = {current: make_step(ctx, ctx.plan), **{k: make_step(ctx, {**ctx.plan, **v}) for k, v in options.items()}}
    result = ctx.compare(fns, current, share)
    chosen = result.winner
    if chosen != current:
        ctx.plan.update(options[chosen])
    value = {k: ctx.plan.get(k, _DEFAULTS.get(k)) for k in next(iter(options.values()))}
    lo, mid, hi = result.ratios.get(chosen, (1.0, 1.0, 1.0))
    note = result.note or (f"{chosen} {mid:.2f}x faster" if chosen != current else "no option beat the plan")
    return Choice(name, value if len(value) > 1 else next(iter(value.values())), ["current", *options], mid,
                  (lo, hi), result.trials, note)  # fmt: skip


_DEFAULTS: dict[str, Any] = {"precision": "32-true", "channels_last": False, "implementation": "for_loop"}


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
    times = interleaved_timings(fns, repeats=5, warmup=1, sync=False, clock=ctx.clock)  # make_step syncs CUDA itself
    part = median(times["alone"]) / max(median(times["full"]), 1e-12)
    bound = 1.0 / (1.0 - part) if part < 1.0 else float("inf")
    current = ctx.plan.get("implementation", _DEFAULTS["implementation"])
    if bound < 1.0 + ctx.margin:
        note = (f"fused/foreach not tried: the optimizer step is {part:.1%} of a training step, so even a free one "
                f"would be at most {bound:.3f}x faster, below the {ctx.margin:.0%} margin")  # fmt: skip
        return Choice("optimizer", current, ["current", "foreach", "fused"], 1.0, (1.0, 1.0), 5, note)
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
    # the same samples per timed call: 2 steps at the current size vs 1 step at twice the size; x4 only if x2 won
    scale, rounds, gain, interval, stopped = 1, 0, 1.0, (1.0, 1.0), ""
    need = (1.0 + ctx.margin) * BATCH_DOUBLING_COST
    for trial in (2, 4):
        fns = {"smaller": make_step(ctx, {**ctx.plan, "batch_scale": trial // 2}, steps=2),
               "larger": make_step(ctx, {**ctx.plan, "batch_scale": trial}, steps=1)}  # fmt: skip
        result = ctx.compare(fns, "smaller", share / 2, min_gain=need - 1.0)
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
    ctx.plan["batch_scale"] = scale
    kept = f"batch x{scale}: {gain:.2f}x the samples/s" if scale > 1 else "batch size kept"
    note = kept + (f" ({stopped})" if stopped and scale > 1 else f": {stopped}" if stopped else "")
    return Choice("batch_size", scale, [1, 2, 4], gain, interval, rounds, note)


def _compile(ctx: TrialContext, share: float) -> Choice | None:
    budget = ctx.budget_left() * share
    if budget < 30.0:  # inductor takes tens of seconds on a small CPU: not worth trying inside a small budget
        ctx.notes.append(f"compile not tried: {budget:.0f}s of trial budget left; compiling takes tens of seconds")
        return None
    eager = make_step(ctx, ctx.plan)
    t0 = ctx.clock()
    model = _detached_copy(ctx.model).to(ctx.device)
    compiled_ctx = TrialContext(torch.compile(model), ctx.batch, ctx.device, ctx.planned_steps, ctx.margin,
                                ctx.deadline, ctx.plan, ctx.clock)  # fmt: skip
    compiled = make_step(compiled_ctx, ctx.plan)
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


def _device_twin(ctx: TrialContext) -> tuple[str, Any] | None:
    """``(kind, twin)``: a device-resident twin of the training data (kind ``"datamodule"`` or ``"loader"``), the
    pair the plan keeps as ``_replacement``; ``None`` when no twin can keep the user's transforms."""
    from torch.utils.data import TensorDataset

    from lightning_speedups.data import DeviceDataLoader

    dm = ctx.datamodule
    if dm is not None and all(hasattr(dm, a) for a in ("train_images", "train_labels", "transforms")):
        from lightning_speedups.recipes import device_datamodule

        twin = device_datamodule(dm, batch_size=int(getattr(dm, "batch_size", 64)))
        return "datamodule", twin  # the demo protocol: its transforms become a BatchAugment on the device
    dataset = getattr(ctx.loader, "dataset", None)
    if type(dataset) is TensorDataset:  # no per-sample transform to lose
        loader = DeviceDataLoader(*dataset.tensors, batch_size=ctx.loader.batch_size, shuffle=True, device=ctx.device)
        return "loader", loader
    return None


def _data(ctx: TrialContext, share: float) -> Choice | None:
    if ctx.loader is None:
        return None
    twin = _device_twin(ctx)
    if twin is None:
        ctx.notes.append("data path not tried: the loader has per-sample transforms that no device twin reproduces")
        return None
    kind, replacement = twin
    step = make_step(ctx, ctx.plan)  # the step as the earlier trials left the plan: data's share of the final step
    scale = int(ctx.plan.get("batch_scale", 1))

    def loop(loader: Any) -> Callable[[], None]:
        state: dict[str, Any] = {"it": None}

        def fetch_and_step() -> None:  # the batches of one step fetched (a fresh pass when exhausted), one step
            with torch.random.fork_rng(devices=[]):
                for _ in range(scale):  # a step at batch_scale k takes k of the loader's batches
                    if state["it"] is None:
                        state["it"] = iter(loader)
                    try:
                        next(state["it"])
                    except StopIteration:
                        state["it"] = iter(loader)
                        next(state["it"])
            step()

        return fetch_and_step

    if kind == "datamodule":
        replacement.trainer = None
        twin_loader = replacement.train_dataloader()
    else:
        twin_loader = replacement
    result = ctx.compare({"current": loop(ctx.loader), "device": loop(twin_loader)}, "current", share)
    keep = result.winner == "device"
    ctx.plan["device_data"] = keep
    if keep:
        ctx.plan["_replacement"] = twin
    lo, mid, hi = result.ratios["device"]
    note = result.note or (f"data on the device: {mid:.2f}x per step" if keep else "the loader is not the bottleneck")
    return Choice("data", keep, [False, True], mid if keep else 1.0, (lo, hi), result.trials, note)


# the order matters, since a small budget goes to the first ones: precision first (the largest effect on CPUs with
# bf16 units and on GPUs), then channels_last, then the data path, after the step-time choices that change its share
# (the faster the step, the larger the loader's share: measured before bf16, a per-sample loader that cost 1.2x per
# step in the bf16 fit showed 1.04-1.11x), compile last
CANDIDATES: dict[str, Callable[[TrialContext, float], Choice | None]] = {}


def register_candidate(name: str, trial: Callable[[TrialContext, float], Choice | None]) -> None:
    """Add a candidate ``trial(ctx, budget_share) -> Choice | None`` (``None``: not applicable, with a note)."""
    CANDIDATES[name] = trial


for _name, _trial in (("precision", _precision), ("channels_last", _channels_last), ("data", _data),
                      ("batch_size", _batch_size), ("optimizer", _optimizer), ("compile", _compile)):  # fmt: skip
    register_candidate(_name, _trial)
