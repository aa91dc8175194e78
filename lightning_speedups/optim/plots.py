"""Plots of LR schedules and LR range tests (matplotlib is imported lazily: extra ``plots``)."""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

import torch

from lightning_speedups._errors import check_int, require
from lightning_speedups.optim.config import OptimizerConfig, SchedulerConfig, as_optimizer_config, as_scheduler_config
from lightning_speedups.optim.optimizers import create_optimizer
from lightning_speedups.optim.schedulers import create_scheduler, get_scheduler_info

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["simulate_lr_schedule", "plot_lr_schedule", "plot_lr_finder"]


class LRCurve(Protocol):
    """What :func:`plot_lr_finder` reads: an ``LRFinderResult`` (``optim/lr_curve.py``) or anything with its fields.

    A protocol rather than an import, so the result's ``plot()`` can call this module without a circle.
    """

    lrs: list[float]
    losses: list[float]
    rule: str
    suggestions: dict[str, float]


def simulate_lr_schedule(
    scheduler_config: SchedulerConfig | Mapping[str, Any] | str | None,
    optimizer_config: OptimizerConfig | Mapping[str, Any] | str | None = None,
    total_steps: int = 100,
    steps_per_epoch: int | None = None,
) -> list[float]:
    """The base learning rate at each of ``total_steps`` optimizer steps, without training anything.

    Per-epoch schedulers step every ``steps_per_epoch`` steps (default: a tenth of the run, i.e. 10 epochs).
    ``plateau`` is shown for a metric that never improves (its worst case).

    Example::

        >>> lrs = simulate_lr_schedule("onecycle", {"name": "sgd", "lr": 0.1}, total_steps=10)
        >>> len(lrs), round(max(lrs), 3)
        (10, 0.1)
    """
    check_int("total_steps", total_steps, 1)
    opt_cfg = dataclasses.replace(as_optimizer_config(optimizer_config), lr_multipliers={}, lr_scaling=None)
    sched_cfg = as_scheduler_config(scheduler_config)
    per_epoch = steps_per_epoch or max(1, total_steps // 10)
    param = torch.zeros(1, requires_grad=True)
    opt = create_optimizer([param], opt_cfg)
    if sched_cfg is None:
        return [opt_cfg.lr] * total_steps
    info = get_scheduler_info(sched_cfg.name)
    interval = sched_cfg.interval or info.interval
    unit = per_epoch if interval == "epoch" else 1
    n_intervals = math.ceil(total_steps / unit)
    sched_cfg = dataclasses.replace(sched_cfg, total_steps=max(1, math.ceil(n_intervals / sched_cfg.frequency)))
    sched = create_scheduler(opt, sched_cfg)
    lrs = []
    for step in range(total_steps):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        if (step + 1) % unit == 0 and ((step + 1) // unit) % sched_cfg.frequency == 0:
            if isinstance(sched, torch.optim.lr_scheduler.ReduceLROnPlateau):
                sched.step(1.0)  # a metric that never improves
            elif sched is not None:
                sched.step()
    return lrs


def _figure(ax: Any) -> tuple[Figure, Any]:
    require("matplotlib", "plots", "LR plots")
    from matplotlib.figure import Figure

    if ax is not None:
        return ax.figure, ax
    fig = Figure(figsize=(6, 3.5), layout="constrained")
    return fig, fig.add_subplot()


def plot_lr_schedule(
    scheduler_config: SchedulerConfig | Mapping[str, Any] | str | None,
    optimizer_config: OptimizerConfig | Mapping[str, Any] | str | None = None,
    total_steps: int = 100,
    path: str | os.PathLike[str] | None = None,
    steps_per_epoch: int | None = None,
    ax: Any = None,
) -> Figure:
    """Plot the learning rate over a run; pass a ``{label: scheduler_config}`` dict to compare several.

    Args:
        scheduler_config: one config (dataclass, dict, name) or a mapping ``label -> config``.
        optimizer_config: gives the base lr (default Adam 1e-3).
        total_steps: optimizer steps of the run.
        path: save a PNG there.
        steps_per_epoch: for per-epoch schedulers (default: a tenth of the run).
        ax: draw into an existing matplotlib ``Axes``.

    Returns:
        The matplotlib ``Figure``.
    """
    fig, ax = _figure(ax)
    field_names = {f.name for f in dataclasses.fields(SchedulerConfig)}
    configs: Mapping[Any, Any]
    if isinstance(scheduler_config, Mapping) and not set(scheduler_config) & field_names:
        configs = scheduler_config  # {label: config}
    else:
        single = as_scheduler_config(scheduler_config)
        configs = {single.name if single is not None else "constant": single}
    for label, cfg in configs.items():
        ax.plot(
            range(total_steps),
            simulate_lr_schedule(cfg, optimizer_config, total_steps, steps_per_epoch),
            label=str(label),
        )
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("learning rate")
    ax.legend(fontsize="small")
    ax.grid(alpha=0.3)
    if path is not None:
        fig.savefig(path, dpi=100)
    return fig


def plot_lr_finder(result: LRCurve, path: str | os.PathLike[str] | None = None, ax: Any = None) -> Figure:
    """Plot an LR range test (loss vs lr, log x) with every rule's suggestion; the chosen one is solid."""
    fig, ax = _figure(ax)
    ax.plot(result.lrs, result.losses, color="black", lw=1.2)
    ax.set_xscale("log")
    colors = {"steep": "tab:red", "valley": "tab:green", "minimum": "tab:blue", "slide": "tab:purple"}
    for name, lr in result.suggestions.items():
        style = "-" if name == result.rule else ":"
        ax.axvline(lr, ls=style, color=colors.get(name, "gray"), label=f"{name}: {lr:.2g}")
    ax.set_xlabel("learning rate")
    ax.set_ylabel("smoothed training loss")
    finite = [x for x in result.losses if math.isfinite(x)]
    if finite:  # the diverged tail would squash the interesting part
        lo = min(finite)
        ax.set_ylim(lo - 0.05 * abs(lo), min(max(finite), finite[0] * 1.5 if finite[0] > 0 else max(finite)))
    ax.legend(fontsize="small")
    ax.grid(alpha=0.3)
    if path is not None:
        fig.savefig(path, dpi=100)
    return fig
