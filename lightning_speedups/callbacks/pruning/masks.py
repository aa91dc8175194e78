"""``MaskPruning``: zero weights with masks during training (dense shapes: correct everywhere, no speedup)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import lightning as L
import torch
from typing_extensions import override

from lightning_speedups._errors import SpeedupConfigError
from lightning_speedups._rebuild import rewrap_ddp
from lightning_speedups._strategies import refuse_sharded
from lightning_speedups.callbacks.pruning.schedule import ScheduledPruning
from lightning_speedups.functional.pruning import (
    UNSTRUCTURED_IMPORTANCES,
    PruningSummary,
    make_pruning_permanent,
    masked_modules,
    prune_unstructured,
    resolve_layers,
)
from lightning_speedups.functional.pruning.masks import (
    attach_mask,
    named_masks,
    resolve_mask_key,
    restore_weight_norm_originals,
    weight_norm_originals,
)
from lightning_speedups.functional.pruning.unstructured import mask_tensors

__all__ = ["MaskPruning"]


class MaskPruning(ScheduledPruning):
    """Zero the smallest weights with masks at the start of chosen epochs, one-shot or on the cubic schedule.

    The masks are parametrizations (see :func:`~lightning_speedups.functional.pruning.prune_unstructured`): correct
    where a parent reads the weight directly, as attention does, and on recurrent weights. Shapes stay dense, so a
    step costs the same: use :class:`~lightning_speedups.StructuredPruning` for a speedup.
    Checkpoints hold clean ``weight`` keys and the masks live in the callback state, so a resumed run re-attaches them.

    Args:
        amount: final fraction of weights zeroed, in ``[0, 1)``.
        start_epoch: epoch at whose start pruning begins (0 = before any training).
        end_epoch: epoch of the last step (default: ``start_epoch``).
        steps: number of pruning steps between ``start_epoch`` and ``end_epoch`` (cubic schedule, see
            :func:`~lightning_speedups.callbacks.pruning.pruning_schedule`); ``1`` = one-shot.
        importance: ``"l1"`` or ``"l2"`` magnitude.
        ignored_layers: module names never masked; ``None`` = the output layers.
        global_pruning: one threshold over all weights instead of ``amount`` per layer.
        make_permanent: fold the masks into the weights when training ends.
        example_inputs: input to find the output layers and count MACs; default ``pl_module.example_input_array``.

    Raises:
        SpeedupConfigError: bad arguments (here); in ``setup``: a sharded strategy, unknown layer names, or nothing
            left to mask.

    Example::

        >>> cb = MaskPruning(amount=0.5, start_epoch=0, end_epoch=2, steps=3)
        >>> [round(a, 2) for _, a in cb.schedule]
        [0.35, 0.48, 0.5]
    """

    mode = "unstructured"
    importances = UNSTRUCTURED_IMPORTANCES

    def __init__(
        self,
        amount: float = 0.5,
        start_epoch: int = 0,
        end_epoch: int | None = None,
        steps: int = 1,
        importance: str = "l1",
        ignored_layers: Sequence[str] | None = None,
        global_pruning: bool = False,
        make_permanent: bool = True,
        example_inputs: Any = None,
    ) -> None:
        super().__init__(
            amount, start_epoch, end_epoch, steps, importance, ignored_layers, global_pruning, example_inputs
        )
        self.make_permanent = make_permanent
        self._masks: dict[str, torch.Tensor] = {}
        self._originals: dict[str, dict[str, torch.Tensor]] = {}  # masked weight norms' raw (g, v), for a resume

    @override
    def check_environment(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        refuse_sharded(
            trainer,
            "MaskPruning",
            "masks are parametrizations added after the strategy has flattened the weights, which its flat "
            "parameters cannot follow; prune with prune_unstructured() before fitting, or under 'ddp'.",
        )
        ignored = self._ignored(pl_module)
        # unknown names, and weights a mask cannot stack on, raise here
        if not mask_tensors(pl_module, resolve_layers(pl_module, ignored)):
            raise SpeedupConfigError(
                f"`ignored_layers`={ignored!r} leaves no conv/linear layer of {type(pl_module).__name__} to prune "
                "(nor a recurrent one). Allowed values: a list that leaves at least one layer."
            )

    @override
    def state_dict(self) -> dict[str, Any]:
        masks = dict(self._masks)
        originals = dict(self._originals)
        if self._model is not None:
            live = {k: m.bool().clone() for k, m in named_masks(self._model).items()}
            masks = live or masks  # after make_permanent the last masks are kept for a later resume
            originals = weight_norm_originals(self._model) if live else {}
        return {**super().state_dict(), "masks": masks, "weight_norm_originals": originals}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        self._masks = dict(state_dict.get("masks") or {})
        self._originals = dict(state_dict.get("weight_norm_originals") or {})

    @override
    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_fit_start(trainer, pl_module)
        if not self._masks:
            return
        # resume: weights are loaded, re-attach the masks
        for key, mask in self._masks.items():
            module, name = resolve_mask_key(pl_module, key)  # a module name, or `rnn.weight_hh_l0`
            attach_mask(module, mask, name)
        # the checkpoint's weights have the masks folded into each weight norm's g and v; the raw pair trains on
        # exactly as before the stop
        restore_weight_norm_originals(pl_module, self._originals)
        rewrap_ddp(trainer)  # parametrizing re-sets the weights: DDP's gradient hooks must be registered anew

    @override
    def prune_to(self, trainer: L.Trainer, pl_module: L.LightningModule, target: float) -> PruningSummary:
        first = not masked_modules(pl_module)
        scope = "global" if self.global_pruning else "layer"
        summary = prune_unstructured(pl_module, target, self.importance, self._ignored(pl_module), scope)
        if first:
            rewrap_ddp(trainer)  # parametrizing re-sets the weights: DDP's gradient hooks must be registered anew
        return summary

    @override
    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.make_permanent:
            self._masks = {k: m.bool().clone() for k, m in named_masks(pl_module).items()}
            make_pruning_permanent(pl_module)

    @override
    def spawn_worker_teardown(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # the launcher hands rank 0's state_dict to the main process: clean `weight` keys, or it skips them silently
        make_pruning_permanent(pl_module)
