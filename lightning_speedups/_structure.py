"""Architecture records: how callbacks that change a model's structure make its checkpoints loadable.

A callback that changes parameter shapes (structural pruning) or inserts modules (QAT) stores a small *record* under
``checkpoint["lightning_speedups"][key]`` and registers a *hook* under the same key that re-applies the record to a
freshly built model. The hook runs before the strict ``load_state_dict``:

- ``SpeedupMixin.on_load_checkpoint`` calls :func:`apply_structure_records`, so ``MyModel.load_from_checkpoint(path)``
  works for models that use the mixin;
- callbacks call :func:`apply_structure_records` from ``setup()`` when ``trainer.ckpt_path`` is set, which runs before
  Lightning restores the weights, so resuming works for any LightningModule;
- plain modules use the functional loaders (e.g. ``load_pruned``) which read the same records.
"""

from __future__ import annotations

from collections.abc import Callable, MutableMapping
from typing import Any

import torch
from torch import nn

__all__ = ["CHECKPOINT_KEY", "register_structure_hook", "apply_structure_records", "store_structure_record"]

CHECKPOINT_KEY = "lightning_speedups"
# hooks in registration order: order matters when several techniques change one model (prune before quantize)
_HOOKS: dict[str, Callable[[nn.Module, Any], None]] = {}
_APPLIED_ATTR = "_lightning_speedups_applied"


def register_structure_hook(key: str, hook: Callable[[nn.Module, Any], None]) -> None:
    """Register ``hook(module, record)`` that rebuilds the structure described by ``record`` on ``module``."""
    _HOOKS[key] = hook


def store_structure_record(checkpoint: MutableMapping[str, Any], key: str, record: Any) -> None:
    """Store ``record`` for ``key`` in a checkpoint dict (call it from ``on_save_checkpoint``)."""
    checkpoint.setdefault(CHECKPOINT_KEY, {})[key] = record


def apply_structure_records(module: nn.Module, checkpoint: MutableMapping[str, Any]) -> list[str]:
    """Re-apply every stored architecture record to ``module``; return the keys that were applied.

    Idempotent per module instance: a record applied once (by the mixin or by a callback) is not applied twice.
    Records must be plain python (dicts, lists, ints, strings) so they compare by value and load with
    ``weights_only=True``; hooks should themselves be idempotent (rebuild to the recorded shapes).
    """
    records = checkpoint.get(CHECKPOINT_KEY) or {}
    done: dict[str, Any] = module.__dict__.setdefault(_APPLIED_ATTR, {})
    applied = []
    for key, hook in _HOOKS.items():
        if key not in records:
            continue
        record = records[key]
        if key in done and done[key] == record:  # records are plain python: equality means "already applied"
            continue
        hook(module, record)
        done[key] = record
        applied.append(key)
    return applied


def load_checkpoint_file(path: str, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Load a checkpoint file on CPU (``weights_only=False`` since Lightning checkpoints hold plain python objects)."""
    return torch.load(path, map_location=map_location, weights_only=False)
