"""Warm-up, stable, decay (WSD): a constant learning rate for most of the run and a short cool-down at its end.

A cosine schedule ties every step to the run's length: stop it early and the weights never settled. WSD holds the
peak learning rate and decays only over the last ``decay_fraction`` of the steps (the MiniCPM report; Hägele et al.
2024, "Scaling laws and compute-optimal training beyond fixed training durations": a 10-20% cool-down matches cosine).
Because the stable phase does not depend on where the run ends, a cool-down can start from *any* step of it
(:func:`cool_down`) and give about the result a run planned to end there would have reached. That makes a shorter
run, an early stop or a fair comparison of two candidates at equal time cheap: cool each one down, then compare.

:class:`WSDFactor` is a ``LambdaLR`` factor object (not a lambda), so ``LambdaLR.state_dict()`` saves it (the cool-down
moved by :func:`cool_down` included) and a resumed run continues the same curve.
"""

from __future__ import annotations

import math

import torch

from lightning_speedups._errors import SpeedupConfigError, check_choice, check_int, check_range

__all__ = ["DECAY_SHAPES", "WSDFactor", "check_decay_fraction", "cool_down"]

# "1-sqrt": lr x (1 - sqrt(progress)), the cool-down Hägele et al. found best; "linear" and "cosine" for comparison
DECAY_SHAPES = ("linear", "1-sqrt", "cosine")


def check_decay_fraction(decay_fraction: float) -> float:
    """Raise unless ``decay_fraction`` is a number in the open interval ``(0, 1)``."""
    return check_range(
        "decay_fraction",
        decay_fraction,
        0.0,
        1.0,
        low_inclusive=False,
        high_inclusive=False,
        hint="0.1-0.2 (the last 10-20% of the steps) matches a cosine schedule.",
    )


class WSDFactor:
    """``LambdaLR`` factor: linear warm-up over ``warmup`` steps, 1 until the cool-down, then down to ``final_ratio``.

    Args:
        total: optimizer steps in the run.
        warmup: warm-up steps.
        decay_fraction: the share of ``total`` spent cooling down (the last steps), in ``(0, 1)``.
        shape: ``"linear"``, ``"1-sqrt"`` or ``"cosine"``.
        final_ratio: the factor at ``total``, in ``[0, 1]``.

    Attributes:
        decay_start: the first step of the cool-down (``total`` minus the decay steps, or where :func:`cool_down`
            moved it).

    Example::

        >>> f = WSDFactor(total=10, warmup=1, decay_fraction=0.2)
        >>> [round(f(s), 2) for s in (0, 1, 7, 8, 9, 10)]
        [0.5, 1.0, 1.0, 0.67, 0.33, 0.0]
    """

    def __init__(
        self, total: int, warmup: int, decay_fraction: float = 0.2, shape: str = "linear", final_ratio: float = 0.0
    ) -> None:
        check_int("total", total, 1)
        check_int("warmup", warmup, 0)
        check_decay_fraction(decay_fraction)
        check_choice("shape", shape, DECAY_SHAPES)
        check_range("final_ratio", final_ratio, 0.0, 1.0)
        self.total = total
        self.warmup = warmup
        self.decay_fraction = decay_fraction
        self.shape = shape
        self.final_ratio = final_ratio
        self.decay_start = max(warmup, total - max(1, round(decay_fraction * total)))

    def stretch(self, total: int) -> None:
        """Plan the run for ``total`` steps: the cool-down moves to its last ``decay_fraction``."""
        check_int("total", total, 1)
        self.total = total
        self.decay_start = max(self.warmup, total - max(1, round(self.decay_fraction * total)))

    def __call__(self, step: int) -> float:
        if step < self.warmup:
            return (step + 1) / (self.warmup + 1)  # never 0: the first step already learns
        if step < self.decay_start:
            return 1.0
        # the n cool-down steps run at n/(n+1) ... 1/(n+1) of the peak (linear): the last step still learns
        progress = min(1.0, (step - self.decay_start + 1) / (self.total - self.decay_start + 1))
        if self.shape == "linear":
            left = 1.0 - progress
        elif self.shape == "1-sqrt":
            left = 1.0 - math.sqrt(progress)
        else:
            left = 0.5 * (1.0 + math.cos(math.pi * progress))
        return self.final_ratio + (1.0 - self.final_ratio) * left


def cool_down(scheduler: torch.optim.lr_scheduler.LambdaLR, steps: int) -> int:
    """Start the cool-down of a WSD ``scheduler`` now and end its run ``steps`` optimizer steps from here.

    The stable phase does not depend on the run's length, so stopping after a cool-down from any of its steps ends
    about where a run planned that long would have ended. A cool-down already under way is shortened (never
    restarted from a higher lr).

    Args:
        scheduler: a ``LambdaLR`` whose factors are :class:`WSDFactor` (``SchedulerConfig("wsd")``,
            ``FastSchedule(decay="wsd")``).
        steps: optimizer steps the cool-down lasts (>= 1).

    Returns:
        The step at which the run now ends (the scheduler's step count + ``steps``).

    Raises:
        SpeedupConfigError: ``steps`` < 1, or a scheduler without WSD factors.

    Example::

        >>> opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
        >>> sched = torch.optim.lr_scheduler.LambdaLR(opt, WSDFactor(total=100, warmup=0))
        >>> for _ in range(30):
        ...     opt.step()
        ...     sched.step()
        >>> cool_down(sched, 10)
        40
        >>> for _ in range(9):
        ...     opt.step()
        ...     sched.step()
        >>> round(opt.param_groups[0]["lr"], 4)  # the last of the 10 cool-down steps: 1/11 of the peak
        0.0091
    """
    check_int("steps", steps, 1)
    factors = getattr(scheduler, "lr_lambdas", [])
    if not factors or not all(isinstance(f, WSDFactor) for f in factors):
        raise SpeedupConfigError(
            f"`scheduler`={type(scheduler).__name__} has no WSD schedule to cool down. Allowed values: the LambdaLR "
            "of SchedulerConfig('wsd') or FastSchedule(decay='wsd')."
        )
    now = scheduler.last_epoch
    for factor in factors:
        if now < factor.decay_start or now + steps < factor.total:
            factor.decay_start = min(factor.decay_start, now) if now >= factor.warmup else factor.warmup
            factor.total = now + steps
    for group, base, factor in zip(scheduler.optimizer.param_groups, scheduler.base_lrs, factors):
        group["lr"] = base * factor(now)
    return now + steps
