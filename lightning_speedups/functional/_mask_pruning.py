"""Mask pruning: zero the smallest weights of conv/linear layers; correct for attention, no speedup on dense kernels."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from lightning_speedups._errors import SpeedupConfigError, check_choice, check_range
from lightning_speedups.functional._masks import attach_mask, effective_weight
from lightning_speedups.functional._prune_common import (
    PRUNABLE,
    PruningSummary,
    default_ignored_layers,
    resolve_layers,
    sparsity_report,
)

__all__ = ["UNSTRUCTURED_IMPORTANCES", "mask_targets", "prune_unstructured"]

UNSTRUCTURED_IMPORTANCES = ("l1", "l2")


def mask_targets(model: nn.Module, ignored: list[nn.Module]) -> list[tuple[str, nn.Module]]:
    skip = {id(m) for layer in ignored for m in layer.modules()}
    return [(n, m) for n, m in model.named_modules() if isinstance(m, PRUNABLE) and id(m) not in skip]


def prune_unstructured(
    model: nn.Module,
    amount: float,
    importance: str = "l1",
    ignored_layers: Sequence[str] | None = None,
    scope: str = "global",
) -> PruningSummary:
    """Zero ``amount`` of the conv/linear weights with masks (no speedup on dense kernels).

    The masks are ``torch.nn.utils.parametrize`` parametrizations, so ``module.weight`` is ``original * mask``
    wherever it is read, including by parents that bypass the module's forward (``nn.MultiheadAttention`` reads
    ``out_proj.weight``). The original ``Parameter`` objects are kept, so optimizers and DDP need no rebuild. Masks
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
    targets = mask_targets(model, resolve_layers(model, ignored_layers))
    if not targets:
        raise SpeedupConfigError(
            f"`ignored_layers`={list(ignored_layers)!r} leaves no conv/linear layer of {type(model).__name__} to "
            "prune. Allowed values: a list that leaves at least one layer."
        )
    before = sparsity_report(model)
    scores = [(n, m, effective_weight(m).abs()) for n, m in targets]  # masked weights score 0: pruned stay pruned
    if scope == "global":
        flat = torch.cat([s.flatten() for _, _, s in scores])
        k = int(round(amount * flat.numel()))
        order = torch.argsort(flat, stable=True)
        keep_flat = torch.ones_like(flat, dtype=torch.bool)
        keep_flat[order[:k]] = False
        masks = list(torch.split(keep_flat, [s.numel() for _, _, s in scores]))
    else:
        masks = []
        for _, _, s in scores:
            keep = torch.ones(s.numel(), dtype=torch.bool, device=s.device)
            keep[torch.argsort(s.flatten(), stable=True)[: int(round(amount * s.numel()))]] = False
            masks.append(keep)
    summary = PruningSummary("unstructured", float(amount), before.total, before.total, 0.0)
    for (name, module, s), keep in zip(scores, masks):
        mask = attach_mask(module, keep.view_as(s).to(s.dtype))  # narrows an existing mask in place
        summary.layers[name] = (s.numel(), int((mask == 0).sum()))
    summary.sparsity = sparsity_report(model).sparsity
    return summary
