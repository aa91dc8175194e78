"""``Pruning``: prune during training, structurally (real speedup) or with masks, one-shot or on a cubic schedule."""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Sequence
from typing import Any

import lightning as L
import torch
from lightning.fabric.utilities.apply_func import move_data_to_device
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from typing_extensions import override

from lightning_speedups._compat import (
    before_model_weights_load,
    fit_train_dataloader,
    is_spawn_launcher,
    spawn_drop_returned_weights,
)
from lightning_speedups._errors import SpeedupConfigError, check_choice, check_int, check_range
from lightning_speedups._inputs import example_from_batch, first_batch
from lightning_speedups._rebuild import rebuild_optimizers, rewrap_ddp
from lightning_speedups._registry import TechniqueInfo, register_technique
from lightning_speedups._strategies import refuse_sharded
from lightning_speedups._structure import apply_structure_records, store_structure_record
from lightning_speedups.functional._mask_pruning import mask_tensors
from lightning_speedups.functional._masks import (
    attach_mask,
    masked_modules,
    named_masks,
    resolve_mask_key,
    restore_weight_norm_originals,
    weight_norm_originals,
)
from lightning_speedups.functional.pruning import (
    RECORD_KEY,
    STRUCTURED_IMPORTANCES,
    UNSTRUCTURED_IMPORTANCES,
    PruningSummary,
    clean_pruned_state_dict,
    count_macs,
    default_ignored_layers,
    make_pruning_permanent,
    prune_structured,
    prune_unstructured,
    pruned_structure_record,
    resolve_layers,
    sparsity_report,
)

__all__ = ["Pruning", "pruning_schedule"]


def pruning_schedule(amount: float, start: int, end: int, steps: int) -> list[tuple[int, float]]:
    """``[(epoch, target_amount), ...]``: the cubic schedule of Zhu & Gupta (2017) in ``steps`` steps.

    Step ``k`` (0-based) runs at the start of epoch ``start + round(k * (end - start) / (steps - 1))`` and brings the
    total pruned fraction to ``amount * (1 - (1 - (k + 1) / steps) ** 3)``: large steps early, while the network can
    still recover, small ones near the end. ``steps=1`` is one-shot pruning at ``start``.

    Example::

        >>> [(e, round(a, 3)) for e, a in pruning_schedule(0.5, 0, 2, 3)]
        [(0, 0.352), (1, 0.481), (2, 0.5)]
    """
    if steps == 1:
        return [(start, float(amount))]
    epochs = [start + math.floor(k * (end - start) / (steps - 1) + 0.5) for k in range(steps)]
    return [(e, float(amount) * (1.0 - (1.0 - (k + 1) / steps) ** 3)) for k, e in enumerate(epochs)]


class Pruning(L.Callback):
    """Prune the model at the start of chosen epochs and keep optimizer, scheduler, DDP and checkpoints consistent.

    ``mode="structured"`` (default) removes whole channels with torch-pruning, so every later step is cheaper; after
    each step the optimizer and LR scheduler are rebuilt at the same progress (Adam/SGD state of surviving channels
    is kept) and the model is re-wrapped under DDP. Checkpoints carry the pruned architecture, so
    ``MyModel.load_from_checkpoint(path)`` works for :class:`~lightning_speedups.optim.SpeedupMixin` models,
    :func:`lightning_speedups.load_checkpoint` for any module, and ``trainer.fit(ckpt_path=...)`` rebuilds the
    structure right before the weights load. Models with attention have their feed-forward blocks pruned (see
    :func:`~lightning_speedups.functional.pruning.prune_structured`). ``mode="unstructured"`` zeros weights with
    parametrized masks (no speedup on dense kernels; correct where a parent reads the weight directly, as attention
    does); checkpoints hold clean ``weight`` keys and the masks live in the callback state.

    Args:
        mode: ``"structured"`` or ``"unstructured"``.
        amount: final fraction of channels (structured) or weights (unstructured) removed, in ``[0, 1)``.
        start_epoch: epoch at whose start pruning begins (0 = before any training).
        end_epoch: epoch of the last step (default: ``start_epoch``).
        steps: number of pruning steps between ``start_epoch`` and ``end_epoch`` (cubic schedule, see
            :func:`pruning_schedule`); ``1`` = one-shot.
        importance: ``"l1"`` / ``"l2"`` magnitude; structured only: ``"taylor"`` (gradients of the previous epoch's last
            batch, needs ``start_epoch >= 1``) and ``"bn_scale"``.
        ignored_layers: module names never pruned; ``None`` = the final classifier layer.
        global_pruning: rank channels / weights across layers instead of per layer.
        make_permanent: unstructured only: fold masks into the weights when training ends.
        example_inputs: input for tracing (structured); default ``pl_module.example_input_array``, else the first
            two samples of the first training batch.
        round_to: structured only: keep channel counts multiples of this.

    Example::

        >>> cb = Pruning(amount=0.5, start_epoch=0, end_epoch=2, steps=3)
        >>> [round(a, 2) for _, a in cb.schedule]
        [0.35, 0.48, 0.5]
    """

    def __init__(
        self,
        mode: str = "structured",
        amount: float = 0.5,
        start_epoch: int = 0,
        end_epoch: int | None = None,
        steps: int = 1,
        importance: str = "l1",
        ignored_layers: Sequence[str] | None = None,
        global_pruning: bool = False,
        make_permanent: bool = True,
        example_inputs: Any = None,
        round_to: int | None = None,
    ) -> None:
        check_choice("mode", mode, ["structured", "unstructured"])
        check_range("amount", amount, 0.0, 1.0, high_inclusive=False, hint="a fraction, e.g. 0.5 for half.")
        allowed = STRUCTURED_IMPORTANCES if mode == "structured" else UNSTRUCTURED_IMPORTANCES
        check_choice("importance", importance, allowed, hint="taylor and bn_scale rank whole channels (structured).")
        check_int("start_epoch", start_epoch, 0)
        end_epoch = start_epoch if end_epoch is None else end_epoch
        check_int("end_epoch", end_epoch, start_epoch, hint="the last epoch that prunes; not before `start_epoch`.")
        epochs = f"[{start_epoch}, {end_epoch}]"
        check_int(
            "steps",
            steps,
            1,
            end_epoch - start_epoch + 1,
            hint=f"pruning runs at most once per epoch in {epochs}; widen the epoch range.",
        )
        if importance == "taylor" and start_epoch < 1:
            raise SpeedupConfigError(
                "`importance`='taylor' with `start_epoch`=0 has no gradients to rank channels with. Allowed values: "
                "start_epoch >= 1. HINT: or use importance='l1'."
            )
        if mode == "structured" and _torch_pruning_missing():
            raise SpeedupConfigError(
                "`mode`='structured' needs the optional package `torch_pruning`. Allowed values: 'unstructured' "
                "without it. HINT: pip install 'lightning-speedups[pruning]'."
            )
        self.mode = mode
        self.amount = float(amount)
        self.importance = importance
        self.start_epoch = start_epoch
        self.end_epoch = end_epoch
        self.steps = steps
        self.ignored_layers = None if ignored_layers is None else list(ignored_layers)
        self.global_pruning = global_pruning
        self.make_permanent = make_permanent
        self.round_to = round_to
        self.example_inputs = example_inputs
        self.schedule = pruning_schedule(self.amount, start_epoch, end_epoch, steps)
        # mutable state (saved in checkpoints)
        self.steps_done = 0
        self.applied = 0.0
        self.params_dense: int | None = None
        self.channels: dict[str, int] = {}  # dense channels per prunable layer: schedule targets are relative to them
        self._masks: dict[str, torch.Tensor] = {}
        self._originals: dict[str, dict[str, torch.Tensor]] = {}  # masked weight norms' raw (g, v), for a resume
        self._model: L.LightningModule | None = None
        self._ignored_names: list[str] | None = None
        self._batch_inputs: Any = None  # example input derived from the first training batch
        self.last_summary: PruningSummary | None = None

    @property
    @override
    def state_key(self) -> str:
        return self._generate_state_key(mode=self.mode, amount=self.amount)

    # ------------------------------------------------------------------ setup / state
    def _inputs(self, pl_module: L.LightningModule) -> Any:
        x = self.example_inputs if self.example_inputs is not None else pl_module.example_input_array
        if x is None:
            x = self._batch_inputs
        return None if x is None else move_data_to_device(x, pl_module.device)

    def _ignored(self, pl_module: L.LightningModule) -> list[str]:
        if self.ignored_layers is not None:
            return self.ignored_layers
        if self._ignored_names is None:
            # structured: every layer on a path to an output keeps its width; masks change no shape: the heads only
            every_path = self.mode == "structured"
            self._ignored_names = default_ignored_layers(pl_module, self._inputs(pl_module), every_path)
        return self._ignored_names

    def _restore_from(self, pl_module: L.LightningModule, checkpoint: Any) -> None:
        # runs right before the strategy loads the weights: rebuild the pruned shapes so the strict load fits
        apply_structure_records(pl_module, checkpoint)
        own = (checkpoint.get("callbacks") or {}).get(self.state_key)
        if own is not None:
            self.load_state_dict(own)

    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        before_model_weights_load(
            trainer.strategy, f"pruning:{self.state_key}", lambda ckpt: self._restore_from(pl_module, ckpt)
        )
        ignored = self._ignored(pl_module) if self.ignored_layers is not None else None
        if self.mode == "unstructured":
            refuse_sharded(
                trainer,
                "Pruning(mode='unstructured')",
                "masks are parametrizations added after the "
                "strategy has flattened the weights, which its flat parameters cannot follow; prune with "
                "prune_unstructured() before fitting, or under 'ddp'.",
            )
            ignored = self._ignored(pl_module)
            # unknown names, and weights a mask cannot stack on, raise here
            if not mask_tensors(pl_module, resolve_layers(pl_module, ignored)):
                raise SpeedupConfigError(
                    f"`ignored_layers`={ignored!r} leaves no conv/linear layer of {type(pl_module).__name__} to prune "
                    "(nor a recurrent one). Allowed values: a list that leaves at least one layer."
                )
            return
        from lightning.pytorch.strategies import DDPStrategy, SingleDeviceStrategy

        from lightning_speedups.callbacks.compile import TorchCompile

        if any(isinstance(cb, TorchCompile) for cb in trainer.callbacks):
            raise SpeedupConfigError(
                "`Pruning(mode='structured')` with `TorchCompile` is refused: structural pruning changes parameter "
                "shapes mid-run, which forces a full recompile after every pruning step. Allowed values: one of the "
                "two per run. HINT: prune in one run, then compile the pruned model in the next (load_checkpoint)."
            )
        if not isinstance(trainer.strategy, (SingleDeviceStrategy, DDPStrategy)):
            raise SpeedupConfigError(
                f"`strategy`={type(trainer.strategy).__name__} is not supported by structured pruning. Allowed "
                "values: single device, 'ddp', 'ddp_spawn'. HINT: prune with prune_structured() before fitting."
            )
        if ignored is not None:
            resolve_layers(pl_module, ignored)  # unknown names raise before any tracing
        if self._inputs(pl_module) is None:
            self._batch_inputs = self._example_from_data(trainer, pl_module)
        inputs = self._inputs(pl_module)
        # validate the whole schedule now: the final amount is pruned, checked and undone (refuses layers that would
        # lose every channel and models the pruned shapes would break), and the dense widths are noted
        scorer = self.importance if self.importance != "taylor" else "l1"  # no gradients yet; only shapes matter
        plan = prune_structured(
            pl_module,
            inputs,
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
                "Pruning(example_inputs=torch.zeros(1, 3, 32, 32)) or set self.example_input_array."
            )
        return inputs

    @override
    def state_dict(self) -> dict[str, Any]:
        masks = dict(self._masks)
        originals = dict(self._originals)
        if self.mode == "unstructured" and self._model is not None:
            live = {k: m.bool().clone() for k, m in named_masks(self._model).items()}
            masks = live or masks  # after make_permanent the last masks are kept for a later resume
            originals = weight_norm_originals(self._model) if live else {}
        return {
            "steps_done": self.steps_done,
            "applied": self.applied,
            "params_dense": self.params_dense,
            "channels": dict(self.channels),
            "masks": masks,
            "weight_norm_originals": originals,
        }

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.steps_done = int(state_dict.get("steps_done", 0))
        self.applied = float(state_dict.get("applied", 0.0))
        self.params_dense = state_dict.get("params_dense")
        self._masks = dict(state_dict.get("masks") or {})
        self._originals = dict(state_dict.get("weight_norm_originals") or {})
        self.channels = dict(state_dict.get("channels") or {})

    @override
    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._model = pl_module
        if self.params_dense is None:
            self.params_dense = sum(p.numel() for p in pl_module.parameters())
        if self.mode == "unstructured" and self._masks:  # resume: weights are loaded, re-attach the masks
            for key, mask in self._masks.items():
                module, name = resolve_mask_key(pl_module, key)  # a module name, or `rnn.weight_hh_l0`
                attach_mask(module, mask, name)
            # the checkpoint's weights have the masks folded into each weight norm's g and v; the raw pair
            # trains on exactly as before the stop
            restore_weight_norm_originals(pl_module, self._originals)
            rewrap_ddp(trainer)  # parametrizing re-sets the weights: DDP's gradient hooks must be registered anew

    # ------------------------------------------------------------------ pruning
    @override
    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        due = [(e, a) for e, a in self.schedule[self.steps_done :] if e <= trainer.current_epoch]
        if not due:
            return
        target = due[-1][1]  # several steps due (e.g. resumed late): jump to the latest target
        if self.mode == "structured":
            summary = self._prune_structured(trainer, pl_module, target)
        else:
            first = not masked_modules(pl_module)
            summary = prune_unstructured(
                pl_module,
                target,
                self.importance,
                self._ignored(pl_module),
                "global" if self.global_pruning else "layer",
            )
            if first:
                rewrap_ddp(trainer)  # parametrizing re-sets the weights: DDP's gradient hooks must be registered anew
        self.steps_done += len(due)
        self.applied = target
        self.last_summary = summary
        self._log(trainer, pl_module, target)

    def _prune_structured(self, trainer: L.Trainer, pl_module: L.LightningModule, target: float) -> PruningSummary:
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
            self._check_same_plan(trainer, pl_module, summary)
        stats = rebuild_optimizers(trainer, pl_module, summary.origins)
        rank_zero_info(
            f"Pruning: {summary.params_before:,} -> {summary.params_after:,} parameters, MACs {summary.macs_before:,} "
            f"-> {summary.macs_after:,}; optimizer state carried for {stats['carried']}, reset for {stats['reset']}."
        )
        return summary

    @staticmethod
    def _check_same_plan(trainer: L.Trainer, pl_module: L.LightningModule, summary: PruningSummary) -> None:
        # every rank ranks the same (DDP-synchronised) weights, so the kept channels must agree: verify it
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

    def _log(self, trainer: L.Trainer, pl_module: L.LightningModule, target: float) -> None:
        total = sparsity_report(pl_module).total  # shared parameters counted once
        masked = sum(int((m == 0).sum()) for m in named_masks(pl_module).values())
        dense = self.params_dense or total
        values = {
            "pruning/amount": target,
            "pruning/params": float(total - masked),  # parameters left (structured) or unmasked (unstructured)
            "pruning/sparsity": 1.0 - (total - masked) / max(dense, 1),
        }
        inputs = self._inputs(pl_module)
        if inputs is not None:
            values["pruning/macs"] = float(count_macs(pl_module, inputs))
        for key, value in values.items():
            pl_module.log(key, value, on_step=False, on_epoch=True, sync_dist=True)  # same on every rank

    # ------------------------------------------------------------------ end / checkpoints
    @override
    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.mode == "unstructured" and self.make_permanent:
            self._masks = {k: m.bool().clone() for k, m in named_masks(pl_module).items()}
            make_pruning_permanent(pl_module)

    @override
    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != "fit" or not is_spawn_launcher(trainer):
            return
        # ddp_spawn: this process is a worker; the launcher hands rank 0's state_dict to the main process's model
        if self.mode == "unstructured":
            make_pruning_permanent(pl_module)  # clean `weight` keys, or the main process would skip them silently
        elif self.steps_done > 0 and trainer.global_rank == 0 and spawn_drop_returned_weights(trainer):
            # the main process's unpruned model cannot take pruned shapes (non-strict load still fails on sizes)
            rank_zero_warn(
                "Pruning under a spawn launcher: the model object in the main process keeps its pre-fit weights, "
                "because it cannot take the pruned shapes. Load the trained model from a checkpoint instead, e.g. "
                "`lightning_speedups.load_checkpoint(MyModel(), trainer.checkpoint_callback.best_model_path)`, or "
                "use strategy='ddp'."
            )

    @override
    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        if self.mode == "structured" and self.steps_done > 0:
            store_structure_record(checkpoint, RECORD_KEY, pruned_structure_record(pl_module))
        if "state_dict" in checkpoint:
            checkpoint["state_dict"] = clean_pruned_state_dict(checkpoint["state_dict"])


def _torch_pruning_missing() -> bool:
    """True when torch-pruning cannot be imported (checked without importing it)."""
    return importlib.util.find_spec("torch_pruning") is None


register_technique(
    TechniqueInfo(
        name="pruning",
        callback=Pruning,
        functional=prune_structured,
        summary="Structural channel pruning (torch-pruning) that shrinks every step; or correct mask pruning.",
        requires=("torch_pruning",),
        mission_tip="4",
        bench="lightning_speedups.benchmarks.pruning:run",
        example_kwargs={"amount": 0.5, "start_epoch": 0},
        needs=("torch_pruning",),
    )
)
