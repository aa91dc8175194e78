"""Mask pruning that every parent module sees: weight masks as ``torch.nn.utils.parametrize`` parametrizations.

``torch.nn.utils.prune`` recomputes ``weight = weight_orig * weight_mask`` in a forward *pre-hook* of the pruned
module. A parent that reads the weight without calling the module (``nn.MultiheadAttention`` reads
``out_proj.weight`` directly) gets a stale tensor from the previous step's graph, and the second ``backward`` fails.
A parametrization recomputes ``weight`` on every attribute access instead, so it is correct wherever the weight is
read, and the original ``nn.Parameter`` object is kept (optimizers and DDP need no rebuild).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn.utils import parametrize
from torch.nn.utils import prune as torch_prune

from lightning_speedups._structure import register_state_dict_cleaner

__all__ = [
    "WeightMask",
    "attach_mask",
    "clean_pruned_state_dict",
    "make_pruning_permanent",
    "masked_modules",
    "weight_mask",
]

_PARAM_PREFIX = "parametrizations.weight."


class WeightMask(nn.Module):
    """Parametrization ``weight -> weight * mask`` with the mask as a buffer (0 = pruned, 1 = kept)."""

    def __init__(self, mask: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("mask", mask)

    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        return weight * self.mask


def weight_mask(module: nn.Module) -> torch.Tensor | None:
    """The pruning mask of ``module.weight`` (a parametrization or a ``torch.nn.utils.prune`` hook), or ``None``.

    Example::

        >>> layer = nn.Linear(2, 2)
        >>> _ = attach_mask(layer, torch.tensor([[1.0, 0.0], [1.0, 1.0]]))
        >>> weight_mask(layer).tolist()
        [[1.0, 0.0], [1.0, 1.0]]
    """
    if parametrize.is_parametrized(module, "weight"):
        for p in module.parametrizations.weight:  # type: ignore[union-attr]
            if isinstance(p, WeightMask):
                return p.mask
    legacy = getattr(module, "weight_mask", None)  # masks made by torch.nn.utils.prune directly
    return legacy if isinstance(legacy, torch.Tensor) else None


def masked_modules(model: nn.Module) -> dict[str, nn.Module]:
    """``{name: module}`` of every module whose weight carries a pruning mask."""
    return {n: m for n, m in model.named_modules() if weight_mask(m) is not None}


def attach_mask(module: nn.Module, mask: torch.Tensor) -> torch.Tensor:
    """Mask ``module.weight`` in place; an existing mask is narrowed (a pruned weight stays pruned). Returns it."""
    mask = mask.to(device=module.weight.device, dtype=module.weight.dtype)
    current = weight_mask(module)
    if current is not None:
        current.copy_(mask * current)  # in place: no second parametrization, no memory growth
        return current
    parametrize.register_parametrization(module, "weight", WeightMask(mask))
    return weight_mask(module)  # type: ignore[return-value]


def make_pruning_permanent(model: nn.Module) -> int:
    """Fold every weight mask into its weight, keeping the same ``nn.Parameter`` object; return how many."""
    count = 0
    for module in model.modules():
        if parametrize.is_parametrized(module, "weight") and any(
            isinstance(p, WeightMask) for p in module.parametrizations.weight  # type: ignore[union-attr]
        ):
            parametrize.remove_parametrizations(module, "weight", leave_parametrized=True)
            count += 1
        for hook in list(module._forward_pre_hooks.values()):
            if isinstance(hook, torch_prune.BasePruningMethod):
                torch_prune.remove(module, hook._tensor_name)
                count += 1
    return count


def clean_pruned_state_dict(state_dict: dict[str, Any]) -> dict[str, Any]:
    """Replace masked-weight entries by the masked ``weight``, so the keys match an unpruned model.

    Handles parametrized weights (``x.parametrizations.weight.original`` + ``x.parametrizations.weight.0.mask``)
    and ``torch.nn.utils.prune`` pairs (``x.weight_orig`` + ``x.weight_mask``).
    """
    out = dict(state_dict)
    for key in [k for k in state_dict if k.endswith(_PARAM_PREFIX + "original")]:
        base = key[: -len(_PARAM_PREFIX + "original")]
        masks = [k for k in out if k.startswith(base + _PARAM_PREFIX) and k.endswith(".mask")]
        value = out.pop(key)
        for m in masks:
            value = value * out.pop(m)
        out[base + "weight"] = value
    for key in [k for k in state_dict if k.endswith("_orig")]:
        base = key[: -len("_orig")]
        if base + "_mask" in out:
            out[base] = out.pop(key) * out.pop(base + "_mask")
    return out


def effective_weight(module: nn.Module) -> torch.Tensor:
    """The weight as the forward sees it (mask applied), detached."""
    legacy = getattr(module, "weight_orig", None)
    if isinstance(legacy, torch.Tensor) and isinstance(getattr(module, "weight_mask", None), torch.Tensor):
        return (legacy * module.weight_mask).detach()  # the pre-hook refreshes `weight` only at the next forward
    return module.weight.detach()


register_state_dict_cleaner(clean_pruned_state_dict)
