"""autotune's time-to-accuracy methods: changes that need fewer steps, not faster ones.

A few timed steps cannot measure how many epochs a run needs, so these are not trials. A method enters autotune's
default plan only for the model kinds (:func:`~lightning_speedups.autotune.kinds.model_kind`) where the end-to-end
bench showed it reaching the target sooner and slowing no task of that kind
(:data:`~lightning_speedups.autotune.kinds.EVIDENCE`): today neither for any kind. Both helped the digits and shapes
CNNs (``"conv"``), but the EMA slowed the U-Net segmentation task and the schedule the resnet18 one. Otherwise
:func:`plan_methods` leaves it out of the default plan with one note; named in ``methods``, it is added, and its note
quotes what the bench found for this kind. Its per-step cost *is* measured here, on a copy of
the model, and reported.

``ema``: :class:`~lightning_speedups.callbacks.ema.EMA` (Lightning's ``EMAWeightAveraging``), decay 0.99 with the
warm-up decay, validated and checkpointed with the averaged weights.

``schedule``: :class:`~lightning_speedups.callbacks.fast_schedule.FastSchedule` on the user's optimizer: a warm-up of a
quarter epoch (at most 5% of the planned run), a peak of 3x the optimizer's lr, then a linear decay to zero at the end
of the planned run. The short warm-up matters (a longer one lost most of the gain).

What each reached on the bench, and how it was run (``python benchmarks/autotune_methods.py TASK``), is in
docs/evidence.md, section "autotune". The schedule needs a module that returns only its optimizer, an Adam-type
optimizer (the evidence is Adam's: a 3x peak on a tuned SGD lr can diverge), automatic optimization and a bounded
run; otherwise it is left out, with a note. A plain module whose batch the plan enlarged gets its peak scaled by the
square-root rule too (a :class:`~lightning_speedups.optim.SpeedupMixin` model's lr is already scaled by
:meth:`~lightning_speedups.autotune.TunePlan.apply`).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from typing import Any

import torch
from lightning.pytorch.callbacks import LearningRateFinder, StochasticWeightAveraging
from torch import nn

from lightning_speedups._errors import SpeedupConfigError
from lightning_speedups._strategies import SHARDED_STRATEGIES
from lightning_speedups.autotune.kinds import default_for, evidence_text, hurt_tasks, proven_kinds
from lightning_speedups.autotune.optim import configured, optimizers_of, outside_fit_reason, returns_scheduler
from lightning_speedups.autotune.trials import Choice
from lightning_speedups.callbacks.ema import AVERAGING_CALLBACKS, EMA
from lightning_speedups.callbacks.fast_schedule import FastSchedule
from lightning_speedups.functional.ema import create_ema_model
from lightning_speedups.measure import model_copy
from lightning_speedups.optim import SpeedupMixin

__all__ = [
    "EMA_DECAY",
    "METHODS",
    "SCHEDULE_PEAK",
    "check_methods",
    "ema_blocker",
    "ema_choice",
    "method_callbacks",
    "plan_methods",
    "schedule_blocker",
    "schedule_choice",
    "schedule_warmup",
]

METHODS = ("ema", "schedule")
EMA_DECAY = 0.99
SCHEDULE_PEAK = 3.0


def check_methods(methods: Sequence[str] | None) -> list[str]:
    """The method names to apply (``None``: all of :data:`METHODS`); unknown names raise and list the valid ones."""
    if methods is None:
        return list(METHODS)
    if isinstance(methods, str):
        raise SpeedupConfigError(
            f"`methods`={methods!r} is a string. Allowed values: a list of names from "
            f"{list(METHODS)!r}, e.g. ['ema'], or [] for none."
        )
    names = list(dict.fromkeys(methods))
    unknown = [n for n in names if n not in METHODS]
    if unknown:
        raise SpeedupConfigError(
            f"`methods` has unknown names {unknown!r}. Allowed values: {list(METHODS)!r} (or [] for none)."
        )
    return names


def plan_methods(methods: Sequence[str] | None, kind: str) -> tuple[list[str], str | None]:
    """The methods to add for a ``kind`` model and the note on those left out: the names given, all of them (the user
    asked); by default (``None``) only those the bench showed helping ``kind`` models and slowing none, the rest left
    out with one note (per method, why: no evidence for this kind, or a task of this kind it made slower)."""
    names = check_methods(methods)
    if methods is not None:
        return names, None
    kept = [m for m in names if kind in proven_kinds(m)]
    left = [m for m in names if m not in kept]
    if not left:
        return kept, None
    hurt = {m: hurt_tasks(m, kind) for m in left}
    unseen = [m for m in left if not hurt[m]]
    parts = [
        f"{m} made a {kind} task slower to its target ({', '.join(hurt[m])}), so no {kind} model gets it by "
        "default (do no harm)"
        for m in left
        if hurt[m]
    ]
    if unseen:
        where = ", ".join(f"{m} is in the default plan of {default_for(m)}" for m in unseen)
        parts.insert(0, f"no evidence for this model kind ({kind}): {where}")
    them = "them" if len(left) > 1 else "it"
    note = (
        f"{', '.join(left)} not added: {'; '.join(parts)}; a few trial steps cannot time a gain in epochs. "
        f"HINT: pass `methods={names!r}` to add {them} anyway."
    )
    return kept, note


def ema_blocker(trainer_kwargs: dict[str, Any]) -> str | None:
    """Why the EMA cannot join this run (``None``: it can), before any Trainer exists: what :meth:`EMA.setup`
    refuses, another averaging callback or a sharded strategy (here also given by name)."""
    callbacks = trainer_kwargs.get("callbacks") or []
    callbacks = callbacks if isinstance(callbacks, (list, tuple)) else [callbacks]
    others = [type(cb).__name__ for cb in callbacks if isinstance(cb, AVERAGING_CALLBACKS)]
    if others:
        return f"the Trainer already averages weights ({', '.join(others)})"
    strategy = trainer_kwargs.get("strategy")
    sharded = isinstance(strategy, SHARDED_STRATEGIES) or (
        isinstance(strategy, str) and any(word in strategy.lower() for word in ("fsdp", "deepspeed"))
    )
    if sharded:
        return f"`strategy`={strategy!r} is sharded (the average would be a full copy on every rank)"
    return None


def ema_choice(
    model: nn.Module,
    device: torch.device,
    step_s: float,
    trainer_kwargs: dict[str, Any],
    clock: Callable[[], float],
    kind: str,
) -> tuple[Choice | None, str | None]:
    """The EMA as a plan choice, with its update's cost measured on a copy of ``model`` relative to one training
    step (``step_s``); ``(None, note)`` when :func:`ema_blocker` refuses it. The note quotes the evidence for a
    ``kind`` model (:func:`~lightning_speedups.autotune.kinds.evidence_text`)."""
    why = ema_blocker(trainer_kwargs)
    if why is not None:
        return None, f"ema not added: {why}"
    copy = model_copy(model, train=True).to(device)
    average = create_ema_model(copy, decay=EMA_DECAY, warmup=True)
    times = []
    with torch.no_grad():
        for _ in range(6):  # the first update is a copy; the median of the rest is the per-step cost
            t0 = clock()
            average.update_parameters(copy)
            if device.type == "cuda":
                torch.cuda.synchronize()
            times.append(clock() - t0)
    cost = statistics.median(times[1:]) / max(step_s, 1e-12)
    gain = 1.0 / (1.0 + cost)  # per step it only costs; the gain is in the epochs, which a trial cannot time
    note = (
        f"EMA of the weights (decay {EMA_DECAY}, warm-up), a time-to-accuracy method: not timed for accuracy "
        f"here; {_why('ema', kind)}; its update costs {cost:.1%} of a training step. Validation and checkpoints "
        "use the average. Pass `methods=[]` to leave it out."
    )
    return Choice("ema", EMA_DECAY, [None, EMA_DECAY], gain, (gain, gain), len(times) - 1, note, changed=True), None


def _why(method: str, kind: str) -> str:
    """The evidence for ``method`` on a ``kind`` model, or that it was added only because ``methods`` named it."""
    text = evidence_text(method, kind)
    return text if kind in proven_kinds(method) else f"{text}: added because `methods` names it"


_ADAM_TYPE = (torch.optim.Adam, torch.optim.AdamW, torch.optim.NAdam, torch.optim.RAdam, torch.optim.Adamax)


def _bounded(trainer_kwargs: dict[str, Any]) -> bool:
    steps = trainer_kwargs.get("max_steps")
    epochs = trainer_kwargs.get("max_epochs")
    return (steps is not None and steps != -1) or (epochs is not None and epochs != -1)


def _steps_of(trainer_kwargs: dict[str, Any]) -> int | None:
    steps = trainer_kwargs.get("max_steps")
    return int(steps) if isinstance(steps, int) and steps > 0 else None


def schedule_blocker(model: nn.Module, trainer_kwargs: dict[str, Any], planned_steps: int | None = None) -> str | None:
    """Why the schedule cannot join this run (``None``: it can), before any Trainer exists: what
    :class:`FastSchedule` refuses (a module that returns a scheduler, manual optimization, an unbounded run), and a
    Trainer that already has a callback owning the LR (another FastSchedule, StochasticWeightAveraging's SWALR, an LR
    finder, whose choice a 3x peak would overshoot)."""
    if not getattr(model, "automatic_optimization", True):
        return "the module uses manual optimization (Lightning does not step LR schedulers then)"
    if not _bounded(trainer_kwargs):
        return "the run has no planned length (pass max_epochs or max_steps): the decay must end with the run"
    callbacks = trainer_kwargs.get("callbacks") or []
    callbacks = callbacks if isinstance(callbacks, (list, tuple)) else [callbacks]
    lr_owners = (FastSchedule, StochasticWeightAveraging, LearningRateFinder)
    owners = [type(cb).__name__ for cb in callbacks if isinstance(cb, lr_owners)]
    if owners:
        return f"the Trainer already has a callback that sets the learning rate ({', '.join(owners)})"
    try:
        conf = configured(model_copy(model, train=True), planned_steps or _steps_of(trainer_kwargs))
    except Exception as err:
        return f"could not check whether it returns a scheduler: {outside_fit_reason(err)}"
    if returns_scheduler(conf):
        return f"`{type(model).__name__}.configure_optimizers` already returns an LR scheduler"
    others = sorted({type(opt).__name__ for opt in optimizers_of(conf) if not isinstance(opt, _ADAM_TYPE)})
    if others:  # a 3x peak on a tuned SGD lr can diverge, and the bench measured Adam only
        return (
            f"its evidence is for Adam-type optimizers ({', '.join(t.__name__ for t in _ADAM_TYPE)}), and "
            f"`configure_optimizers` returns {', '.join(others)}, whose learning rate is kept"
        )
    return None


def schedule_warmup(loader_steps: int | None, planned_steps: int) -> float:
    """The warm-up as a fraction of the planned run: a quarter epoch, at most 5% (5% when the epoch length is
    unknown); a fraction stays right when the plan changes the batch size (both counts scale alike)."""
    if not loader_steps:
        return 0.05
    return min(0.05, 0.25 * loader_steps / max(planned_steps, 1))


def schedule_choice(
    model: nn.Module, trainer_kwargs: dict[str, Any], kind: str, planned_steps: int | None = None
) -> tuple[Choice | None, str | None]:
    """The schedule as a plan choice; ``(None, note)`` when :func:`schedule_blocker` refuses it. It costs nothing per
    step (one ``LambdaLR`` step), so nothing is timed: its evidence is the bench's."""
    why = schedule_blocker(model, trainer_kwargs, planned_steps)
    if why is not None:
        return None, f"schedule not added: {why}"
    note = (
        f"a schedule for time to target (FastSchedule: warm-up of a quarter epoch, at most 5% of the run, to "
        f"{SCHEDULE_PEAK:g}x the optimizer's lr, then linear decay to the end of the planned run): not timed for "
        f"accuracy here; {_why('schedule', kind)}. Pass `methods=[]` to keep your learning rate."
    )
    return Choice("schedule", SCHEDULE_PEAK, [None, SCHEDULE_PEAK], 1.0, (1.0, 1.0), 0, note, changed=True), None


def method_callbacks(
    settings: dict[str, Any],
    trainer_kwargs: dict[str, Any],
    notes: list[str],
    model: Any = None,
    warmup: float = 0.05,
    base_batch: int | None = None,
    checked: bool = False,
) -> list[Any]:
    """The callbacks of the plan's methods (a cached plan too); one the run cannot take is left out with a note.

    ``warmup`` is the schedule's warm-up fraction (:func:`schedule_warmup`); ``base_batch``, the user's batch size,
    lets the schedule scale a plain module's peak when the plan enlarged the batch. ``checked``: the blockers were
    just run on this model and these Trainer arguments (the schedule's calls ``configure_optimizers`` on a copy)."""
    callbacks: list[Any] = []
    if settings.get("ema"):
        why = ema_blocker(trainer_kwargs)
        if why is None:
            callbacks.append(EMA(decay=float(settings["ema"]), warmup=True))
        else:
            notes.append(f"ema not added: {why}")
    if settings.get("schedule"):
        why = schedule_blocker(model, trainer_kwargs) if model is not None and not checked else None
        if why is not None:
            notes.append(f"schedule not added: {why}")
            return callbacks
        scale = int(settings.get("batch_scale", 1))
        scaled = scale > 1 and base_batch and not isinstance(model, SpeedupMixin)
        callbacks.append(
            FastSchedule(
                warmup=warmup,
                peak_factor=float(settings["schedule"]),
                decay="linear",
                base_batch_size=base_batch if scaled else None,
                batch_size=base_batch * scale if scaled else None,
            )
        )
    return callbacks
