"""Architecture records: how callbacks that change a model's structure make its checkpoints loadable.

A callback that changes parameter shapes (structural pruning) or inserts modules (QAT) stores a small *record* under
``checkpoint["lightning_speedups"][key]`` and registers a *hook* under the same key that re-applies the record to a
freshly built model. The hook runs before the strict ``load_state_dict``:

- ``SpeedupMixin.on_load_checkpoint`` calls :func:`apply_structure_records`, so ``MyModel.load_from_checkpoint(path)``
  works for models that use the mixin;
- callbacks register :func:`apply_structure_records` in ``setup()`` to run right before the strategy loads a
  checkpoint's weights (``_compat.before_model_weights_load``), whatever Lightning's hook order, so resuming works
  for plain LightningModules too;
- :func:`load_checkpoint` does the same for any module, Lightning or not (``load_checkpoint(MyModel(), path)``).
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Callable, Mapping, MutableMapping
from typing import Any

import torch
from torch import nn

from lightning_speedups._errors import SpeedupConfigError

__all__ = [
    "CHECKPOINT_KEY",
    "ModuleSnapshot",
    "apply_structure_records",
    "keep_metadata",
    "load_checkpoint",
    "register_state_dict_cleaner",
    "register_structure_hook",
    "store_structure_record",
]

CHECKPOINT_KEY = "lightning_speedups"
# hooks in registration order: order matters when several techniques change one model (prune before quantize)
_HOOKS: dict[str, Callable[[nn.Module, Any], None]] = {}
_APPLIED_ATTR = "_lightning_speedups_applied"
_CLEANERS: list[Callable[[dict[str, Any]], dict[str, Any]]] = []


def register_state_dict_cleaner(fn: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
    """Register ``fn(state_dict) -> state_dict`` that :func:`load_checkpoint` applies before loading (e.g. masks)."""
    if fn not in _CLEANERS:
        _CLEANERS.append(fn)


def keep_metadata(
    source: Mapping[str, Any], state: Mapping[str, Any], drop: Callable[[str], bool] | None = None
) -> dict[str, Any]:
    """``state`` as an ``OrderedDict`` that carries ``source``'s ``_metadata``, without the prefixes ``drop`` rejects.

    ``_metadata`` maps module prefixes to ``{"version": ...}``, which ``_load_from_state_dict`` reads (BatchNorm, and
    modules that refuse a state dict without a version); a plain ``dict(state_dict)`` copy loses it.

    Example::

        >>> sd = nn.BatchNorm1d(2).state_dict()
        >>> keep_metadata(sd, dict(sd))._metadata[""]["version"]
        2
    """
    out: dict[str, Any] = OrderedDict(state)
    metadata = getattr(source, "_metadata", None)
    if metadata is not None:
        kept = {k: dict(v) for k, v in metadata.items() if drop is None or not drop(k)}
        out._metadata = OrderedDict(kept)  # type: ignore[attr-defined]
    return out


def _clean_state_dict(state: Mapping[str, Any]) -> dict[str, Any]:
    out = keep_metadata(state, state)
    for fn in _CLEANERS:
        cleaned = fn(out)
        out = cleaned if hasattr(cleaned, "_metadata") else keep_metadata(out, cleaned)  # a cleaner may drop it
    return out


def register_structure_hook(key: str, hook: Callable[[nn.Module, Any], None]) -> None:
    """Register ``hook(module, record)`` that rebuilds the structure described by ``record`` on ``module``."""
    _HOOKS[key] = hook


def store_structure_record(checkpoint: MutableMapping[str, Any], key: str, record: Any) -> None:
    """Store ``record`` for ``key`` in a checkpoint dict (call it from ``on_save_checkpoint``)."""
    checkpoint.setdefault(CHECKPOINT_KEY, {})[key] = record


def apply_structure_records(module: nn.Module, checkpoint: Mapping[str, Any]) -> list[str]:
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


class ModuleSnapshot:
    """Everything an in-place structural change rewrites, so a failed change can be undone exactly.

    Structural changes (torch-pruning, fake-quantizer insertion, structure records) replace tensors and child modules
    (``module.weight = nn.Parameter(...)``, ``parent.fc = FakeQuantLinear(...)``) and integer attributes
    (``out_features``) rather than mutating tensors in place, so keeping references to the old objects is enough:
    :meth:`restore` puts them back (same ``Parameter`` objects, so optimizers and DDP stay valid). Tensors changed in
    place (``.data =``, ``copy_``) are not covered; no technique here does that.
    """

    def __init__(self, model: nn.Module) -> None:
        self._saved = [
            (m, dict(m.__dict__), dict(m._parameters), dict(m._buffers), dict(m._modules), m.training)
            for m in model.modules()
        ]

    def restore(self) -> None:
        for module, attrs, params, buffers, modules, training in self._saved:
            for key in [k for k in module.__dict__ if k not in attrs]:
                del module.__dict__[key]
            module.__dict__.update(attrs)
            for store, saved in ((module._parameters, params), (module._buffers, buffers), (module._modules, modules)):
                store.clear()
                store.update(saved)
            module.training = training


def _read_checkpoint(path: str | os.PathLike[str]) -> Mapping[str, Any]:
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise SpeedupConfigError(f"`path`={str(path)!r} does not exist. Allowed values: a checkpoint file.") from None
    except Exception as err:  # unpickling refused (not plain data) or not a torch file at all
        raise SpeedupConfigError(
            f"`path`={str(path)!r} is not a checkpoint that loads with `weights_only=True`: {err}. Allowed values: a "
            "Lightning checkpoint or a file from save_pruned/save_quantized. HINT: checkpoints from this library hold "
            "only tensors and plain data; one that needs pickled classes is refused on purpose."
        ) from err
    if not isinstance(checkpoint, Mapping):
        raise SpeedupConfigError(
            f"`path`={str(path)!r} holds a {type(checkpoint).__name__}, not a checkpoint dict. Allowed values: a "
            "Lightning checkpoint or a file from save_pruned/save_quantized."
        )
    return checkpoint


def load_checkpoint(model: nn.Module, path: str | os.PathLike[str], strict: bool = True) -> nn.Module:
    """Load a checkpoint into a freshly built ``model``, re-applying the structure it records; return ``model``.

    The one reload for any module, Lightning or not: the records a checkpoint carries (pruned shapes, fake
    quantizers) are applied first, then the weights load strictly. The file is read with ``weights_only=True`` (it
    cannot run code). On any error the model is left exactly as it was.

    Args:
        model: a new instance of the architecture that was trained (the same constructor arguments).
        path: a Lightning checkpoint (``trainer.save_checkpoint``, ``ModelCheckpoint``) or a file from
            :func:`~lightning_speedups.functional.save_pruned`; a bare ``state_dict`` file works too.
        strict: passed to ``load_state_dict``.

    Raises:
        SpeedupConfigError: missing or unreadable file, a record this version cannot apply, or weights that do not
            match the model (the message lists the missing and unexpected keys).

    Example::

        >>> import os, tempfile
        >>> path = os.path.join(tempfile.mkdtemp(), "m.ckpt")
        >>> torch.save({"state_dict": nn.Linear(2, 1).state_dict()}, path)
        >>> load_checkpoint(nn.Linear(2, 1), path).out_features
        1
    """
    checkpoint = _read_checkpoint(path)
    state = checkpoint.get("state_dict", checkpoint)
    if not isinstance(state, Mapping) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise SpeedupConfigError(
            f"`path`={str(path)!r} has no `state_dict` of tensors (top-level keys: {sorted(checkpoint)[:8]!r}). "
            "Allowed values: a Lightning checkpoint, a save_pruned file or a state_dict file."
        )
    records = checkpoint.get(CHECKPOINT_KEY) or {}
    unknown = sorted(set(records) - set(_HOOKS))
    if unknown:
        raise SpeedupConfigError(
            f"`path`={str(path)!r} records structure changes this installation cannot rebuild: {unknown!r}. Allowed "
            f"values: records of {sorted(_HOOKS)!r}. HINT: import the module that registers them (for example "
            "`import lightning_speedups`) or upgrade lightning-speedups."
        )
    snapshot = ModuleSnapshot(model)
    try:
        apply_structure_records(model, checkpoint)
        result = model.load_state_dict(_clean_state_dict(state), strict=strict)
    except Exception as err:
        snapshot.restore()
        model.__dict__.pop(_APPLIED_ATTR, None)
        raise SpeedupConfigError(
            f"`path`={str(path)!r} does not fit {type(model).__name__}: {err}. The model is unchanged. Allowed values: "
            "a checkpoint of this architecture. HINT: build the model with the constructor arguments it was trained "
            "with."
        ) from err
    del result
    return model
