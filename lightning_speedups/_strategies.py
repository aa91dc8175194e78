"""The Lightning strategies that shard the model, and the refusal of a technique that cannot follow them.

Under FSDP, DeepSpeed and model parallelism the module's parameters are flattened and split over the ranks: a rank's
``state_dict()`` holds its shard (flat 1-D pieces, some empty), and parametrizations or module swaps made after the
strategy wrapped the model break its flat parameters. Techniques that snapshot weights, mask them or swap layers
refuse these strategies in ``setup()``, before any step.
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch.strategies import DeepSpeedStrategy, FSDPStrategy, ModelParallelStrategy

from lightning_speedups._errors import SpeedupConfigError

__all__ = ["SHARDED_STRATEGIES", "refuse_manual_optimization", "refuse_sharded"]

SHARDED_STRATEGIES = (FSDPStrategy, DeepSpeedStrategy, ModelParallelStrategy)


def refuse_sharded(trainer: Any, technique: str, hint: str) -> None:
    """Raise :class:`SpeedupConfigError` naming the strategy when ``trainer`` shards the model.

    >>> import lightning as L
    >>> refuse_sharded(L.Trainer(accelerator="cpu", logger=False), "EMA", "...")  # single device: nothing raised
    """
    strategy = getattr(trainer, "strategy", None)
    if isinstance(strategy, SHARDED_STRATEGIES):
        raise SpeedupConfigError(
            f"`strategy`={type(strategy).__name__} is not supported by {technique}. Allowed values: single device, "
            f"'ddp', 'ddp_spawn' (unsharded strategies). HINT: {hint}"
        )


def refuse_manual_optimization(pl_module: Any, technique: str, hint: str | None = None) -> None:
    """Raise :class:`SpeedupConfigError` when ``pl_module`` steps its own optimizer (``automatic_optimization=False``):
    ``technique`` replaces the optimizer Lightning steps, which such a module never hands to Lightning.

    >>> import lightning as L
    >>> refuse_manual_optimization(L.LightningModule(), "Muon")  # automatic optimization: nothing raised
    """
    if not pl_module.automatic_optimization:
        raise SpeedupConfigError(
            f"{technique} replaces the optimizer Lightning steps, but `automatic_optimization`=False: the module steps "
            "its own. Allowed values: automatic optimization." + (f" HINT: {hint}" if hint else "")
        )
