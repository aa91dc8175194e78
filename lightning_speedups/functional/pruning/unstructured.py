"""Mask pruning: zero the smallest weights of conv/linear layers (HF ``Conv1D`` too); correct for attention, no speedup
on dense kernels."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from torch.nn.utils import parametrize

from lightning_speedups._errors import SpeedupConfigError, check_choice, check_range
from lightning_speedups._heads import is_conv_or_linear
from lightning_speedups.functional.pruning.common import (
    PruningSummary,
    default_ignored_layers,
    resolve_layers,
    sparsity_report,
)
from lightning_speedups.functional.pruning.masks import (
    attach_mask,
    check_maskable,
    effective_weight,
    mask_key,
    masked_tensor_names,
)

__all__ = ["UNSTRUCTURED_IMPORTANCES", "mask_targets", "mask_tensors", "maskable_names", "prune_unstructured"]

UNSTRUCTURED_IMPORTANCES = ("l1", "l2")


def maskable_names(module: nn.Module) -> list[str]:
    """The weight tensors of ``module`` that mask pruning masks: ``weight`` of conv/linear (Hugging Face's ``Conv1D``
    too: GPT-2's linear layer, its weight stored ``(in, out)``; a mask is per element, so the layout does not matter),
    every ``weight_*`` of a recurrent layer (``weight_ih_l0``, ``weight_hh_l0``, ``weight_hr_l0`` with ``proj_size``,
    ``*_reverse``).

    Example::

        >>> maskable_names(nn.GRU(4, 4))
        ['weight_ih_l0', 'weight_hh_l0']
    """
    if isinstance(module, nn.RNNBase):  # names from the public hyper-parameters, as RNNBase builds them
        kinds = ["ih", "hh"] + (["hr"] if getattr(module, "proj_size", 0) > 0 else [])
        suffixes = ["", "_reverse"] if module.bidirectional else [""]
        return [f"weight_{k}_l{layer}{s}" for layer in range(module.num_layers) for s in suffixes for k in kinds]
    return ["weight"] if is_conv_or_linear(module) else []


def mask_targets(model: nn.Module, ignored: list[nn.Module]) -> list[tuple[str, nn.Module]]:
    """``(name, module)`` of every conv/linear/recurrent layer with a maskable weight, outside ``ignored``."""
    skip = {id(m) for layer in ignored for m in layer.modules()}
    return [(n, m) for n, m in model.named_modules() if maskable_names(m) and id(m) not in skip]


def mask_tensors(model: nn.Module, ignored: list[nn.Module]) -> list[tuple[str, nn.Module, str]]:
    """``(mask_key, module, tensor name)`` of every weight :func:`prune_unstructured` masks.

    Raises:
        SpeedupConfigError: a weight carries a parametrization a mask cannot stack on (checked before any change).
    """
    out = []
    for module_name, module in mask_targets(model, ignored):
        for name in maskable_names(module):
            check_maskable(module_name, module, name)
            out.append((mask_key(module_name, name), module, name))
    return out


def _masked_sparsity(model: nn.Module) -> float:
    """The fraction of parameters zeroed, masks applied, whatever the masked tensor's name or weight norm."""
    report = sparsity_report(model)  # applies `weight` masks with a single original and torch.nn.utils.prune pairs
    zeros = report.zeros
    with torch.no_grad():
        for module in model.modules():
            for name in masked_tensor_names(module):
                if not parametrize.is_parametrized(module, name):
                    continue
                plist = module.parametrizations[name]  # type: ignore[index]
                if name == "weight" and hasattr(plist, "original"):
                    continue  # already counted masked by sparsity_report
                raw = sum(int((p == 0).sum()) for p in plist.parameters(recurse=False))  # counted unmasked
                zeros += int((getattr(module, name) == 0).sum()) - raw
    return zeros / max(report.total, 1)


def prune_unstructured(
    model: nn.Module,
    amount: float,
    importance: str = "l1",
    ignored_layers: Sequence[str] | None = None,
    scope: str = "global",
) -> PruningSummary:
    """Zero ``amount`` of the conv/linear/recurrent weights with masks (no speedup on dense kernels).

    The masks are ``torch.nn.utils.parametrize`` parametrizations, so ``module.weight`` is ``original * mask``
    wherever it is read, including by parents that bypass the module's forward (``nn.MultiheadAttention`` reads
    ``out_proj.weight``), and recurrent layers (their forward re-reads ``weight_ih_l0``, ... on every call). A
    weight-normed weight is masked after its weight norm. The original ``Parameter`` objects are kept, so optimizers
    and DDP need no rebuild. Masks
    are narrowed in place on repeated calls (no memory growth), and a weight once pruned stays pruned. ``amount`` is
    the total target sparsity of the selected weights; :func:`make_pruning_permanent` folds the masks in.

    Args:
        model: module to mask in place.
        amount: target fraction of zero weights in ``[0, 1)``.
        importance: ``"l1"`` or ``"l2"`` (identical ranking for single weights).
        ignored_layers: module names left dense; ``None`` = the last conv/linear layer (the classifier).
        scope: ``"global"`` (one threshold over all selected weights) or ``"layer"`` (``amount`` per layer).

    Example::

        >>> model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 2))
        >>> prune_unstructured(model, 0.5).layers["0"]
        (64, 32)
    """
    check_range("amount", amount, 0.0, 1.0, high_inclusive=False, hint="a fraction of weights, e.g. 0.5.")
    check_choice("importance", importance, UNSTRUCTURED_IMPORTANCES, hint="taylor/bn_scale are structured-only.")
    check_choice("scope", scope, ["global", "layer"])
    if ignored_layers is None:
        ignored_layers = default_ignored_layers(model)
    targets = mask_tensors(model, resolve_layers(model, ignored_layers))  # refuses before any change
    if not targets:
        raise SpeedupConfigError(
            f"`ignored_layers`={list(ignored_layers)!r} leaves no conv/linear layer of {type(model).__name__} to "
            "prune (nor a recurrent one). Allowed values: a list that leaves at least one layer."
        )
    before = sparsity_report(model)
    # masked weights score 0: pruned stay pruned
    scores = [(key, m, name, effective_weight(m, name).abs()) for key, m, name in targets]
    if scope == "global":
        flat = torch.cat([s.flatten() for *_, s in scores])
        k = int(round(amount * flat.numel()))
        order = torch.argsort(flat, stable=True)
        keep_flat = torch.ones_like(flat, dtype=torch.bool)
        keep_flat[order[:k]] = False
        masks = list(torch.split(keep_flat, [s.numel() for *_, s in scores]))
    else:
        masks = []
        for *_, s in scores:
            keep = torch.ones(s.numel(), dtype=torch.bool, device=s.device)
            keep[torch.argsort(s.flatten(), stable=True)[: int(round(amount * s.numel()))]] = False
            masks.append(keep)
    summary = PruningSummary("unstructured", float(amount), before.total, before.total, 0.0)
    for (key, module, name, s), keep in zip(scores, masks):
        mask = attach_mask(module, keep.view_as(s).to(s.dtype), name)  # narrows an existing mask in place
        summary.layers[key] = (s.numel(), int((mask == 0).sum()))
    summary.sparsity = _masked_sparsity(model)
    return summary
