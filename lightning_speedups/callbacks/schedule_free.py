"""ScheduleFreeSwitch: train weights for training steps, eval weights for evaluation, checkpoints and the end of fit."""

from __future__ import annotations

from typing import Any

import lightning as L
from lightning.pytorch.utilities import rank_zero_warn
from typing_extensions import override

from lightning_speedups._errors import check_int
from lightning_speedups._registry import TechniqueInfo, register_technique
from lightning_speedups._strategies import refuse_sharded
from lightning_speedups.optim.schedule_free import (
    DEFAULT_BN_BATCHES,
    SHARDED_HINT,
    check_no_scheduler,
    eval_weights_into_checkpoint,
    fit_eval_weights,
    fit_train_weights,
    is_schedule_free,
    schedule_free_eval,
)

__all__ = ["ScheduleFreeSwitch"]


class ScheduleFreeSwitch(L.Callback):
    """Switch every schedule-free optimizer of the trainer between its train and eval weights at the right hooks.

    A schedule-free optimizer (``schedulefree.AdamWScheduleFree``, ``SGDScheduleFree``, ...; the registry's
    ``OptimizerConfig("schedule_free_adamw")`` / ``"schedule_free_sgd"``) trains at one point ``y`` and should be
    evaluated and saved at the average ``x``; its ``train()`` / ``eval()`` move the parameters between the two. This
    callback calls them for any optimizer that has them, also one built in your own ``configure_optimizers``:

    * ``on_train_batch_start``: ``train()`` (a no-op when already in train mode), so every step sees ``y``;
    * ``on_validation_start``, ``on_test_start``, ``on_predict_start`` and ``on_train_end``: ``eval()``, then (when
      the weights moved and the model has BatchNorm) up to ``bn_batches`` training batches refresh the BatchNorm
      running statistics at ``x``, as the ``schedulefree`` README advises; the model ends the fit holding ``x``;
    * ``on_save_checkpoint``: the checkpoint's ``state_dict`` gets ``x`` and the saved optimizer state says eval
      mode, while training goes on at ``y``; a resumed run continues exactly as the uninterrupted one.

    :class:`~lightning_speedups.SpeedupMixin` does the same by itself for its own schedule-free optimizer; with both,
    the switches are idempotent and the first one (the callback's) does the work. Checkpoints written with
    ``save_weights_only=True`` skip callbacks' ``on_save_checkpoint`` and hold ``y`` unless the mixin builds the
    optimizer (a warning says so).

    Args:
        bn_batches: training batches that refresh BatchNorm statistics at the eval weights (0: off). Costs that many
            forward passes per evaluation; skipped for models without BatchNorm.

    Raises:
        SpeedupConfigError: at ``setup()`` under a sharded strategy (FSDP, DeepSpeed); at ``on_fit_start`` when an LR
            scheduler steps a schedule-free optimizer.

    Example::

        >>> switch = ScheduleFreeSwitch(bn_batches=20)
        >>> trainer = L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, callbacks=[switch])
        >>> switch in trainer.callbacks
        True
    """

    def __init__(self, bn_batches: int = DEFAULT_BN_BATCHES) -> None:
        check_int("bn_batches", bn_batches, 0, hint="0 turns the BatchNorm refresh off.")
        self.bn_batches = bn_batches

    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage == "fit":
            refuse_sharded(trainer, "ScheduleFreeSwitch", SHARDED_HINT)

    @override
    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        check_no_scheduler(trainer)
        if not any(is_schedule_free(o) for o in trainer.optimizers):
            rank_zero_warn(
                "ScheduleFreeSwitch: no optimizer of the trainer has schedule-free train()/eval(); nothing to switch. "
                "HINT: OptimizerConfig('schedule_free_adamw') with SpeedupMixin, or schedulefree.AdamWScheduleFree "
                "in configure_optimizers."
            )
        elif any(getattr(cb, "save_weights_only", False) for cb in trainer.checkpoint_callbacks):
            if not getattr(pl_module, "_speedup_schedule_free", False):
                rank_zero_warn(
                    "ScheduleFreeSwitch: a ModelCheckpoint saves weights only, which Lightning writes without "
                    "callbacks' on_save_checkpoint: those files hold the train weights, not the average. HINT: "
                    "save_weights_only=False, or build the optimizer with SpeedupMixin."
                )

    @override
    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        fit_train_weights(trainer)

    @override
    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        fit_eval_weights(trainer, pl_module, self.bn_batches)

    @override
    def on_test_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        fit_eval_weights(trainer, pl_module, self.bn_batches)

    @override
    def on_predict_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        fit_eval_weights(trainer, pl_module, self.bn_batches)

    @override
    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        fit_eval_weights(trainer, pl_module, self.bn_batches)

    @override
    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        eval_weights_into_checkpoint(pl_module, trainer.optimizers, checkpoint)


register_technique(
    TechniqueInfo(
        name="schedule_free",
        callback=ScheduleFreeSwitch,
        functional=schedule_free_eval,
        summary="schedule-free AdamW / SGD: no LR schedule; train at y, evaluate and checkpoint the average x",
        requires=("schedulefree",),
        ways=(2,),
    )
)
