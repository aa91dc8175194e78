"""ProgressiveResizing's batch hook: run a function on every batch right after the strategy moved it to the device.

Lightning's loops move each batch with the public ``Strategy.batch_to_device(batch, device=None, dataloader_idx=0)``
(through ``call._call_strategy_hook(trainer, "batch_to_device", ...)``) and hand its return value to
``training_step`` and to every batch hook. Wrapping that method on the running strategy *instance* lets a callback
replace the batch, which its own ``on_*_batch_start`` hooks cannot do. Unlike an override of the module's
``on_after_batch_transfer``, it works whatever the loader yields (tuples, dicts, bare tensors) and whether or not a
datamodule (which Lightning prefers for that hook, with a warning) is attached. Loops whose ``training_step`` takes a
``dataloader_iter`` do not move batches, so the hook does not run there.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["after_batch_to_device"]

_HOOKS_ATTR = "_lightning_speedups_after_batch_to_device"


def after_batch_to_device(strategy: Any, key: str, fn: Callable[[Any, int], Any] | None) -> None:
    """Pass every batch through ``fn(batch, dataloader_idx) -> batch`` after ``strategy.batch_to_device``.

    Hooks are keyed (a callback registering twice replaces its hook) and run in registration order. ``fn=None``
    removes the hook under ``key``; with none left the strategy's own method is back.
    """
    hooks: dict[str, Callable[[Any, int], Any]] | None = strategy.__dict__.get(_HOOKS_ATTR)
    if fn is None:
        if hooks is not None:
            hooks.pop(key, None)
            if not hooks:
                del strategy.__dict__[_HOOKS_ATTR]
                strategy.__dict__.pop("batch_to_device", None)
        return
    if hooks is None:
        hooks = {}
        original = strategy.batch_to_device

        def batch_to_device(batch: Any, device: Any = None, dataloader_idx: int = 0) -> Any:
            batch = original(batch, device, dataloader_idx)
            for hook in list(hooks.values()):
                batch = hook(batch, dataloader_idx)
            return batch

        strategy.__dict__[_HOOKS_ATTR] = hooks
        strategy.batch_to_device = batch_to_device
    hooks[key] = fn
