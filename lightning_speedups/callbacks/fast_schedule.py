"""FastSchedule callback: give a LightningModule's optimizer a short warm-up, a higher peak and a decay to the end."""

from __future__ import annotations

import math
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from lightning.pytorch.utilities.types import LRSchedulerConfig
from typing_extensions import override

from lightning_speedups._compat import refresh_scheduler_last_lr
from lightning_speedups._errors import SpeedupConfigError, check_choice, check_int, check_range
from lightning_speedups._registry import TechniqueInfo, register_technique
from lightning_speedups.functional.fast_schedule import (
    DECAYS,
    FastScheduleFactor,
    check_warmup,
    create_fast_schedule,
    peak_lr,
)
from lightning_speedups.optim.config import LR_SCALING_RULES
from lightning_speedups.optim.mixin import effective_batch_size
from lightning_speedups.optim.wsd import WSDFactor, check_decay_fraction

__all__ = ["FastSchedule"]


class FastSchedule(Callback):
    """Schedule the learning rate of a module that returns only an optimizer: short warm-up, higher peak, decay.

    At ``fit`` start, after ``configure_optimizers`` built the optimizer(s), every param group's lr becomes its peak
    (``peak_factor`` x lr, scaled from ``base_batch_size`` to the run's effective batch size when given) and a per-step
    ``LambdaLR`` from :func:`~lightning_speedups.functional.fast_schedule.create_fast_schedule` is added to the
    trainer's schedulers, so Lightning steps it, checkpoints it and restores it on resume like one returned by
    ``configure_optimizers`` (the same way Lightning's ``StochasticWeightAveraging`` installs ``SWALR``).

    Refused, with a hint, before any step: a module whose ``configure_optimizers`` already returns a scheduler (two
    schedules would fight; for :class:`~lightning_speedups.optim.SpeedupMixin` models the same curve is
    ``OptimizerConfig(lr=peak, lr_scaling=..., base_batch_size=...)`` with ``SchedulerConfig("linear_warmup_cosine",
    warmup=0.05)``, cosine instead of linear), manual optimization (Lightning does not step schedulers then) and an
    unbounded run.

    Args:
        warmup: warm-up steps (int) or fraction of the run (float in ``[0, 1)``).
        peak_factor: peak lr = ``peak_factor`` x the optimizer's lr (> 0).
        base_batch_size: the batch size the optimizer's lr was tuned for; the peak then follows the run's effective
            batch size (``batch_size`` x devices x accumulation) by ``lr_scaling``. ``None``: no batch scaling.
        lr_scaling: ``"sqrt"`` (Adam-type), ``"linear"`` (SGD) or ``None``.
        decay: ``"linear"``, ``"cosine"`` or ``"constant"`` after the warm-up, or ``"wsd"`` (constant, then a
            cool-down over the last ``decay_fraction`` of the run).
        final_lr_ratio: lr at the end as a fraction of the peak, in ``[0, 1]``.
        decay_fraction: ``decay="wsd"`` only: the share of the run spent cooling down, in ``(0, 1)``.
        batch_size: the effective batch size; ``None`` reads ``batch_size`` of the module, its hparams or the
            datamodule (x devices x accumulation).
        total_steps: run length in optimizer steps; ``None`` uses ``trainer.estimated_stepping_batches``.

    Example::

        >>> trainer = L.Trainer(max_epochs=5, callbacks=[FastSchedule(peak_factor=3.0)])  # doctest: +SKIP
    """

    def __init__(
        self,
        warmup: float = 0.05,
        peak_factor: float = 3.0,
        base_batch_size: int | None = None,
        lr_scaling: str | None = "sqrt",
        decay: str = "linear",
        final_lr_ratio: float = 0.0,
        batch_size: int | None = None,
        total_steps: int | None = None,
        decay_fraction: float = 0.2,
    ) -> None:
        check_warmup(warmup)
        check_decay_fraction(decay_fraction)
        peak_lr(1.0, peak_factor)  # validates peak_factor
        check_choice("lr_scaling", lr_scaling, (*LR_SCALING_RULES, None))
        check_choice("decay", decay, DECAYS)
        check_range("final_lr_ratio", final_lr_ratio, 0.0, 1.0)
        for name, value in (
            ("base_batch_size", base_batch_size),
            ("batch_size", batch_size),
            ("total_steps", total_steps),
        ):
            check_int(name, value, 1, optional=True)
        self.warmup = warmup
        self.peak_factor = peak_factor
        self.base_batch_size = base_batch_size
        self.lr_scaling = lr_scaling
        self.decay = decay
        self.final_lr_ratio = final_lr_ratio
        self.batch_size = batch_size
        self.total_steps = total_steps
        self.decay_fraction = decay_fraction
        self.peak_lrs: list[list[float]] = []
        self._total = 0
        self._schedulers: list[torch.optim.lr_scheduler.LambdaLR] = []

    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage == "fit" and not pl_module.automatic_optimization:
            raise SpeedupConfigError(
                "FastSchedule needs automatic optimization: with `automatic_optimization=False` Lightning does not "
                "step LR schedulers. HINT: call create_fast_schedule() in configure_optimizers and step it yourself."
            )

    def _batch_size(self, pl_module: L.LightningModule) -> int | None:
        if self.base_batch_size is None:
            return None
        if self.batch_size is not None:
            return self.batch_size
        batch = effective_batch_size(pl_module)
        if batch is None:
            raise SpeedupConfigError(
                f"`base_batch_size`={self.base_batch_size} needs the run's batch size, but neither the module, its "
                "hparams nor the datamodule has a `batch_size`. HINT: pass FastSchedule(batch_size=...)."
            )
        return batch

    @override
    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.lr_scheduler_configs:
            names = ", ".join(type(c.scheduler).__name__ for c in trainer.lr_scheduler_configs)
            raise SpeedupConfigError(
                f"FastSchedule sets the LR schedule, but `{type(pl_module).__name__}.configure_optimizers` already "
                f"returns one ({names}). Allowed values: a module that returns only its optimizer. HINT: return only "
                "the optimizer (SpeedupMixin: scheduler_config=None), or drop FastSchedule."
            )
        total = self.total_steps or trainer.estimated_stepping_batches
        if not math.isfinite(total):
            raise SpeedupConfigError(
                "FastSchedule needs the run length, but the Trainer is unbounded (max_epochs=-1 and no max_steps). "
                "HINT: set Trainer(max_steps=...) or max_epochs, or FastSchedule(total_steps=...)."
            )
        batch = self._batch_size(pl_module)
        self.peak_lrs = []
        self._schedulers = []
        self._total = int(total)
        for optimizer in trainer.optimizers:
            scheduler = create_fast_schedule(
                optimizer,
                int(total),
                self.warmup,
                self.peak_factor,
                batch,
                self.base_batch_size,
                self.lr_scaling,
                self.decay,
                self.final_lr_ratio,
                self.decay_fraction,
            )
            trainer.strategy.lr_scheduler_configs.append(LRSchedulerConfig(scheduler, interval="step"))
            self._schedulers.append(scheduler)
            self.peak_lrs.append(list(scheduler.base_lrs))
        rank_zero_info(
            f"FastSchedule: warm-up {self._warmup_text(int(total))}, peak lr {self.peak_lrs[0][0]:.3g}"
            + (f" (batch {batch} vs {self.base_batch_size}, {self.lr_scaling})" if batch else "")
            + f", {self.decay} decay over {int(total)} steps."
        )

    def _warmup_text(self, total: int) -> str:
        steps = round(self.warmup * total) if isinstance(self.warmup, float) else self.warmup
        text = f"{steps} step" + ("" if steps == 1 else "s")
        return f"{self.warmup:.3g} of the run ({text})" if isinstance(self.warmup, float) else text

    @override
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # after a resume the schedulers hold the checkpoint's factors: a run of another length stretches the curve
        for scheduler in self._schedulers:
            factors = [f for f in scheduler.lr_lambdas if isinstance(f, (FastScheduleFactor, WSDFactor))]
            if factors and factors[0].total != self._total:
                rank_zero_warn(
                    f"FastSchedule: the checkpoint's schedule spans {factors[0].total} steps, this run {self._total}; "
                    "the decay is stretched to the new length from the current step."
                )
                for factor in factors:
                    factor.stretch(self._total)  # the decay (a WSD cool-down too) ends at the new length
                for group, base, factor in zip(
                    scheduler.optimizer.param_groups, scheduler.base_lrs, scheduler.lr_lambdas
                ):
                    group["lr"] = base * factor(scheduler.last_epoch)
                refresh_scheduler_last_lr(scheduler)

    @override
    def state_dict(self) -> dict[str, Any]:
        # the schedule itself (factor, step, peaks) is saved with the trainer's lr_schedulers
        return {"peak_lrs": self.peak_lrs}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.peak_lrs = [list(p) for p in state_dict.get("peak_lrs", [])]


register_technique(
    TechniqueInfo(
        name="fast_schedule",
        callback=FastSchedule,
        functional=create_fast_schedule,
        summary="LR schedule for time to target: short warm-up, higher (batch-scaled) peak, linear decay",
        ways=(3,),
        bench="lightning_speedups.benchmarks.time_to_accuracy:run_fast_schedule",
    )
)
