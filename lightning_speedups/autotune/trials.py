"""What every autotune candidate shares: the :class:`Choice` it returns, the :class:`TrialContext` it runs in, the
registry of candidates, and :func:`make_step`, the timed training step of a copy of the model under a plan.

A trial gets the current plan (what earlier trials kept) and returns a :class:`Choice`: the option it keeps and the
evidence. Trials never touch the user's model, optimizer or dataloaders: they time training steps of deep copies
on a copy of the first training batch. New candidates register with :func:`register_candidate`, with the least
one decision of theirs takes (in steps of the current plan: the budget tries a candidate only when that much is left)
and their place in the order. Comparisons run :func:`~lightning_speedups.measure.compare` from 3 rounds on, after one
untimed call of each option that is not already warm, and stop as soon as the result is settled.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from lightning.fabric.utilities.apply_func import move_data_to_device
from torch import nn

from lightning_speedups.autotune.optim import trial_optimizer, with_implementation
from lightning_speedups.functional.channels_last import apply_channels_last, to_channels_last
from lightning_speedups.functional.compile import compile_model
from lightning_speedups.measure import Comparison, compare, make_train_step, model_copy, training_step_loss
from lightning_speedups.optim.lr_scaling import auto_lr_rule, lr_factor, scale_optimizer_lrs

__all__ = [
    "APPLIES",
    "CANDIDATES",
    "COMPARISON_STEPS",
    "MIN_ROUNDS",
    "PRICES",
    "STEP_DEFAULTS",
    "Choice",
    "TrialContext",
    "compile_like_the_fit",
    "make_step",
    "register_candidate",
]


@dataclass
class Choice:
    """One decision of the plan: the option kept, its measured gain over the previous plan, and why.

    ``changed`` says whether the kept option changes the run (a setting other than the current one, or a method
    added); only a changed choice counts in :attr:`TunePlan.gain <lightning_speedups.autotune.TunePlan.gain>`.
    """

    name: str
    chosen: Any
    options: list[Any] = field(default_factory=list)
    gain: float = 1.0  # median speed ratio of the kept option over the plan before this trial
    interval: tuple[float, float] = (1.0, 1.0)
    trials: int = 0
    note: str = ""
    changed: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "chosen": self.chosen,
            "options": self.options,
            "gain": self.gain,
            "interval": list(self.interval),
            "trials": self.trials,
            "note": self.note,
            "changed": self.changed,
        }

    @classmethod
    def from_dict(cls, record: Mapping[str, Any]) -> Choice:
        """The choice ``as_dict`` wrote (its interval a tuple again); ``KeyError`` for a record without
        ``changed``, written before choices said so: the cache reads that as a miss."""
        return cls(**{**record, "interval": tuple(record["interval"]), "changed": record["changed"]})


# A comparison stops as soon as its interval clears (or misses) the margin, after at least MIN_ROUNDS rounds. Below 8
# rounds the interval is the range of the per-round ratios, so all 3 must clear the margin: a candidate no faster than
# the plan does so with a chance of at most 1 in 8, and far less unless the noise is as large as the margin. Its
# admission price is the least it can take: the candidate's warm-up call and MIN_ROUNDS rounds of the (already warm)
# plan and the candidate, each priced at the plan's step: 1 + 2 * MIN_ROUNDS.
MIN_ROUNDS = 3
COMPARISON_STEPS = 1 + 2 * MIN_ROUNDS

# what make_step reads, and each setting's value when the plan does not set it
STEP_DEFAULTS: dict[str, Any] = {
    "precision": "32-true",
    "channels_last": False,
    "implementation": "for_loop",
    "batch_scale": 1,
    "optimizer_only": False,
    "compile": False,
}


@dataclass
class TrialContext:
    """What every trial sees: the user's model (read only), a batch, the plan so far, the budget.

    ``plan`` holds the settings kept so far, plain values only (the cache stores them as JSON); what is not a
    setting has its own field: ``no_bf16`` (an option of the run) and ``replacement`` (the device twin of the data
    the data trial kept, as ``(kind, twin)``).
    """

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
    no_bf16: bool = False  # never try bf16 (to check a plan for CPUs without bf16 units on one that has them)
    replacement: tuple[str, Any] | None = None  # (kind, twin): the device-resident data the data trial kept

    def budget_left(self) -> float:
        return self.deadline - self.clock()

    def price(self, name: str) -> float:
        """Seconds one decision of candidate ``name`` takes at least (:data:`PRICES` steps of the plan's step)."""
        steps = PRICES.get(name, COMPARISON_STEPS)
        return (steps(self) if callable(steps) else steps) * self.step_s

    def step(self, plan: Mapping[str, Any], steps: int = 1, fresh: bool = False) -> Callable[[], None]:
        """:func:`make_step` on this context: the warm one when ``plan`` is the one :meth:`remember` kept (unless
        ``fresh``: a new copy of the model)."""
        if not fresh and steps == 1 and self.warm[1] is not None and _same_plan(self.warm[0], plan):
            return self.warm[1]
        return make_step(self, plan, steps)

    def remember(self, plan: Mapping[str, Any], step: Callable[[], None], seconds: float) -> None:
        """``step`` (already called) runs ``plan``, in ``seconds``: later comparisons reuse it and are priced by it."""
        self.warm = (dict(plan), step)
        self.step_s = seconds

    def compare(
        self,
        fns: Mapping[str, Callable[[], Any]],
        baseline: str,
        share: float,
        min_gain: float | None = None,
        returns_time: bool = False,
    ) -> Comparison:
        """:func:`~lightning_speedups.measure.compare` within ``share`` of the remaining budget (``min_gain``:
        default ``margin``), after one untimed call of each function that :meth:`step` did not hand out warm
        (``returns_time``: each call returns its own cost in seconds, as ``compare`` reads it)."""
        budget = max(self.budget_left() * share, 1e-3)
        t0 = self.clock()
        for fn in fns.values():
            if fn is not self.warm[1]:
                fn()  # first-call costs (lazy init, allocator), untimed
        budget = max(budget - (self.clock() - t0), 1e-3)
        gain = self.margin if min_gain is None else min_gain
        # the plan row carries the note: no warning here
        return compare(
            fns,
            baseline,
            min_gain=gain,
            budget_s=budget,
            min_rounds=MIN_ROUNDS,
            warmup=0,
            clock=self.clock,
            warn=False,
            returns_time=returns_time,
        )


def _same_plan(a: Mapping[str, Any] | None, b: Mapping[str, Any]) -> bool:
    """Whether ``a`` and ``b`` run the same training step (the data path, the methods and the rest aside)."""
    return a is not None and all(
        a.get(k, STEP_DEFAULTS.get(k)) == b.get(k, STEP_DEFAULTS.get(k)) for k in STEP_DEFAULTS
    )


def _scaled(batch: Any, k: int) -> Any:
    """``batch`` with every batched tensor repeated ``k`` times along dim 0 (a batch ``k`` times larger)."""
    if isinstance(batch, torch.Tensor):
        return torch.cat([batch] * k) if batch.dim() > 0 else batch
    if isinstance(batch, Mapping):
        return {key: _scaled(v, k) for key, v in batch.items()}
    if isinstance(batch, (tuple, list)):
        return type(batch)(_scaled(v, k) for v in batch)
    return batch


def make_step(ctx: TrialContext, plan: Mapping[str, Any], steps: int = 1) -> Callable[[], None]:
    """One (or ``steps``) optimizer step(s) of a fresh copy of the model under ``plan``'s settings, built by
    :func:`~lightning_speedups.measure.make_train_step` with the model's own ``training_step`` as the loss."""
    model = model_copy(ctx.model, train=True).to(ctx.device)
    if plan.get("compile"):
        compile_like_the_fit(model)
    batch = move_data_to_device(_scaled(ctx.batch, int(plan.get("batch_scale", 1))), ctx.device)
    if plan.get("channels_last"):
        apply_channels_last(model, warn=False)  # 4-D tensors only (Module.to raises on a Conv3d's 5-D weight)
        batch = to_channels_last(batch)
    optimizer = _trial_optimizer(ctx, model, plan.get("implementation"))
    scale = int(plan.get("batch_scale", 1))  # a larger batch trains with its lr scaled, as the plan would apply it
    scale_optimizer_lrs(optimizer, [], lr_factor(scale, 1, auto_lr_rule(optimizer)))
    precision = plan.get("precision", "32-true")
    dtype = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}.get(precision)  # 32-true: no autocast at all
    step = make_train_step(
        model,
        batch,
        optimizer=optimizer,
        autocast_dtype=dtype,
        loss=training_step_loss,
        steps=steps,
        grad_scaler=precision == "16-mixed",
        optimizer_only=bool(plan.get("optimizer_only")),
        return_loss=False,
    )
    return step  # type: ignore[return-value]


def compile_like_the_fit(model: nn.Module) -> None:
    """Compile ``model`` in place as the plan's :class:`~lightning_speedups.TorchCompile` compiles the fit's module:
    the same targets and settings. ``torch.compile(model)`` would not do: its wrapper compiles ``forward`` only when
    called itself, while a LightningModule's ``training_step`` calls ``self(x)`` on the plain module inside it."""
    from lightning_speedups.callbacks.compile import TorchCompile  # the callback the plan adds for "compile"

    callback = TorchCompile()
    compile_model(model, attrs=callback.targets(model), config=callback.config)  # type: ignore[arg-type]


def _trial_optimizer(ctx: TrialContext, model: nn.Module, implementation: str | None) -> torch.optim.Optimizer:
    """The optimizer the fit will step, built by ``model``'s (the copy's) own ``configure_optimizers``, with the
    plan's kernel; AdamW (noted once in the plan) when it cannot be built outside a fit."""
    optimizer, why = trial_optimizer(model, ctx.planned_steps)
    if optimizer is None:
        note = f"the trials timed AdamW (lr 1e-4), not the model's optimizer: {why}"
        if note not in ctx.notes:
            ctx.notes.append(note)
        optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    return with_implementation(optimizer, implementation)


# the candidates in the order they are measured (a small budget goes to the first ones): the order and the reasons
# for it are in the candidate modules that register them (autotune/candidates.py first)
CANDIDATES: dict[str, Callable[[TrialContext, float], Choice | None]] = {}
# the least one decision of each candidate takes, in steps of the current plan (default: COMPARISON_STEPS), or a
# function of the context that says so (0: the trial only notes why it has nothing to time)
PRICES: dict[str, float | Callable[[TrialContext], float]] = {}
# whether a candidate has anything to try for this model and data (absent: always); one that has not is skipped
# silently, before its price is weighed against the budget
APPLIES: dict[str, Callable[[TrialContext], bool]] = {}
# why a candidate cannot be tried on this model, data or plan so far (``None``: it can): asked when the candidate
# comes up, before its price is weighed, so the plan says the real reason and never blames the budget for it
BLOCKERS: dict[str, Callable[[TrialContext], str | None]] = {}


def register_candidate(
    name: str,
    trial: Callable[[TrialContext, float], Choice | None],
    *,
    steps: float | Callable[[TrialContext], float] = COMPARISON_STEPS,
    before: str | None = None,
    applies: Callable[[TrialContext], bool] | None = None,
    blocker: Callable[[TrialContext], str | None] | None = None,
) -> None:
    """Add a candidate ``trial(ctx, budget_share) -> Choice | None`` (``None``: not applicable, with a note).

    ``steps``: the least one decision takes, in steps of the current plan (or ``steps(ctx)``); autotune tries the
    candidate only when that much of the budget is left. ``before``: the name of a registered candidate to measure
    it before (default: last). ``applies(ctx)``: ``False`` when there is nothing to try for this data, and nothing
    to say either (token batching for image data). ``blocker(ctx)``: why the candidate cannot be tried here (the
    note the plan shows, e.g. ``"channels_last not tried: no Conv2d"``), or ``None``."""
    items = [(k, v) for k, v in CANDIDATES.items() if k != name]
    at = next((i for i, (k, _v) in enumerate(items) if k == before), len(items))
    items.insert(at, (name, trial))
    CANDIDATES.clear()
    CANDIDATES.update(items)
    PRICES[name] = steps
    if applies is not None:
        APPLIES[name] = applies
    if blocker is not None:
        BLOCKERS[name] = blocker
