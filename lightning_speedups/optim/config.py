"""``OptimizerConfig`` / ``SchedulerConfig``: small validated dataclasses that round-trip through YAML and hparams."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from lightning_speedups._errors import SpeedupConfigError, check_choice, check_int, check_range
from lightning_speedups.optim.wsd import DECAY_SHAPES, check_decay_fraction

__all__ = ["OptimizerConfig", "SchedulerConfig", "scale_lr", "as_optimizer_config", "as_scheduler_config"]

LR_SCALING_RULES = ("linear", "sqrt")
IMPLEMENTATIONS = ("auto", "fused", "foreach", "for_loop")
INTERVALS = ("step", "epoch")


def scale_lr(lr: float, batch_size: int, base_batch_size: int, rule: str | None) -> float:
    """Scale a learning rate tuned at ``base_batch_size`` to ``batch_size`` (Goyal et al. 2017).

    Args:
        lr: learning rate that works at ``base_batch_size``.
        batch_size: the new (global, effective) batch size.
        base_batch_size: the batch size ``lr`` was tuned for.
        rule: ``"linear"`` (lr * k), ``"sqrt"`` (lr * sqrt(k)), or ``None`` (unchanged), with k = batch / base.

    Returns:
        The scaled learning rate.

    Raises:
        SpeedupConfigError: non-positive sizes or learning rate, or an unknown rule.

    Example::

        >>> scale_lr(0.1, batch_size=512, base_batch_size=256, rule="linear")
        0.2
        >>> scale_lr(0.1, batch_size=1024, base_batch_size=256, rule="sqrt")
        0.2
    """
    check_range("lr", lr, 0, None, low_inclusive=False)
    check_choice("rule", rule, (*LR_SCALING_RULES, None))
    check_int("batch_size", batch_size, 1)
    check_int("base_batch_size", base_batch_size, 1)
    if rule is None:
        return lr
    k = batch_size / base_batch_size
    return lr * k if rule == "linear" else lr * math.sqrt(k)


# The registries sit one level up (optimizers.py / schedulers.py import this module, never the reverse). Each installs
# its check of names and per-entry fields here when imported, so a config naming an unknown optimizer still fails at
# construction, before any Trainer exists (e.g. while LightningCLI parses YAML); the factories run the same checks.
_REGISTRY_CHECKS: dict[type, Callable[[Any], Any]] = {}


def set_registry_check(config_cls: type, check: Callable[[Any], Any]) -> None:
    """Install ``check(config)``, run at the end of every ``config_cls.__post_init__`` (by the registry modules)."""
    _REGISTRY_CHECKS[config_cls] = check


def _registry_check(config: Any) -> None:
    for cls in type(config).__mro__:
        if cls in _REGISTRY_CHECKS:
            _REGISTRY_CHECKS[cls](config)
            return


@dataclass
class OptimizerConfig:
    """Which optimizer to build and how to group the parameters.

    Args:
        name: a registered optimizer (see :func:`list_optimizers`): ``sgd``, ``adam``, ``adamw``, ``adagrad``,
            ``rmsprop``, ...
        lr: base learning rate (before ``lr_multipliers`` and ``lr_scaling``).
        weight_decay: L2 / decoupled weight decay (``adamw``) for the decayed group.
        momentum: SGD / RMSprop momentum; ``None`` uses the registry default (0.9 for ``sgd``). Adam-type
            optimizers take ``betas`` instead.
        betas: Adam-type ``(beta1, beta2)``; ``None`` uses torch's default.
        nesterov: Nesterov momentum (``sgd`` only, needs momentum > 0).
        eps: numerical epsilon; ``None`` uses torch's default.
        no_decay_norm_and_bias: put biases, normalisation weights and every 1-D parameter in a ``*/no_decay``
            group with ``weight_decay=0``.
        lr_multipliers: ``{module-name prefix: factor}``; the longest matching prefix wins, e.g.
            ``{"backbone": 0.1}`` for discriminative fine-tuning.
        lr_scaling: ``"linear"`` | ``"sqrt"`` | ``None``: scale ``lr`` from ``base_batch_size`` to the run's
            effective batch size (batch size x devices x gradient accumulation).
        base_batch_size: the batch size ``lr`` was tuned for (needed with ``lr_scaling``).
        implementation: ``"auto"`` (fused kernel where the optimizer and device support it, CPU included, else
            torch's default),
            ``"fused"``, ``"foreach"`` or ``"for_loop"``.
        kwargs: extra keyword arguments passed to the optimizer constructor.

    Example::

        >>> OptimizerConfig("sgd", lr=0.1, weight_decay=5e-4, nesterov=True).momentum is None
        True
    """

    name: str = "adam"
    lr: float = 1e-3
    weight_decay: float = 0.0
    momentum: float | None = None
    betas: tuple[float, float] | None = None
    nesterov: bool = False
    eps: float | None = None
    no_decay_norm_and_bias: bool = True
    lr_multipliers: dict[str, float] = field(default_factory=dict)
    lr_scaling: str | None = None
    base_batch_size: int | None = None
    implementation: str = "auto"
    kwargs: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_range("lr", self.lr, 0, None, low_inclusive=False, hint="learning rates must be > 0.")
        check_range("weight_decay", self.weight_decay, 0, None)
        if self.momentum is not None:
            check_range("momentum", self.momentum, 0, 1, high_inclusive=False)
        if self.betas is not None:
            betas = tuple(self.betas)
            if len(betas) != 2 or not all(isinstance(b, (int, float)) and 0 <= b < 1 for b in betas):
                raise SpeedupConfigError(
                    f"`betas`={self.betas!r} is out of range. Allowed values: two numbers in [0, 1), e.g. (0.9, 0.999)."
                )
            self.betas = (float(betas[0]), float(betas[1]))
        if self.eps is not None:
            check_range("eps", self.eps, 0, None, low_inclusive=False)
        if not isinstance(self.lr_multipliers, Mapping):
            raise SpeedupConfigError(
                f"`lr_multipliers`={self.lr_multipliers!r} is not supported. Allowed values: a dict of module-name "
                "prefix -> factor."
            )
        self.lr_multipliers = dict(self.lr_multipliers)
        for prefix, mult in self.lr_multipliers.items():
            if not isinstance(prefix, str) or not prefix:
                raise SpeedupConfigError(
                    f"`lr_multipliers` key {prefix!r} is not supported. Allowed values: a non-empty module-name prefix."
                )
            check_range(
                f"lr_multipliers[{prefix!r}]",
                mult,
                0,
                None,
                low_inclusive=False,
                hint="to freeze a module set `requires_grad=False` on its parameters instead of a 0 multiplier.",
            )
        check_choice("lr_scaling", self.lr_scaling, (*LR_SCALING_RULES, None))
        if self.lr_scaling is not None and self.base_batch_size is None:
            raise SpeedupConfigError(
                f"`lr_scaling`={self.lr_scaling!r} needs `base_batch_size` (the batch size `lr` was tuned for). "
                "Allowed values: lr_scaling=None, or pass `base_batch_size`."
            )
        check_int("base_batch_size", self.base_batch_size, 1, optional=True)
        check_choice("implementation", self.implementation, IMPLEMENTATIONS)
        if not isinstance(self.kwargs, Mapping):
            raise SpeedupConfigError(
                f"`kwargs`={self.kwargs!r} is not supported. Allowed values: a dict of optimizer keyword arguments."
            )
        self.kwargs = dict(self.kwargs)
        _registry_check(self)  # name and per-optimizer fields (momentum / betas / nesterov), from the registry


@dataclass
class SchedulerConfig:
    """Which LR scheduler to build, how often to step it, and its knobs (each entry uses the fields it needs).

    Args:
        name: a registered scheduler (see :func:`list_schedulers`).
        interval: ``"step"`` or ``"epoch"``; ``None`` uses the entry's default (per-step for cosine / onecycle /
            warmup schedules, per-epoch for step / multistep / exponential / plateau).
        frequency: step the scheduler every ``frequency`` intervals.
        monitor: metric for ``plateau`` (e.g. ``"val_loss"``).
        mode: ``"min"`` or ``"max"`` for ``plateau``.
        warmup: warm-up length, in intervals (int >= 1) or as a fraction of the run (float in (0, 1)); used by
            ``linear_warmup_cosine`` and ``constant_with_warmup``.
        min_lr: the floor of the cosine schedules and of ``plateau``.
        gamma: decay factor of ``step`` / ``multistep`` (default 0.1) and ``exponential`` (default 0.95).
        step_size: intervals between decays for ``step``.
        milestones: interval indices of the decays for ``multistep``.
        t_0: intervals of the first cycle of ``cosine_restarts``; ``None`` = a quarter of the run.
        t_mult: cycle-length multiplier of ``cosine_restarts``.
        max_lr: peak of ``onecycle``; ``None`` uses the optimizer's lr (x each group's ``lr_mult``).
        pct_start: fraction of ``onecycle`` spent increasing the lr.
        factor: ``plateau`` multiplies the lr by this after ``patience`` intervals without improvement.
        patience: see ``factor``.
        decay_fraction: ``wsd``: the share of the run spent cooling down at its end, in ``(0, 1)``.
        decay_shape: ``wsd``: the cool-down's shape, ``"linear"``, ``"1-sqrt"`` or ``"cosine"``.
        total_steps: override the run length (otherwise ``trainer.estimated_stepping_batches`` for per-step
            schedules, ``trainer.max_epochs`` for per-epoch ones).
        kwargs: extra keyword arguments passed to the torch scheduler.

    Example::

        >>> SchedulerConfig("linear_warmup_cosine", warmup=0.1).interval is None
        True
    """

    name: str = "constant"
    interval: str | None = None
    frequency: int = 1
    monitor: str | None = None
    mode: str = "min"
    warmup: float = 0
    min_lr: float = 0.0
    gamma: float | None = None
    step_size: int = 1
    milestones: list[int] | None = None
    t_0: int | None = None
    t_mult: int = 1
    max_lr: float | None = None
    pct_start: float = 0.3
    factor: float = 0.1
    patience: int = 10
    decay_fraction: float = 0.2
    decay_shape: str = "linear"
    total_steps: int | None = None
    kwargs: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_choice("interval", self.interval, (*INTERVALS, None))
        check_decay_fraction(self.decay_fraction)
        check_choice("decay_shape", self.decay_shape, DECAY_SHAPES)
        check_int("frequency", self.frequency, 1)
        check_choice("mode", self.mode, ("min", "max"))
        w = self.warmup
        if isinstance(w, float) and w >= 1 and w.is_integer():
            w = self.warmup = int(w)  # YAML may give 5.0
        ints_ok = isinstance(w, int) and not isinstance(w, bool) and w >= 0
        if not (ints_ok or (isinstance(w, float) and 0 <= w < 1)):
            raise SpeedupConfigError(
                f"`warmup`={w!r} is out of range. Allowed values: an int >= 0 (intervals) or a float in [0, 1) "
                "(fraction of the run)."
            )
        check_range("min_lr", self.min_lr, 0, None)
        if self.gamma is not None:
            check_range("gamma", self.gamma, 0, 1, low_inclusive=False)
        check_int("step_size", self.step_size, 1)
        if self.milestones is not None:
            ms = list(self.milestones)
            if not ms or not all(isinstance(m, int) and m >= 1 for m in ms) or ms != sorted(set(ms)):
                raise SpeedupConfigError(
                    f"`milestones`={self.milestones!r} is not supported. Allowed values: a non-empty, strictly "
                    "increasing list of integers >= 1."
                )
            self.milestones = ms
        if self.t_0 is not None:
            check_int("t_0", self.t_0, 1)
        check_int("t_mult", self.t_mult, 1)
        if self.max_lr is not None:
            check_range("max_lr", self.max_lr, 0, None, low_inclusive=False)
        check_range("pct_start", self.pct_start, 0, 1, low_inclusive=False, high_inclusive=False)
        check_range("factor", self.factor, 0, 1, low_inclusive=False, high_inclusive=False)
        check_int("patience", self.patience, 0)
        if self.total_steps is not None:
            check_int("total_steps", self.total_steps, 1)
            self.check_warmup(self.total_steps)
        if not isinstance(self.kwargs, Mapping):
            raise SpeedupConfigError(
                f"`kwargs`={self.kwargs!r} is not supported. Allowed values: a dict of scheduler keyword arguments."
            )
        self.kwargs = dict(self.kwargs)
        _registry_check(self)  # name and what the entry needs (e.g. `monitor` for plateau), from the registry

    def warmup_steps(self, total: int | None) -> int:
        """The warm-up length in intervals, resolving a fraction against ``total``."""
        if isinstance(self.warmup, float) and self.warmup < 1:
            if total is None:
                return 0
            return int(round(self.warmup * total))
        return int(self.warmup)

    def check_warmup(self, total: int) -> None:
        """Raise if the warm-up does not fit in a run of ``total`` intervals."""
        steps = self.warmup_steps(total)
        if steps and steps >= total:
            raise SpeedupConfigError(
                f"`warmup`={self.warmup!r} ({steps} intervals) is longer than training ({total} intervals). "
                f"Allowed values: fewer than {total} intervals. HINT: pass a fraction such as warmup=0.1, or train "
                "longer."
            )


def _from_mapping(cls: type, value: Mapping[str, Any], arg: str) -> Any:
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = [k for k in value if k not in names]
    if unknown:
        raise SpeedupConfigError(
            f"`{arg}` has unknown keys {unknown}. Allowed values: {', '.join(repr(n) for n in names)}."
        )
    return cls(**value)


def as_optimizer_config(value: OptimizerConfig | Mapping[str, Any] | None) -> OptimizerConfig:
    """Coerce a config given as dataclass, dict (YAML / hparams) or ``None`` (Adam, lr 1e-3) to OptimizerConfig."""
    if value is None:
        return OptimizerConfig()
    if isinstance(value, OptimizerConfig):
        return value
    if isinstance(value, Mapping):
        return _from_mapping(OptimizerConfig, value, "optimizer_config")
    if isinstance(value, str):
        return OptimizerConfig(name=value)
    raise SpeedupConfigError(
        f"`optimizer_config`={value!r} is not supported. Allowed values: an OptimizerConfig, a dict of its fields, an "
        "optimizer name or None."
    )


def as_scheduler_config(value: SchedulerConfig | Mapping[str, Any] | str | None) -> SchedulerConfig | None:
    """Coerce a scheduler config given as dataclass, dict, name or ``None`` (no scheduler: constant lr)."""
    if value is None or isinstance(value, SchedulerConfig):
        return value
    if isinstance(value, Mapping):
        return _from_mapping(SchedulerConfig, value, "scheduler_config")
    if isinstance(value, str):
        return SchedulerConfig(name=value)
    raise SpeedupConfigError(
        f"`scheduler_config`={value!r} is not supported. Allowed values: a SchedulerConfig, a dict of its fields, a "
        "scheduler name or None."
    )


# checkpoints store hparams; let `torch.load(weights_only=True)` (Lightning's default) read these configs back
if hasattr(torch.serialization, "add_safe_globals"):
    torch.serialization.add_safe_globals([OptimizerConfig, SchedulerConfig])
