"""autotune's time-to-accuracy methods: changes that need fewer steps, not faster ones.

A few timed steps cannot measure how many epochs a run needs, so these are not trials. A method enters autotune's
default plan only when the end-to-end bench (``lightning-speedups bench --only recipes``) showed it reaching the
target sooner on both of its tasks; its per-step cost *is* measured here, on a copy of the model, and reported.

``ema``: :class:`~lightning_speedups.callbacks.ema.EMA` (Lightning's ``EMAWeightAveraging``), decay 0.99 with the
warm-up decay, validated and checkpointed with the averaged weights. On the bench's plain baseline (constant Adam
1e-3, batch 32, fp32), validated every half epoch, it cut the half epochs to the target from [6, 6, 7, 5] to
[3, 4, 3, 3] on digits (95%, seeds 0-3) and from [3, 5, 4] to [2, 2, 2] on shapes (90%, seeds 0-2), measured 2026-12-01.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from lightning_speedups._autotune_trials import Choice, _detached_copy
from lightning_speedups._errors import SpeedupConfigError
from lightning_speedups.callbacks.ema import AVERAGING_CALLBACKS, EMA, SHARDED_STRATEGIES
from lightning_speedups.functional.ema import create_ema_model

__all__ = ["EMA_DECAY", "METHODS", "check_methods", "ema_blocker", "ema_choice", "method_callbacks"]

METHODS = ("ema",)
EMA_DECAY = 0.99
_EVIDENCE = ("on the bench's plain baseline it reached the target in [3, 4, 3, 3] instead of [6, 6, 7, 5] half "
             "epochs (digits) and [2, 2, 2] instead of [3, 5, 4] (shapes)")


def check_methods(methods: Sequence[str] | None) -> list[str]:
    """The method names to apply (``None``: all of :data:`METHODS`); unknown names raise and list the valid ones."""
    if methods is None:
        return list(METHODS)
    if isinstance(methods, str):
        raise SpeedupConfigError(f"`methods`={methods!r} is a string. Allowed values: a list of names from "
                                 f"{list(METHODS)!r}, e.g. ['ema'], or [] for none.")
    names = list(methods)
    unknown = [n for n in names if n not in METHODS]
    if unknown:
        raise SpeedupConfigError(f"`methods` has unknown names {unknown!r}. Allowed values: {list(METHODS)!r} "
                                 "(or [] for none).")
    return names


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
        isinstance(strategy, str) and any(word in strategy.lower() for word in ("fsdp", "deepspeed")))
    if sharded:
        return f"`strategy`={strategy!r} is sharded (the average would be a full copy on every rank)"
    return None


def ema_choice(model: nn.Module, device: torch.device, step_s: float, trainer_kwargs: dict[str, Any],
               clock: Callable[[], float]) -> tuple[Choice | None, str | None]:
    """The EMA as a plan choice, with its update's cost measured on a copy of ``model`` relative to one training
    step (``step_s``); ``(None, note)`` when :func:`ema_blocker` refuses it."""
    why = ema_blocker(trainer_kwargs)
    if why is not None:
        return None, f"ema not added: {why}"
    copy = _detached_copy(model).to(device)
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
    note = (f"EMA of the weights (decay {EMA_DECAY}, warm-up), a time-to-accuracy method: not timed for accuracy "
            f"here, {_EVIDENCE}; its update costs {cost:.1%} of a training step. Validation and checkpoints use the "
            "average. Pass `methods=[]` to leave it out.")
    return Choice("ema", EMA_DECAY, [None, EMA_DECAY], gain, (gain, gain), len(times) - 1, note), None


def method_callbacks(settings: dict[str, Any], trainer_kwargs: dict[str, Any], notes: list[str]) -> list[Any]:
    """The callbacks of the plan's methods (a cached plan too); one the run cannot take is left out with a note."""
    if not settings.get("ema"):
        return []
    why = ema_blocker(trainer_kwargs)
    if why is not None:
        notes.append(f"ema not added: {why}")
        return []
    return [EMA(decay=float(settings["ema"]), warmup=True)]
