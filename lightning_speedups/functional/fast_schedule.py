"""A learning-rate schedule for reaching a target accuracy soon: short warm-up, higher peak, decay to the end.

A constant learning rate (the default of most LightningModules: Adam at 1e-3) is a compromise: too low to move fast
early, too high to settle late. The schedule here spends a short warm-up (default 5% of the steps) reaching a *higher*
peak (``peak_factor`` x the optimizer's lr, scaled with the batch size from ``base_batch_size`` by the square-root
or linear rule, Goyal et al. 2017), then decays it to ``final_lr_ratio`` x peak at the end of the run: linearly by
default, which matches or beats cosine for a fixed budget (Defazio et al. 2023, "When, why and how much?"). The decay
is what makes the weights settle, so accuracy climbs during the second half instead of plateauing.

Each param group keeps its own ratio to the others (lr multipliers survive). The factor is a picklable object, so
``LambdaLR.state_dict()`` stores it and a resumed run continues the same curve.
"""

from __future__ import annotations

import math

import torch
from torch.optim.lr_scheduler import LambdaLR

from lightning_speedups._errors import SpeedupConfigError, check_choice, check_int, check_range
from lightning_speedups.optim.config import LR_SCALING_RULES, scale_lr
from lightning_speedups.optim.wsd import WSDFactor, check_decay_fraction

__all__ = ["DECAYS", "FastScheduleFactor", "check_warmup", "create_fast_schedule", "peak_lr", "warmup_steps"]

# "wsd": constant after the warm-up, then a linear cool-down over the last `decay_fraction` of the run
DECAYS = ("linear", "cosine", "constant", "wsd")


def check_warmup(warmup: float) -> float:
    """Raise unless ``warmup`` is an int >= 0 (steps) or a float in ``[0, 1)`` (fraction of the run)."""
    ok_int = isinstance(warmup, int) and not isinstance(warmup, bool) and warmup >= 0
    ok_frac = isinstance(warmup, float) and 0.0 <= warmup < 1.0
    if not (ok_int or ok_frac):
        raise SpeedupConfigError(
            f"`warmup`={warmup!r} is out of range. Allowed values: an int >= 0 (steps) or a float in [0, 1) "
            "(fraction of the run)."
        )
    return warmup


def warmup_steps(warmup: float, total_steps: int) -> int:
    """The warm-up in steps: ``warmup`` itself, or ``round(warmup * total_steps)`` for a fraction.

    Raises:
        SpeedupConfigError: the warm-up does not leave at least one step of decay.
    """
    steps = int(round(warmup * total_steps)) if isinstance(warmup, float) else int(warmup)
    if steps >= total_steps:
        raise SpeedupConfigError(
            f"`warmup`={warmup!r} ({steps} steps) is longer than training ({total_steps} steps). Allowed values: "
            "fewer steps than the run. HINT: pass a fraction such as warmup=0.05, or train longer."
        )
    return steps


class FastScheduleFactor:
    """``LambdaLR`` factor: linear warm-up over ``warmup`` steps to 1, then decay to ``final_ratio`` at ``total``.

    Example::

        >>> f = FastScheduleFactor(total=10, warmup=1, decay="linear")
        >>> [round(f(s), 3) for s in (0, 1, 5, 9, 10)]
        [0.5, 1.0, 0.556, 0.111, 0.0]
    """

    def __init__(self, total: int, warmup: int, decay: str = "linear", final_ratio: float = 0.0) -> None:
        self.total = total
        self.warmup = warmup
        self.decay = decay
        self.final_ratio = final_ratio

    def stretch(self, total: int) -> None:
        """Plan the run for ``total`` steps (the decay ends there), as :meth:`WSDFactor.stretch` does."""
        self.total = total

    def __call__(self, step: int) -> float:
        if step < self.warmup:
            return (step + 1) / (self.warmup + 1)  # never 0: the first step already learns
        progress = min(1.0, (step - self.warmup) / max(1, self.total - self.warmup))
        if self.decay == "linear":
            shape = 1.0 - progress
        elif self.decay == "cosine":
            shape = 0.5 * (1.0 + math.cos(math.pi * progress))
        else:
            shape = 1.0
        return self.final_ratio + (1.0 - self.final_ratio) * shape


def peak_lr(
    lr: float,
    peak_factor: float = 3.0,
    batch_size: int | None = None,
    base_batch_size: int | None = None,
    lr_scaling: str | None = "sqrt",
) -> float:
    """``lr * peak_factor``, scaled from ``base_batch_size`` to ``batch_size`` by ``lr_scaling`` when both are given.

    Example::

        >>> peak_lr(1e-3, 3.0, batch_size=256, base_batch_size=64, lr_scaling="sqrt")
        0.006
    """
    check_range("peak_factor", peak_factor, 0.0, None, low_inclusive=False, hint="2-5 for Adam at its usual 1e-3.")
    peak = lr * peak_factor
    if batch_size is not None and base_batch_size is not None:
        peak = scale_lr(peak, batch_size, base_batch_size, lr_scaling)
    return peak


def create_fast_schedule(
    optimizer: torch.optim.Optimizer,
    total_steps: int,
    warmup: float = 0.05,
    peak_factor: float = 3.0,
    batch_size: int | None = None,
    base_batch_size: int | None = None,
    lr_scaling: str | None = "sqrt",
    decay: str = "linear",
    final_lr_ratio: float = 0.0,
    decay_fraction: float = 0.2,
) -> LambdaLR:
    """Raise every param group's lr to its peak (:func:`peak_lr`) and return the ``LambdaLR`` that schedules it.

    Step the scheduler after every optimizer step (Lightning: ``interval="step"``).

    Args:
        optimizer: its groups' current ``lr`` are the base the peak is computed from (set once, in place).
        total_steps: optimizer steps in the run.
        warmup: steps (int) or a fraction of ``total_steps`` (float in ``[0, 1)``).
        peak_factor: peak = ``peak_factor`` x each group's lr (before batch scaling).
        batch_size: the effective batch size of the run (batch x devices x accumulation).
        base_batch_size: the batch size the optimizer's lr was tuned for; with ``batch_size`` the peak is scaled.
        lr_scaling: ``"sqrt"`` (Adam-type optimizers), ``"linear"`` (SGD) or ``None``.
        decay: ``"linear"`` (to ``final_lr_ratio``), ``"cosine"`` or ``"constant"`` after the warm-up, or ``"wsd"``
            (constant, then a linear cool-down over the last ``decay_fraction`` of the run; see
            :mod:`lightning_speedups.optim.wsd`: a cool-down can start from any step with ``cool_down``).
        final_lr_ratio: the lr at the end, as a fraction of the peak, in ``[0, 1]``.
        decay_fraction: ``"wsd"`` only: the share of the run spent cooling down, in ``(0, 1)``.

    Raises:
        SpeedupConfigError: any argument out of range; ``batch_size`` without ``base_batch_size`` or the reverse.

    Example::

        >>> opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
        >>> sched = create_fast_schedule(opt, total_steps=100, warmup=0.1, peak_factor=2.0)
        >>> round(opt.param_groups[0]["lr"], 4), sched.base_lrs
        (0.0182, [0.2])
    """
    check_int("total_steps", total_steps, 1)
    check_warmup(warmup)
    check_choice("decay", decay, DECAYS)
    check_choice("lr_scaling", lr_scaling, (*LR_SCALING_RULES, None))
    check_range("final_lr_ratio", final_lr_ratio, 0.0, 1.0)
    check_decay_fraction(decay_fraction)
    if (batch_size is None) != (base_batch_size is None):
        raise SpeedupConfigError(
            f"`batch_size`={batch_size!r} and `base_batch_size`={base_batch_size!r} must be given together. "
            "Allowed values: both (scale the peak with the batch size) or neither."
        )
    steps = warmup_steps(warmup, total_steps)
    for group in optimizer.param_groups:
        group["lr"] = peak_lr(group["lr"], peak_factor, batch_size, base_batch_size, lr_scaling)
        group["initial_lr"] = group["lr"]  # LambdaLR's base: the peak
    factor: FastScheduleFactor | WSDFactor
    if decay == "wsd":
        factor = WSDFactor(total_steps, steps, decay_fraction, "linear", final_lr_ratio)
    else:
        factor = FastScheduleFactor(total_steps, steps, decay, final_lr_ratio)
    return LambdaLR(optimizer, [factor] * len(optimizer.param_groups))
