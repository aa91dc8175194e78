"""LR-scheduler registry and factory. Each entry knows its interval and whether it needs the run length or a metric."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch.optim import lr_scheduler as tls

from lightning_speedups._errors import SpeedupConfigError
from lightning_speedups.optim.config import SchedulerConfig, as_scheduler_config, set_registry_check
from lightning_speedups.optim.wsd import WSDFactor

if TYPE_CHECKING:
    import lightning as L

__all__ = [
    "SchedulerInfo",
    "register_scheduler",
    "list_schedulers",
    "get_scheduler_info",
    "check_scheduler_config",
    "create_scheduler",
    "lightning_scheduler_config",
    "resolve_total",
]

Scheduler = tls.LRScheduler | tls.ReduceLROnPlateau
Factory = Callable[[torch.optim.Optimizer, SchedulerConfig, "int | None"], Scheduler]


@dataclass(frozen=True)
class SchedulerInfo:
    """A registry entry.

    Args:
        name: registry key.
        factory: ``factory(optimizer, config, total) -> scheduler``; ``total`` is the run length in scheduler steps
            (``None`` when the entry does not need it).
        interval: default ``"step"`` or ``"epoch"``.
        needs_total_steps: ``True``/``False``, or ``f(config) -> bool`` when it depends on the config (e.g. a
            warm-up given as a fraction).
        needs_monitor: needs ``config.monitor`` (``ReduceLROnPlateau``).
        required: config fields that must be set for this entry.
        summary: one line for tables.
    """

    name: str
    factory: Factory
    interval: str = "step"
    needs_total_steps: bool | Callable[[SchedulerConfig], bool] = False
    needs_monitor: bool = False
    required: tuple[str, ...] = ()
    summary: str = ""

    def needs_total(self, config: SchedulerConfig) -> bool:
        """Whether building this scheduler with ``config`` needs the run length."""
        flag = self.needs_total_steps
        return bool(flag(config) if callable(flag) else flag)


_SCHEDULERS: dict[str, SchedulerInfo] = {}


def register_scheduler(info: SchedulerInfo) -> SchedulerInfo:
    """Add (or replace) a scheduler in the registry.

    Example::

        >>> info = SchedulerInfo("poly", lambda opt, cfg, total: tls.PolynomialLR(opt, total), needs_total_steps=True)
        >>> "poly" in list_schedulers(), register_scheduler(info).interval
        (False, 'step')
        >>> _ = _SCHEDULERS.pop("poly")
    """
    _SCHEDULERS[info.name] = info
    return info


def list_schedulers() -> list[str]:
    """Names of the registered schedulers."""
    return list(_SCHEDULERS)


def get_scheduler_info(name: str) -> SchedulerInfo:
    """Look a scheduler up by name; unknown names raise and list the valid ones."""
    if name not in _SCHEDULERS:
        raise SpeedupConfigError(
            f"`name`={name!r} is not a registered scheduler. Allowed values: {', '.join(map(repr, _SCHEDULERS))}."
            " HINT: add your own with register_scheduler(SchedulerInfo(...))."
        )
    return _SCHEDULERS[name]


def check_scheduler_config(config: SchedulerConfig) -> SchedulerInfo:
    """Check ``config`` against the registry: a registered name, and what the entry needs (``monitor``).

    Runs at the end of ``SchedulerConfig.__post_init__`` and again in :func:`create_scheduler`.

    Returns:
        The registry entry of ``config.name``.

    Raises:
        SpeedupConfigError: unknown name, or no ``monitor`` for an entry that watches a metric.
    """
    info = get_scheduler_info(config.name)
    if info.needs_monitor and not config.monitor:
        raise SpeedupConfigError(
            f"Scheduler {config.name!r} needs `monitor` (the metric it watches). Allowed values: a logged metric's "
            "name. HINT: e.g. SchedulerConfig('plateau', monitor='val_loss') and log that metric."
        )
    return info


set_registry_check(SchedulerConfig, check_scheduler_config)


class _Warmup:
    """LR factor: linear warm-up over ``warmup`` steps, then constant or cosine decay to ``floor`` at ``total``.

    A callable object (not a lambda) so ``LambdaLR.state_dict()`` saves it and resume restores it exactly.
    """

    def __init__(self, warmup: int, total: int | None, floor: float, cosine: bool) -> None:
        self.warmup = warmup
        self.total = total
        self.floor = floor
        self.cosine = cosine

    def __call__(self, step: int) -> float:
        if step < self.warmup:
            return (step + 1) / (self.warmup + 1)  # never 0: the first step already learns
        if not self.cosine or self.total is None:
            return 1.0
        progress = min(1.0, (step - self.warmup) / max(1, self.total - self.warmup))
        return self.floor + (1.0 - self.floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


def _floors(opt: torch.optim.Optimizer, min_lr: float) -> list[float]:
    # min_lr is absolute, LambdaLR multiplies each group's own lr: convert to a per-group ratio
    return [min(1.0, min_lr / g["lr"]) if g["lr"] > 0 else 0.0 for g in opt.param_groups]


def _warmup_factory(cosine: bool) -> Factory:
    def build(opt: torch.optim.Optimizer, cfg: SchedulerConfig, total: int | None) -> Scheduler:
        w = cfg.warmup_steps(total)
        fns = [_Warmup(w, total, f if cosine else 1.0, cosine) for f in _floors(opt, cfg.min_lr)]
        return tls.LambdaLR(opt, fns, **cfg.kwargs)  # type: ignore[arg-type]

    return build


def _wsd(opt: torch.optim.Optimizer, cfg: SchedulerConfig, total: int | None) -> Scheduler:
    assert total is not None  # wsd needs_total_steps: resolve_total ran first
    w = cfg.warmup_steps(total)
    fns = [WSDFactor(total, w, cfg.decay_fraction, cfg.decay_shape, floor) for floor in _floors(opt, cfg.min_lr)]
    return tls.LambdaLR(opt, fns, **cfg.kwargs)  # type: ignore[arg-type]


def _onecycle(opt: torch.optim.Optimizer, cfg: SchedulerConfig, total: int | None) -> Scheduler:
    assert total is not None  # onecycle needs_total_steps: resolve_total ran first
    if cfg.pct_start * total <= 1 or (1 - cfg.pct_start) * total < 1:  # torch divides by (pct_start * total - 1)
        raise SpeedupConfigError(
            f"`onecycle` over {total} step(s) with `pct_start`={cfg.pct_start} leaves no room for its warm-up and "
            "decay phases. Allowed values: pct_start * total_steps > 1 and (1 - pct_start) * total_steps >= 1. "
            "HINT: train for more steps or raise pct_start."
        )
    max_lrs = [(cfg.max_lr * g.get("lr_mult", 1.0)) if cfg.max_lr is not None else g["lr"] for g in opt.param_groups]
    kw: dict[str, Any] = {"cycle_momentum": "betas" in opt.defaults or bool(opt.defaults.get("momentum", 0))}
    kw.update(cfg.kwargs)
    return tls.OneCycleLR(opt, max_lr=max_lrs, total_steps=total, pct_start=cfg.pct_start, **kw)


def _multistep(opt: torch.optim.Optimizer, cfg: SchedulerConfig, total: int | None) -> Scheduler:
    milestones = cfg.milestones or [max(1, total * 1 // 2), max(2, total * 3 // 4)]  # type: ignore[operator]
    return tls.MultiStepLR(opt, milestones, gamma=cfg.gamma or 0.1, **cfg.kwargs)


def _restarts(opt: torch.optim.Optimizer, cfg: SchedulerConfig, total: int | None) -> Scheduler:
    t_0 = cfg.t_0 or max(1, (total or 4) // 4)
    return tls.CosineAnnealingWarmRestarts(opt, T_0=t_0, T_mult=cfg.t_mult, eta_min=cfg.min_lr, **cfg.kwargs)


def _plateau(opt: torch.optim.Optimizer, cfg: SchedulerConfig, total: int | None) -> Scheduler:
    return tls.ReduceLROnPlateau(
        opt, mode=cfg.mode, factor=cfg.factor, patience=cfg.patience, min_lr=cfg.min_lr, **cfg.kwargs
    )


def _fraction_warmup(cfg: SchedulerConfig) -> bool:
    return isinstance(cfg.warmup, float) and 0 < cfg.warmup < 1


for _info in (
    SchedulerInfo("constant", lambda o, c, t: tls.LambdaLR(o, lambda _: 1.0), summary="constant lr"),
    SchedulerInfo(
        "step",
        lambda o, c, t: tls.StepLR(o, c.step_size, gamma=c.gamma or 0.1, **c.kwargs),
        "epoch",
        summary="StepLR: x gamma every step_size epochs",
    ),
    SchedulerInfo(
        "multistep",
        _multistep,
        "epoch",
        needs_total_steps=lambda c: c.milestones is None,
        summary="MultiStepLR: x gamma at milestones (default 50% and 75% of the run)",
    ),
    SchedulerInfo(
        "exponential",
        lambda o, c, t: tls.ExponentialLR(o, c.gamma or 0.95, **c.kwargs),
        "epoch",
        summary="ExponentialLR: x gamma every epoch",
    ),
    SchedulerInfo(
        "cosine",
        lambda o, c, t: tls.CosineAnnealingLR(o, T_max=t, eta_min=c.min_lr, **c.kwargs),  # type: ignore
        needs_total_steps=True,
        summary="CosineAnnealingLR over the whole run",
    ),
    SchedulerInfo(
        "cosine_restarts",
        _restarts,
        needs_total_steps=lambda c: c.t_0 is None,
        summary="CosineAnnealingWarmRestarts (SGDR); t_0 defaults to a quarter of the run",
    ),
    SchedulerInfo("onecycle", _onecycle, needs_total_steps=True, summary="OneCycleLR (super-convergence)"),
    SchedulerInfo(
        "linear_warmup_cosine",
        _warmup_factory(cosine=True),
        needs_total_steps=True,
        summary="linear warm-up then cosine decay to min_lr",
    ),
    SchedulerInfo(
        "constant_with_warmup",
        _warmup_factory(cosine=False),
        needs_total_steps=_fraction_warmup,
        summary="linear warm-up then constant",
    ),
    SchedulerInfo(
        "wsd",
        _wsd,
        needs_total_steps=True,
        summary="warm-up, stable, then a cool-down over the last decay_fraction of the run (to min_lr)",
    ),
    SchedulerInfo("plateau", _plateau, "epoch", needs_monitor=True, summary="ReduceLROnPlateau on a monitored metric"),
):
    register_scheduler(_info)


def resolve_total(config: SchedulerConfig, trainer: L.Trainer | None, interval: str) -> int:
    """Run length in scheduler steps: ``config.total_steps``, else from the trainer, divided by ``frequency``.

    Raises:
        SpeedupConfigError: no trainer and no ``total_steps``, or an unbounded run.
    """
    if config.total_steps is not None:
        return config.total_steps
    if trainer is None:
        raise SpeedupConfigError(
            f"Scheduler {config.name!r} needs the run length. Allowed values: `trainer`= a Trainer, or "
            "SchedulerConfig(total_steps=...). HINT: pass `trainer=` to create_scheduler."
        )
    steps = trainer.estimated_stepping_batches
    if not math.isfinite(steps):
        raise SpeedupConfigError(
            f"Scheduler {config.name!r} needs the run length, but the Trainer is unbounded (max_epochs=-1 and no "
            "max_steps). Allowed values: a Trainer with max_steps or max_epochs, or SchedulerConfig(total_steps=...). "
            "HINT: set Trainer(max_steps=...)."
        )
    total = int(steps)
    if interval == "epoch":
        per_epoch = max(1, math.ceil(trainer.num_training_batches / max(1, trainer.accumulate_grad_batches)))
        total = math.ceil(total / per_epoch)
    return max(1, math.ceil(total / config.frequency))


def create_scheduler(
    optimizer: torch.optim.Optimizer,
    config: SchedulerConfig | Mapping[str, Any] | str | None,
    trainer: L.Trainer | None = None,
) -> Scheduler | None:
    """Build the scheduler described by ``config`` (``None`` -> no scheduler, constant lr).

    Args:
        optimizer: the optimizer to schedule.
        config: a :class:`SchedulerConfig`, a dict of its fields, a registry name, or ``None``.
        trainer: gives the run length (``estimated_stepping_batches``) to entries that need it.

    Returns:
        A torch scheduler; step it every ``config.interval`` (see :func:`lightning_scheduler_config`).

    Raises:
        SpeedupConfigError: unknown name, unbounded run, warm-up longer than the run.

    Example::

        >>> opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
        >>> sched = create_scheduler(opt, SchedulerConfig("cosine", total_steps=10))
        >>> type(sched).__name__
        'CosineAnnealingLR'
    """
    cfg = as_scheduler_config(config)
    if cfg is None:
        return None
    info = check_scheduler_config(cfg)
    for name in info.required:
        if getattr(cfg, name) is None:
            raise SpeedupConfigError(
                f"Scheduler {cfg.name!r} needs `{name}`. Allowed values: SchedulerConfig({cfg.name!r}, {name}=...)."
            )
    interval = cfg.interval or info.interval
    total = None
    if info.needs_total(cfg) or cfg.total_steps:
        total = resolve_total(cfg, trainer, interval)
    elif cfg.warmup and trainer is not None:
        try:  # only to check that an int warm-up fits in a bounded run
            total = resolve_total(cfg, trainer, interval)
        except SpeedupConfigError:
            total = None
    if total is not None:
        cfg.check_warmup(total)
    try:
        return info.factory(optimizer, cfg, total)
    except (TypeError, ValueError) as err:
        raise SpeedupConfigError(
            f"Scheduler {cfg.name!r} rejected its arguments: {err}. Allowed values: the keyword arguments its torch "
            "scheduler takes."
        ) from err


def lightning_scheduler_config(
    scheduler: Scheduler, config: SchedulerConfig | Mapping[str, Any] | str
) -> dict[str, Any]:
    """The ``lr_scheduler`` dict Lightning expects from ``configure_optimizers`` (interval, frequency, monitor)."""
    cfg = as_scheduler_config(config)
    if cfg is None:
        raise SpeedupConfigError(
            "`config`=None describes no scheduler. Allowed values: a SchedulerConfig, a dict of its fields or a "
            "scheduler name."
        )
    info = get_scheduler_info(cfg.name)
    interval = cfg.interval or info.interval
    out: dict[str, Any] = {"scheduler": scheduler, "interval": interval, "frequency": cfg.frequency}
    if cfg.monitor:
        out["monitor"] = cfg.monitor
    return out
