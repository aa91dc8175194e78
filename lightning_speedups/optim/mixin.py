"""SpeedupMixin: ``configure_optimizers`` built from ``self.optimizer_config`` and ``self.scheduler_config``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lightning.pytorch.utilities.parsing import lightning_getattr, lightning_hasattr

from lightning_speedups._errors import SpeedupConfigError
from lightning_speedups._strategies import refuse_sharded
from lightning_speedups._structure import apply_structure_records
from lightning_speedups.optim.config import (
    OptimizerConfig,
    SchedulerConfig,
    as_optimizer_config,
    as_scheduler_config,
)
from lightning_speedups.optim.optimizers import create_optimizer, get_optimizer_info
from lightning_speedups.optim.schedule_free import (
    DEFAULT_BN_BATCHES,
    check_schedule_free_config,
    eval_weights_into_checkpoint,
    fit_eval_weights,
    fit_train_weights,
)
from lightning_speedups.optim.schedulers import create_scheduler, lightning_scheduler_config

__all__ = ["SpeedupMixin", "effective_batch_size"]


def effective_batch_size(module: Any) -> int | None:
    """Global batch per optimizer step: ``batch_size`` (model, hparams or datamodule) x devices x accumulation.

    Returns ``None`` when no ``batch_size`` attribute can be found.
    """
    if not lightning_hasattr(module, "batch_size"):
        return None
    batch = lightning_getattr(module, "batch_size")
    if not isinstance(batch, int) or isinstance(batch, bool):
        return None
    trainer = getattr(module, "_trainer", None)
    if trainer is None:
        return batch
    return batch * max(1, trainer.world_size) * max(1, trainer.accumulate_grad_batches)


class SpeedupMixin:
    """LightningModule mixin whose ``configure_optimizers`` comes from two config attributes.

    Add it before ``LightningModule`` in the bases and delete your own ``configure_optimizers``. The configs may be
    given to ``__init__``, loaded from ``hparams`` (checkpoints, LightningCLI) or assigned later; dicts (from YAML) are
    converted and validated at construction.

    Args:
        optimizer_config: :class:`OptimizerConfig`, dict of its fields, or ``None`` (Adam, lr 1e-3).
        scheduler_config: :class:`SchedulerConfig`, dict of its fields, or ``None`` (no scheduler: constant lr).

    A schedule-free optimizer (``OptimizerConfig("schedule_free_adamw")`` or ``"schedule_free_sgd"``) takes no
    scheduler (refused at construction) and is switched at the right hooks: train weights before every training step
    (``on_train_batch_start``), eval weights with refreshed BatchNorm statistics at ``on_validation_start``,
    ``on_test_start``, ``on_predict_start`` and ``on_train_end``, and eval weights in every checkpoint
    (``on_save_checkpoint``). If you override one of these hooks, call ``super()``, or add the
    :class:`~lightning_speedups.callbacks.schedule_free.ScheduleFreeSwitch` callback, which does the same.

    Attributes:
        optimizer_config: always an :class:`OptimizerConfig` after ``__init__``.
        scheduler_config: a :class:`SchedulerConfig` or ``None``.
        schedule_free_bn_batches: training batches that refresh BatchNorm statistics at a schedule-free optimizer's
            eval weights (0: off; no effect on models without BatchNorm).

    Example::

        >>> import lightning as L, torch
        >>> class Net(SpeedupMixin, L.LightningModule):
        ...     def __init__(self, **kw):
        ...         super().__init__(**kw)
        ...         self.layer = torch.nn.Linear(4, 2)
        >>> net = Net(optimizer_config={"name": "sgd", "lr": 0.1}, scheduler_config=SchedulerConfig("step"))
        >>> out = net.configure_optimizers()
        >>> type(out["optimizer"]).__name__, out["lr_scheduler"]["interval"]
        ('SGD', 'epoch')
    """

    schedule_free_bn_batches: int = DEFAULT_BN_BATCHES

    def __init__(self, *args: Any, optimizer_config: Any = None, scheduler_config: Any = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # remember whether the user gave them, so configs saved in hparams can fill the gaps later
        self._speedup_defaults = (optimizer_config is None, scheduler_config is None)
        self.optimizer_config: OptimizerConfig = as_optimizer_config(optimizer_config)
        self.scheduler_config: SchedulerConfig | None = as_scheduler_config(scheduler_config)
        self._speedup_schedule_free = _schedule_free(self.optimizer_config, self.scheduler_config)

    def _resolved_configs(self) -> tuple[OptimizerConfig, SchedulerConfig | None]:
        opt_cfg: Any = self.optimizer_config
        sched_cfg: Any = self.scheduler_config
        hparams: Mapping[str, Any] = getattr(self, "hparams", {}) or {}
        opt_default, sched_default = getattr(self, "_speedup_defaults", (False, False))
        if opt_default and hparams.get("optimizer_config") is not None and isinstance(opt_cfg, OptimizerConfig):
            if opt_cfg == OptimizerConfig():  # untouched default: the hparams value wins
                opt_cfg = hparams["optimizer_config"]
        if sched_default and sched_cfg is None and hparams.get("scheduler_config") is not None:
            sched_cfg = hparams["scheduler_config"]
        return as_optimizer_config(opt_cfg), as_scheduler_config(sched_cfg)

    def configure_optimizers(self) -> Any:
        """Build optimizer and scheduler from the configs (see :func:`create_optimizer`, :func:`create_scheduler`).

        Raises:
            SpeedupConfigError: bad configs, ``lr_scaling`` without a findable ``batch_size``, a scheduler that needs
                the run length in an unbounded run, a warm-up longer than the run.
        """
        opt_cfg, sched_cfg = self._resolved_configs()
        self._speedup_schedule_free = _schedule_free(opt_cfg, sched_cfg)
        batch = effective_batch_size(self) if opt_cfg.lr_scaling else None
        if opt_cfg.lr_scaling and batch is None:
            raise SpeedupConfigError(
                f"`lr_scaling`={opt_cfg.lr_scaling!r} needs the batch size. Allowed values: lr_scaling=None, or a "
                "known batch size. HINT: give the model, its hparams or the datamodule a `batch_size` attribute."
            )
        trainer = getattr(self, "_trainer", None)
        if not get_optimizer_info(opt_cfg.name).shardable:
            refuse_sharded(
                trainer,
                f"the {opt_cfg.name!r} optimizer",
                "it needs each weight matrix whole on one rank (a sharded strategy splits them); use 'ddp', or "
                "OptimizerConfig('adamw').",
            )
        # Lightning refuses to clip gradients of fused optimizers under fp16 GradScaler
        avoid_fused = bool(
            trainer is not None and trainer.gradient_clip_val and str(trainer.precision).startswith("16")
        )
        optimizer = create_optimizer(self, opt_cfg, batch_size=batch, avoid_fused=avoid_fused)  # type: ignore[arg-type]
        scheduler = create_scheduler(optimizer, sched_cfg, trainer=trainer)
        if scheduler is None or sched_cfg is None:
            return optimizer
        return {"optimizer": optimizer, "lr_scheduler": lightning_scheduler_config(scheduler, sched_cfg)}

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # rebuild pruned / quantized structure before Lightning's strict load_state_dict
        apply_structure_records(self, checkpoint)  # type: ignore[arg-type]
        super().on_load_checkpoint(checkpoint)  # type: ignore[misc]

    # schedule-free optimizers: the same steps as the ScheduleFreeSwitch callback (both idempotent, so both may run)
    def _schedule_free_trainer(self) -> Any:
        return getattr(self, "_trainer", None) if getattr(self, "_speedup_schedule_free", False) else None

    def _schedule_free_eval(self) -> None:
        trainer = self._schedule_free_trainer()
        if trainer is not None:
            fit_eval_weights(trainer, self, self.schedule_free_bn_batches)

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> int | None:
        trainer = self._schedule_free_trainer()
        if trainer is not None:
            fit_train_weights(trainer)
        return super().on_train_batch_start(batch, batch_idx)  # type: ignore[misc]

    def on_validation_start(self) -> None:
        super().on_validation_start()  # type: ignore[misc]
        self._schedule_free_eval()

    def on_test_start(self) -> None:
        super().on_test_start()  # type: ignore[misc]
        self._schedule_free_eval()

    def on_predict_start(self) -> None:
        super().on_predict_start()  # type: ignore[misc]
        self._schedule_free_eval()

    def on_train_end(self) -> None:
        super().on_train_end()  # type: ignore[misc]
        self._schedule_free_eval()

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_save_checkpoint(checkpoint)  # type: ignore[misc]
        trainer = self._schedule_free_trainer()
        if trainer is not None:
            eval_weights_into_checkpoint(self, trainer.optimizers, checkpoint)  # type: ignore[arg-type]


def _schedule_free(opt_cfg: OptimizerConfig, sched_cfg: SchedulerConfig | None) -> bool:
    """Whether the optimizer config is schedule-free; such a one refuses a scheduler config beside it."""
    if not get_optimizer_info(opt_cfg.name).schedule_free:
        return False
    check_schedule_free_config(opt_cfg.name, sched_cfg)
    return True
