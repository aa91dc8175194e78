"""Records of a structurally pruned model's shapes, so its checkpoints load into a freshly built model."""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import nn

from lightning_speedups._structure import CHECKPOINT_KEY, load_checkpoint, register_structure_hook
from lightning_speedups.functional.pruning.masks import clean_pruned_state_dict

__all__ = ["RECORD_KEY", "apply_pruned_structure", "load_pruned", "pruned_structure_record", "save_pruned"]

RECORD_KEY = "pruning"
# integer attributes torch-pruning rewrites when it shrinks a layer; recorded so a fresh model can be resized
_SHAPE_ATTRS = (
    "in_channels",
    "out_channels",
    "groups",
    "in_features",
    "out_features",
    "num_features",
    "num_channels",
    "num_groups",
    "normalized_shape",
    "embed_dim",
    "kdim",
    "vdim",
    "num_heads",
    "head_dim",
    "hidden_size",
    "input_size",
    "proj_size",
    "embedding_dim",
)


def pruned_structure_record(model: nn.Module) -> dict[str, Any]:
    """Plain-python description of the model's tensor shapes and layer sizes (loadable with ``weights_only=True``)."""
    shapes = {n: list(t.shape) for n, t in model.state_dict(keep_vars=True).items() if isinstance(t, torch.Tensor)}
    attrs: dict[str, dict[str, Any]] = {}
    for name, module in model.named_modules():
        found = {}
        for attr in _SHAPE_ATTRS:
            value = module.__dict__.get(attr)
            if isinstance(value, int) and not isinstance(value, bool):
                found[attr] = value
            elif isinstance(value, tuple) and all(isinstance(v, int) for v in value):
                found[attr] = list(value)
        if found:
            attrs[name] = found
    return {"version": 1, "shapes": shapes, "attrs": attrs}


def apply_pruned_structure(model: nn.Module, record: dict[str, Any]) -> None:
    """Resize a freshly built model's tensors and layer attributes to a recorded (pruned) structure; idempotent."""
    for name, shape in record.get("shapes", {}).items():
        mod_name, _, attr = name.rpartition(".")
        try:
            module = model.get_submodule(mod_name)
        except AttributeError:
            continue
        for store in (module._parameters, module._buffers):
            old = store.get(attr)
            if old is None or list(old.shape) == list(shape):
                continue
            new = torch.empty(shape, dtype=old.dtype, device=old.device)
            store[attr] = nn.Parameter(new, requires_grad=old.requires_grad) if isinstance(old, nn.Parameter) else new
    for mod_name, values in record.get("attrs", {}).items():
        try:
            module = model.get_submodule(mod_name)
        except AttributeError:
            continue
        for attr, value in values.items():
            if attr in module.__dict__:
                setattr(module, attr, tuple(value) if isinstance(value, list) else value)


register_structure_hook(RECORD_KEY, apply_pruned_structure)


def save_pruned(model: nn.Module, path: str | os.PathLike[str]) -> None:
    """Save a (structurally or mask-) pruned plain module: clean state dict + structure record."""
    checkpoint = {
        "state_dict": clean_pruned_state_dict(model.state_dict()),
        CHECKPOINT_KEY: {RECORD_KEY: pruned_structure_record(model)},
    }
    torch.save(checkpoint, path)


def load_pruned(model: nn.Module, checkpoint_path: str | os.PathLike[str], strict: bool = True) -> nn.Module:
    """Load a pruned checkpoint (from :func:`save_pruned` or a Lightning checkpoint) into a freshly built model.

    The same as :func:`lightning_speedups.load_checkpoint`: the recorded structure is applied first, then the
    weights are loaded strictly, with ``weights_only=True``; on error the model is left as it was.

    Example::

        >>> import tempfile, os
        >>> from lightning_speedups.demo import DemoClassifier
        >>> from lightning_speedups.functional.pruning import prune_structured
        >>> model = DemoClassifier(width=8)
        >>> _ = prune_structured(model, torch.zeros(1, 3, 32, 32), 0.5)
        >>> path = os.path.join(tempfile.mkdtemp(), "pruned.pt")
        >>> save_pruned(model, path)
        >>> fresh = load_pruned(DemoClassifier(width=8), path)
        >>> fresh.head.in_features
        16
    """
    return load_checkpoint(model, checkpoint_path, strict=strict)
