"""``StructuredPruning``: remove whole channels during training (torch-pruning), so every later step is cheaper."""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from typing import Any

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from typing_extensions import override

from lightning_speedups._compat import fit_train_dataloader, spawn_drop_returned_weights
from lightning_speedups._errors import SpeedupConfigError
from lightning_speedups._inputs import example_from_batch, first_batch
from lightning_speedups._rebuild import rebuild_optimizers
from lightning_speedups._registry import TechniqueInfo, register_technique
from lightning_speedups._structure import store_structure_record
from lightning_speedups.callbacks.pruning.schedule import ScheduledPruning
from lightning_speedups.functional.pruning import (
    RECORD_KEY,
    STRUCTURED_IMPORTANCES,
    PruningSummary,
    prune_structured,
    pruned_structure_record,
    resolve_layers,
)

__all__ = ["StructuredPruning"]


class StructuredPruning(ScheduledPruning):
    """Remove whole channels at the start of chosen epochs; keep optimizer, scheduler, DDP and checkpoints consistent.

    Channels are removed with torch-pruning, so every later step is cheaper. After each step the optimizer and LR
    scheduler are rebuilt at the same progress (Adam/SGD state of surviving channels is kept) and the model is
    re-wrapped under DDP. Checkpoints carry the pruned architecture, so ``MyModel.load_from_checkpoint(path)`` works
    for :class:`~lightning_speedups.optim.SpeedupMixin` models, :func:`lightning_speedups.load_checkpoint` for any
    module, and ``trainer.fit(ckpt_path=...)`` rebuilds the structure right before the weights load. Models with
    attention have their feed-forward blocks pruned (see
    :func:`~lightning_speedups.functional.pruning.prune_structured`). The whole schedule is checked in ``setup``: the
    final amount is pruned, checked and undone before the first step.

    Args:
        amount: final fraction of channels removed, in ``[0, 1)``.
        start_epoch: epoch at whose start pruning begins (0 = before any training).
        end_epoch: epoch of the last step (default: ``start_epoch``).
        steps: number of pruning steps between ``start_epoch`` and ``end_epoch`` (cubic schedule, see
            :func:`~lightning_speedups.callbacks.pruning.pruning_schedule`); ``1`` = one-shot.
        importance: ``"l1"`` / ``"l2"`` magnitude, ``"taylor"`` (gradients of the previous epoch's last batch, needs
            ``start_epoch >= 1``) or ``"bn_scale"`` (BatchNorm gamma).
        ignored_layers: module names whose outputs keep all channels; ``None`` = the output layers.
        global_pruning: rank channels across layers instead of per layer.
        example_inputs: input for tracing; default ``pl_module.example_input_array``, else the first two samples of
            the first training batch.
        round_to: keep channel counts multiples of this.

    Raises:
        SpeedupConfigError: bad arguments or torch-pruning missing (here); in ``setup``: ``TorchCompile`` in the same
            run, a sharded strategy, unknown layer names, no example input, or a schedule the model cannot take.

    Example::

        >>> cb = StructuredPruning(amount=0.5, start_epoch=0, end_epoch=2, steps=3)
        >>> [round(a, 2) for _, a in cb.schedule]
        [0.35, 0.48, 0.5]
    """

    mode = "structured"
    importances = STRUCTURED_IMPORTANCES

    def __init__(
        self,
        amount: float = 0.5,
        start_epoch: int = 0,
        end_epoch: int | None = None,
        steps: int = 1,
        importance: str = "l1",
        ignored_layers: Sequence[str] | None = None,
        global_pruning: bool = False,
        example_inputs: Any = None,
        round_to: int | None = None,
    ) -> None:
        super().__init__(
            amount, start_epoch, end_epoch, steps, importance, ignored_layers, global_pruning, example_inputs
        )
        if _torch_pruning_missing():
            raise SpeedupConfigError(
                "`StructuredPruning` needs the optional package `torch_pruning`. Allowed values: `MaskPruning` "
                "without it. HINT: pip install 'lightning-speedups[pruning]'."
            )
        self.round_to = round_to
        self.channels: dict[str, int] = {}  # dense channels per prunable layer: schedule targets are relative to them

    @override
    def check_environment(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        from lightning.pytorch.strategies import DDPStrategy, SingleDeviceStrategy

        from lightning_speedups.callbacks.compile import TorchCompile

        if any(isinstance(cb, TorchCompile) for cb in trainer.callbacks):
            raise SpeedupConfigError(
                "`StructuredPruning` with `TorchCompile` is refused: structural pruning changes parameter shapes "
                "mid-run, which forces a full recompile after every pruning step. Allowed values: one of the two per "
                "run. HINT: prune in one run, then compile the pruned model in the next (load_checkpoint)."
            )
        if not isinstance(trainer.strategy, (SingleDeviceStrategy, DDPStrategy)):
            raise SpeedupConfigError(
                f"`strategy`={type(trainer.strategy).__name__} is not supported by structured pruning. Allowed "
                "values: single device, 'ddp', 'ddp_spawn'. HINT: prune with prune_structured() before fitting."
            )
        if self.ignored_layers is not None:
            resolve_layers(pl_module, self.ignored_layers)  # unknown names raise before any tracing
        if self._inputs(pl_module) is None:
            self._batch_inputs = self._example_from_data(trainer, pl_module)
        # validate the whole schedule now: the final amount is pruned, checked and undone (refuses layers that would
        # lose every channel and models the pruned shapes would break), and the dense widths are noted
        scorer = self.importance if self.importance != "taylor" else "l1"  # no gradients yet; only shapes matter
        plan = prune_structured(
            pl_module,
            self._inputs(pl_module),
            self.amount,
            scorer,
            self._ignored(pl_module),
            self.global_pruning,
            self.round_to,
            dry_run=True,
            reference_channels=self.channels or None,
        )
        if not self.channels:
            self.channels = plan.channels

    def _example_from_data(self, trainer: L.Trainer, pl_module: L.LightningModule) -> Any:
        loader = fit_train_dataloader(trainer)
        batch = first_batch(loader) if loader is not None else None
        inputs = example_from_batch(pl_module, batch) if batch is not None else None
        if inputs is None:
            raise SpeedupConfigError(
                "`example_inputs`=None, the module has no `example_input_array`, and no part of the first training "
                f"batch runs through {type(pl_module).__name__}.forward. Allowed values: an input batch. HINT: "
                "StructuredPruning(example_inputs=torch.zeros(1, 3, 32, 32)) or set self.example_input_array."
            )
        return inputs

    @override
    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "channels": dict(self.channels)}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        self.channels = dict(state_dict.get("channels") or {})

    @override
    def prune_to(self, trainer: L.Trainer, pl_module: L.LightningModule, target: float) -> PruningSummary:
        summary = prune_structured(
            pl_module,
            self._inputs(pl_module),
            target,
            self.importance,
            self._ignored(pl_module),
            self.global_pruning,
            self.round_to,
            reference_channels=self.channels or None,
        )
        if trainer.world_size > 1:
            _check_same_plan(trainer, pl_module, summary)
        stats = rebuild_optimizers(trainer, pl_module, summary.origins)
        rank_zero_info(
            f"Pruning: {summary.params_before:,} -> {summary.params_after:,} parameters, MACs {summary.macs_before:,} "
            f"-> {summary.macs_after:,}; optimizer state carried for {stats['carried']}, reset for {stats['reset']}."
        )
        return summary

    @override
    def spawn_worker_teardown(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.steps_done > 0 and trainer.global_rank == 0 and spawn_drop_returned_weights(trainer):
            # the main process's unpruned model cannot take pruned shapes (non-strict load still fails on sizes)
            rank_zero_warn(
                "Pruning under a spawn launcher: the model object in the main process keeps its pre-fit weights, "
                "because it cannot take the pruned shapes. Load the trained model from a checkpoint instead, e.g. "
                "`lightning_speedups.load_checkpoint(MyModel(), trainer.checkpoint_callback.best_model_path)`, or "
                "use strategy='ddp'."
            )

    @override
    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        if self.steps_done > 0:
            store_structure_record(checkpoint, RECORD_KEY, pruned_structure_record(pl_module))
        super().on_save_checkpoint(trainer, pl_module, checkpoint)


def _check_same_plan(trainer: L.Trainer, pl_module: L.LightningModule, summary: PruningSummary) -> None:
    """Every rank ranks the same (DDP-synchronised) weights, so the kept channels must agree: verify it."""
    names = {id(p): n for n, p in pl_module.named_parameters()}
    fp = torch.zeros(2, dtype=torch.float64, device=pl_module.device)
    for pid, (_, kept) in summary.origins.items():
        for dim, idx in kept.items():
            w = (idx.double() + 1).mul(torch.arange(1, idx.numel() + 1, dtype=torch.float64)).sum()
            fp[0] += w * (dim + 1) * (len(names.get(pid, "")) + 1)
            fp[1] += idx.numel()
    gathered = trainer.strategy.all_gather(fp)
    if not torch.equal(gathered.min(0).values, gathered.max(0).values):
        raise RuntimeError("Pruning chose different channels on different ranks; weights are out of sync.")


def _torch_pruning_missing() -> bool:
    """True when torch-pruning cannot be imported (checked without importing it)."""
    return importlib.util.find_spec("torch_pruning") is None


register_technique(
    TechniqueInfo(
        name="pruning",
        callback=StructuredPruning,
        functional=prune_structured,
        summary="Structural channel pruning (torch-pruning) that shrinks every step; or correct mask pruning.",
        requires=("torch_pruning",),
        ways=(4,),
        bench="lightning_speedups.benchmarks.pruning:run",
    )
)
