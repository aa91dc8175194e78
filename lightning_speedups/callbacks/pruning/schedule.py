"""The schedule both pruning callbacks share: when to prune and how much, the example inputs, the state and the logs.

:class:`ScheduledPruning` decides *when* (the cubic schedule of :func:`pruning_schedule`, one step at the start of an
epoch); its two subclasses decide *how*: :class:`~lightning_speedups.StructuredPruning` removes
channels, :class:`~lightning_speedups.MaskPruning` zeros weights with masks.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, ClassVar

import lightning as L
from lightning.fabric.utilities.apply_func import move_data_to_device
from typing_extensions import override

from lightning_speedups._compat import before_model_weights_load, is_spawn_launcher
from lightning_speedups._errors import SpeedupConfigError, check_choice, check_int, check_range
from lightning_speedups._structure import apply_structure_records
from lightning_speedups.functional.pruning import (
    PruningSummary,
    clean_pruned_state_dict,
    count_macs,
    default_ignored_layers,
    sparsity_report,
)
from lightning_speedups.functional.pruning.masks import named_masks

__all__ = ["ScheduledPruning", "pruning_schedule"]


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


class ScheduledPruning(L.Callback):
    """Prune at the start of the epochs of a cubic schedule; the base of the two pruning callbacks.

    Subclasses set :attr:`mode` and :attr:`importances`, and implement :meth:`prune_to` (one step to a total
    target) and :meth:`check_environment` (their ``setup`` checks). The schedule, the example inputs, the state the
    checkpoints carry (``steps_done``, ``applied``, ``params_dense``) and the logged metrics are shared.

    Args:
        amount: final fraction removed, in ``[0, 1)``.
        start_epoch: epoch at whose start pruning begins (0 = before any training).
        end_epoch: epoch of the last step (default: ``start_epoch``).
        steps: number of pruning steps between ``start_epoch`` and ``end_epoch`` (cubic schedule, see
            :func:`pruning_schedule`); ``1`` = one-shot.
        importance: one of :attr:`importances`.
        ignored_layers: module names never pruned; ``None`` = the output layers.
        global_pruning: rank across layers instead of per layer.
        example_inputs: an input for tracing and MAC counts; default ``pl_module.example_input_array``.
    """

    #: ``"structured"`` or ``"unstructured"``: the ``mode`` of the deprecated ``Pruning(mode=...)``
    mode: ClassVar[str]
    #: the allowed values of ``importance``
    importances: ClassVar[tuple[str, ...]]

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
    ) -> None:
        check_range("amount", amount, 0.0, 1.0, high_inclusive=False, hint="a fraction, e.g. 0.5 for half.")
        hint = "taylor and bn_scale rank whole channels (structured)."
        check_choice("importance", importance, self.importances, hint=hint)
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
        self.amount = float(amount)
        self.importance = importance
        self.start_epoch = start_epoch
        self.end_epoch = end_epoch
        self.steps = steps
        self.ignored_layers = None if ignored_layers is None else list(ignored_layers)
        self.global_pruning = global_pruning
        self.example_inputs = example_inputs
        self.schedule = pruning_schedule(self.amount, start_epoch, end_epoch, steps)
        # mutable state (saved in checkpoints)
        self.steps_done = 0
        self.applied = 0.0
        self.params_dense: int | None = None
        self._model: L.LightningModule | None = None
        self._ignored_names: list[str] | None = None
        self._batch_inputs: Any = None  # example input derived from the first training batch
        self.last_summary: PruningSummary | None = None

    @property
    @override
    def state_key(self) -> str:
        # the key `Pruning(mode=...)` saved its state under: checkpoints load across the alias and the new classes
        return f"Pruning{ ({'mode': self.mode, 'amount': self.amount})!r}"

    # ------------------------------------------------------------------ what subclasses do
    def prune_to(self, trainer: L.Trainer, pl_module: L.LightningModule, target: float) -> PruningSummary:
        """Prune ``pl_module`` to the total fraction ``target`` (one step of the schedule)."""
        raise NotImplementedError

    def check_environment(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Refuse, before any step, a strategy, a callback or a model this kind of pruning cannot follow."""
        raise NotImplementedError

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
        self.check_environment(trainer, pl_module)

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"steps_done": self.steps_done, "applied": self.applied, "params_dense": self.params_dense}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.steps_done = int(state_dict.get("steps_done", 0))
        self.applied = float(state_dict.get("applied", 0.0))
        self.params_dense = state_dict.get("params_dense")

    @override
    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._model = pl_module
        if self.params_dense is None:
            self.params_dense = sum(p.numel() for p in pl_module.parameters())

    # ------------------------------------------------------------------ pruning
    @override
    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        due = [(e, a) for e, a in self.schedule[self.steps_done :] if e <= trainer.current_epoch]
        if not due:
            return
        target = due[-1][1]  # several steps due (e.g. resumed late): jump to the latest target
        summary = self.prune_to(trainer, pl_module, target)
        self.steps_done += len(due)
        self.applied = target
        self.last_summary = summary
        self._log(pl_module, target)

    def _log(self, pl_module: L.LightningModule, target: float) -> None:
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
    def spawn_worker_teardown(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """At the end of a fit in a spawned worker, before the launcher hands rank 0's weights to the main process."""

    @override
    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage == "fit" and is_spawn_launcher(trainer):
            self.spawn_worker_teardown(trainer, pl_module)

    @override
    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        if "state_dict" in checkpoint:
            checkpoint["state_dict"] = clean_pruned_state_dict(checkpoint["state_dict"])
