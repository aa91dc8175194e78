"""The learning rate that goes with a new batch size: which rule fits an optimizer, and scaling a live one.

When a batch grows ``k`` times, SGD keeps its per-sample trajectory with ``k`` times the lr (the linear rule, Goyal et
al. 2017) and Adam-type optimizers, whose update is normalised by the gradient's running scale, with ``sqrt(k)``
times the lr (the square-root rule, Malladi et al. 2022, "On the SDEs and Scaling Rules for Adaptive Gradient
Algorithms"). :func:`auto_lr_rule` reads which one fits an optimizer; :func:`scale_optimizer_lrs` multiplies an
optimizer's learning rates and its schedulers' with them, so a schedule goes on from the scaled values (and a
checkpoint holds them: a resumed run must not scale again).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch

from lightning_speedups._compat import inner_schedulers, refresh_scheduler_last_lr
from lightning_speedups.optim.optimizers import get_optimizer_info

__all__ = [
    "ADAPTIVE_OPTIMIZERS",
    "LR_SCALING",
    "RATE_KEYS",
    "auto_lr_rule",
    "auto_lr_rule_for_name",
    "lr_factor",
    "resolve_rule",
    "rule_words",
    "scale_optimizer_lrs",
]

LR_SCALING = ("auto", "linear", "sqrt", None)

# optimizers that normalise the update by a running scale of the gradient: the square-root rule
ADAPTIVE_OPTIMIZERS: tuple[type[torch.optim.Optimizer], ...] = (
    torch.optim.Adam,
    torch.optim.AdamW,
    torch.optim.NAdam,
    torch.optim.RAdam,
    torch.optim.Adamax,
    torch.optim.Adagrad,
    torch.optim.Adadelta,
    torch.optim.RMSprop,
    torch.optim.Rprop,
    torch.optim.SparseAdam,
)
# adaptive optimizers outside torch.optim, by class name: the Muon / AdamW hybrid normalises its updates too
_ADAPTIVE_NAMES = ("MuonWithAdamW", "Muon")
# the per-optimizer keys of a param group that hold learning rates (OneCycleLR keeps its peak and floor there)
# the learning rates a param group holds (its own, and those schedulers keep there)
RATE_KEYS = ("lr", "initial_lr", "max_lr", "min_lr")
# a scheduler's own learning rates: its bases, CyclicLR's peaks, ReduceLROnPlateau's floors, the cosine floor
_SCHEDULER_LISTS = ("base_lrs", "max_lrs", "min_lrs")
_SCHEDULER_FLOATS = ("eta_min",)


def auto_lr_rule(optimizer: torch.optim.Optimizer) -> str | None:
    """The rule ``lr_scaling="auto"`` applies to ``optimizer``: ``"linear"`` for SGD (with momentum or not, and any
    optimizer class named ``*SGD*``), ``"sqrt"`` for Adam-type and other adaptive optimizers (Adam, AdamW, NAdam,
    RAdam, Adamax, Adagrad, Adadelta, RMSprop, Rprop, any optimizer with ``betas`` in its defaults, and
    :class:`~lightning_speedups.optim.MuonWithAdamW`), ``None`` (the lr is kept) for anything else (LBFGS, an unknown
    class): no rule is known to fit it.

    Example::

        >>> params = [torch.nn.Parameter(torch.zeros(1))]
        >>> auto_lr_rule(torch.optim.SGD(params, lr=0.1)), auto_lr_rule(torch.optim.AdamW(params))
        ('linear', 'sqrt')
        >>> auto_lr_rule(torch.optim.LBFGS(params)) is None
        True
    """
    name = type(optimizer).__name__
    if isinstance(optimizer, torch.optim.SGD) or "SGD" in name:
        return "linear"
    defaults = getattr(optimizer, "defaults", {})
    if isinstance(optimizer, ADAPTIVE_OPTIMIZERS) or name in _ADAPTIVE_NAMES or "betas" in defaults:
        return "sqrt"
    return None


def auto_lr_rule_for_name(name: str) -> str | None:
    """:func:`auto_lr_rule` for a registered optimizer name (:func:`~lightning_speedups.optim.list_optimizers`), as a
    :class:`~lightning_speedups.optim.SpeedupMixin` builds it: by the registered class, else (a factory) ``"linear"``
    for a name with ``sgd`` and ``"sqrt"`` for one that takes ``betas``.

    Example::

        >>> auto_lr_rule_for_name("sgd"), auto_lr_rule_for_name("adamw"), auto_lr_rule_for_name("muon")
        ('linear', 'sqrt', 'sqrt')
    """
    info = get_optimizer_info(name)
    cls = info.factory if isinstance(info.factory, type) else None
    if (cls is not None and issubclass(cls, torch.optim.SGD)) or "sgd" in name.lower():
        return "linear"
    if (cls is not None and issubclass(cls, ADAPTIVE_OPTIMIZERS)) or info.betas:
        return "sqrt"
    return None


def resolve_rule(lr_scaling: str | None, optimizer: torch.optim.Optimizer) -> str | None:
    """``lr_scaling`` itself, or with ``"auto"`` the rule :func:`auto_lr_rule` reads off ``optimizer``.

    Example::

        >>> opt = torch.optim.Adam([torch.nn.Parameter(torch.zeros(1))])
        >>> resolve_rule("auto", opt), resolve_rule("linear", opt), resolve_rule(None, opt)
        ('sqrt', 'linear', None)
    """
    return auto_lr_rule(optimizer) if lr_scaling == "auto" else lr_scaling


def lr_factor(batch_size: int, base_batch_size: int, rule: str | None) -> float:
    """The lr multiplier of a change from ``base_batch_size`` to ``batch_size`` by ``rule``.

    Example::

        >>> lr_factor(64, 16, "linear"), lr_factor(64, 16, "sqrt"), lr_factor(64, 16, None)
        (4.0, 2.0, 1.0)
    """
    if rule is None or batch_size == base_batch_size:
        return 1.0
    k = batch_size / base_batch_size
    return k if rule == "linear" else math.sqrt(k)


def rule_words(lr_scaling: str | None, optimizer: torch.optim.Optimizer, rule: str | None) -> str:
    """Why ``rule`` applies to ``optimizer`` (``rule`` resolved from ``lr_scaling``), for a summary.

    Example::

        >>> opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))])
        >>> rule_words("auto", opt, "sqrt")
        'sqrt rule (AdamW: Adam-type)'
    """
    name = type(optimizer).__name__
    if rule is None:
        if lr_scaling is None:
            return "not scaled (`lr_scaling`=None)"
        return f"not scaled: no rule is known for {name} (pass `lr_scaling`='sqrt' or 'linear')"
    if lr_scaling != "auto":
        return f"{rule} rule (`lr_scaling`={lr_scaling!r}, {name})"
    kind = "SGD" if rule == "linear" else "Adam-type"
    return f"{rule} rule ({name}: {kind})"


def scale_optimizer_lrs(optimizer: torch.optim.Optimizer, schedulers: Iterable[Any], factor: float) -> None:
    """Multiply every learning rate that drives ``optimizer`` by ``factor``: each param group's ``lr`` (and the
    ``initial_lr``, ``max_lr``, ``min_lr`` a scheduler keeps there), and of each scheduler in ``schedulers`` that
    steps it (those of other optimizers are skipped) its ``base_lrs``, ``max_lrs`` (CyclicLR), ``min_lrs``
    (ReduceLROnPlateau) and ``eta_min`` (the cosine schedules), inner schedulers of a ``SequentialLR`` or
    ``ChainedScheduler`` included. The schedule then runs on as ``factor`` times the one it was.

    Example::

        >>> opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
        >>> sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=10, eta_min=0.01)
        >>> scale_optimizer_lrs(opt, [sched], 2.0)
        >>> round(opt.param_groups[0]["lr"], 6), sched.base_lrs, round(sched.eta_min, 6)
        (0.2, [0.2], 0.02)
    """
    if factor == 1.0:
        return
    for group in optimizer.param_groups:
        for key in RATE_KEYS:
            value = group.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                group[key] = value * factor
    for scheduler in schedulers:
        if getattr(scheduler, "optimizer", None) is optimizer:
            _scale_scheduler(scheduler, factor)


def _scale_scheduler(scheduler: Any, factor: float) -> None:
    for inner in inner_schedulers(scheduler):
        _scale_scheduler(inner, factor)
    for name in _SCHEDULER_LISTS:
        values = getattr(scheduler, name, None)
        if isinstance(values, list):
            setattr(scheduler, name, [v * factor for v in values])
    for name in _SCHEDULER_FLOATS:
        value = getattr(scheduler, name, None)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            setattr(scheduler, name, value * factor)
    refresh_scheduler_last_lr(scheduler)
