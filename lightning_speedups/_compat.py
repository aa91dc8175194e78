"""The one seam to the frameworks' internals: every private Lightning, torch-pruning or torchao name lives here.

Each touch is a small named function whose docstring says what it relies on. ``tests/test_compat.py`` checks each
of them against the installed versions, so an upgrade that moves a private name fails there with a clear message
instead of deep inside a callback.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["before_model_weights_load"]

_HOOKS_ATTR = "_lightning_speedups_before_load"


def before_model_weights_load(strategy: Any, key: str, fn: Callable[[Mapping[str, Any]], None]) -> None:
    """Call ``fn(checkpoint)`` right before ``strategy`` loads a checkpoint's weights into the LightningModule.

    Relies on: Lightning's checkpoint connector restoring the weights through the *public*
    ``Strategy.load_model_state_dict(checkpoint, strict)`` (2.0 - 2.6). Wrapping that method on the strategy
    instance runs the hook whatever the order of ``setup`` / ``configure_model`` / ``trainer.ckpt_path``, which
    changed between Lightning releases. Hooks are keyed, so a callback that registers twice replaces its hook.
    """
    hooks: dict[str, Callable[[Mapping[str, Any]], None]] | None = strategy.__dict__.get(_HOOKS_ATTR)
    if hooks is None:
        hooks = {}
        original = strategy.load_model_state_dict

        def load_model_state_dict(checkpoint: Mapping[str, Any], *args: Any, **kwargs: Any) -> Any:
            for hook in list(hooks.values()):
                hook(checkpoint)
            return original(checkpoint, *args, **kwargs)

        strategy.__dict__[_HOOKS_ATTR] = hooks
        strategy.load_model_state_dict = load_model_state_dict
    hooks[key] = fn
