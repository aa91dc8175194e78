"""EMA callback: Lightning's ``EMAWeightAveraging`` with a warm-up decay, argument checks, spawn and resume fixes."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import EMAWeightAveraging, StochasticWeightAveraging, WeightAveraging
from lightning.pytorch.utilities import rank_zero_info
from typing_extensions import override

from lightning_speedups._compat import averaged_model
from lightning_speedups._errors import SpeedupConfigError, check_bool, check_int
from lightning_speedups._registry import TechniqueInfo, register_technique
from lightning_speedups._strategies import SHARDED_STRATEGIES, refuse_sharded
from lightning_speedups._structure import keep_metadata
from lightning_speedups.functional.ema import EMAUpdate, check_decay, create_ema_model, follow_shapes_at_update

__all__ = ["AVERAGING_CALLBACKS", "EMA", "SHARDED_STRATEGIES"]

AVERAGING_CALLBACKS = (WeightAveraging, StochasticWeightAveraging)  # each rewrites the checkpoint's state_dict


class EMA(EMAWeightAveraging):
    """Validate and checkpoint an exponential moving average of the weights; Lightning's ``EMAWeightAveraging``.

    Everything Lightning's callback does is kept: after each optimizer step the ``AveragedModel`` is updated
    (``should_update``: every ``update_every_n_steps`` from ``update_starting_at_step``, and after each epoch from
    ``update_starting_at_epoch``), validation runs on the average (swapped in and out), the model ends the fit
    holding the average, and a checkpoint's ``state_dict`` is the average (so ``load_from_checkpoint`` gives the EMA
    model) with the raw weights under ``current_model_state``. What this subclass adds:

    * **Warm-up decay** (``warmup=True``): ``min(decay, (1 + n) / (10 + n))`` after ``n`` updates, see
      :func:`~lightning_speedups.functional.ema.ema_decay`. A fixed 0.999 needs ~1000 steps to forget the random
      initial weights, longer than many short runs; the number of updates is the ``AveragedModel``'s ``n_averaged``
      buffer, saved in the checkpoint, so the schedule resumes exactly.
    * **Argument checks** in ``__init__`` and, in ``setup()``, a refusal of sharded strategies (FSDP, DeepSpeed,
      model parallel: Lightning only warns, then averages unsharded copies) and of a second averaging callback (both
      would rewrite the checkpoint's ``state_dict``).
    * **ddp_spawn.** Lightning's ``EMAWeightAveraging`` keeps a closure as its average function, which cannot be
      pickled into spawned workers; this one uses the picklable
      :class:`~lightning_speedups.functional.ema.EMAUpdate` (so it calls ``WeightAveraging.__init__`` itself).
    * **Resume equals not stopping.** Lightning's checkpoint holds the average (``state_dict``), its update count
      (``averaging_state``), the raw weights (``current_model_state``) and the last update step (callback state).
      But a checkpoint written after ``fit`` returned (``trainer.save_checkpoint``) would store the average as the
      raw weights too, because ``on_train_end`` copied the average into the model; the raw weights are kept at that
      point, so resuming from such a checkpoint continues from them, like an uninterrupted run.
    * **Tensors the forward pass rebuilds.** A buffer replaced at another shape on the first call (timm ConViT's
      ``rel_indices``) or materialized (a lazy module) is copied into the average when it updates
      (``lightning_speedups.functional.ema.follow_shapes``); Lightning's update would fail on the shapes.
    * **Tensors that hold infinities.** Clip bounds kept as buffers at ``-inf`` / ``+inf`` (Gemma 4's clipped
      linears) are copied, not averaged: a lerp between two infinities is NaN, and every output of the average was.

    Args:
        decay: the EMA decay after warm-up, in ``[0, 1)``.
        warmup: ramp the decay from 0.1 up to ``decay`` over the first updates.
        update_every_n_steps: update after every n-th optimizer step (>= 1).
        update_starting_at_step: first optimizer step index to update at (``None``: from the first).
        update_starting_at_epoch: also update at the end of every epoch from this one (``None``: never per epoch).
        use_buffers: also average buffers (BatchNorm statistics); ``False`` copies them.
        device: keep the average on this device (``None``: the model's; ``"cpu"`` to save accelerator memory).

    Example::

        >>> trainer = L.Trainer(callbacks=[EMA(decay=0.999)])  # doctest: +SKIP
    """

    def __init__(
        self,
        decay: float = 0.999,
        warmup: bool = True,
        update_every_n_steps: int = 1,
        update_starting_at_step: int | None = None,
        update_starting_at_epoch: int | None = None,
        use_buffers: bool = True,
        device: torch.device | str | int | None = None,
    ) -> None:
        check_decay(decay)
        check_int("update_every_n_steps", update_every_n_steps, 1)
        check_int("update_starting_at_step", update_starting_at_step, 0, optional=True)
        check_int("update_starting_at_epoch", update_starting_at_epoch, 0, optional=True)
        check_bool("warmup", warmup)
        check_bool("use_buffers", use_buffers)
        if device is not None:
            try:
                torch.device(device)
            except (RuntimeError, TypeError) as err:
                raise SpeedupConfigError(
                    f"`device`={device!r} is not supported. Allowed values: None, a torch.device, or a device string "
                    "or index such as 'cpu', 'cuda:0', 0."
                ) from err
        # WeightAveraging.__init__, not EMAWeightAveraging's: the latter adds an unpicklable closure as `avg_fn`
        WeightAveraging.__init__(self, device=device, use_buffers=use_buffers, multi_avg_fn=EMAUpdate(decay, warmup))
        self.update_every_n_steps = update_every_n_steps
        self.update_starting_at_step = update_starting_at_step
        self.update_starting_at_epoch = update_starting_at_epoch
        self.decay = float(decay)
        self.warmup = warmup
        self._raw_state: dict[str, torch.Tensor] | None = None

    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage == "fit":
            refuse_sharded(trainer, "EMA", "the average would be a full unsharded copy of the model on every rank.")
            others = [
                type(cb).__name__ for cb in trainer.callbacks if cb is not self and isinstance(cb, AVERAGING_CALLBACKS)
            ]
            if others:
                raise SpeedupConfigError(
                    f"EMA cannot run with another weight-averaging callback ({', '.join(others)}): each replaces the "
                    "checkpoint's `state_dict` with its own average. Allowed values: one averaging callback."
                )
            self._raw_state = None
        super().setup(trainer, pl_module, stage)
        average = averaged_model(self)
        if stage == "fit" and average is not None:  # Lightning's AveragedModel, following shapes at each update
            follow_shapes_at_update(average)

    @override
    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        rank_zero_info(
            f"EMA: decay {self.decay}{' with warm-up' if self.warmup else ''}, every {self.update_every_n_steps} "
            "step(s); validation and the final model use the average."
        )

    @override
    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # keep the raw weights: a checkpoint saved after fit must resume from them, not from the average
        state = pl_module.state_dict()
        self._raw_state = keep_metadata(state, {k: v.detach().clone() for k, v in state.items()})
        super().on_train_end(trainer, pl_module)

    @override
    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        super().on_save_checkpoint(trainer, pl_module, checkpoint)
        if self._raw_state is not None and "current_model_state" in checkpoint:
            checkpoint["current_model_state"] = keep_metadata(self._raw_state, self._raw_state)
        # Lightning rebuilds the average's state as a plain dict: put the module versions back (MNASNet and
        # BatchNorm read them on load, and refuse a state dict without them)
        source = pl_module.state_dict()
        for key in ("state_dict", "current_model_state"):
            if key in checkpoint and getattr(checkpoint[key], "_metadata", None) is None:
                checkpoint[key] = keep_metadata(source, checkpoint[key])

    @override
    def on_load_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        average = averaged_model(self)
        metadata = getattr(checkpoint.get("state_dict"), "_metadata", None)
        if average is None or metadata is None or not {"current_model_state", "averaging_state"} <= set(checkpoint):
            super().on_load_checkpoint(trainer, pl_module, checkpoint)
            return
        # Lightning's own load, with the module versions kept under the average's `module.` prefix
        state: dict[str, Any] = OrderedDict(("module." + k, v) for k, v in checkpoint["state_dict"].items())
        state.update(checkpoint["averaging_state"])
        state._metadata = OrderedDict(  # type: ignore[attr-defined]
            (f"module.{k}" if k else "module", dict(v)) for k, v in metadata.items()
        )
        average.load_state_dict(state)
        pl_module.load_state_dict(checkpoint["current_model_state"])

    @override
    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "decay": self.decay, "warmup": self.warmup}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        saved = (state_dict.get("decay", self.decay), state_dict.get("warmup", self.warmup))
        if saved != (self.decay, self.warmup):
            rank_zero_info(f"EMA: resuming with decay={self.decay}, warmup={self.warmup} (checkpoint: {saved}).")


register_technique(
    TechniqueInfo(
        name="ema",
        callback=EMA,
        functional=create_ema_model,
        summary="exponential moving average of the weights (Lightning's EMAWeightAveraging, warm-up decay)",
        ways=(3, 6),
        bench="lightning_speedups.benchmarks.time_to_accuracy:run_ema",
    )
)
