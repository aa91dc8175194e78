"""Pruning without Lightning: structured (channels really removed, via torch-pruning) and unstructured (masks).

Masks zero weights but keep every tensor dense, so a step costs the same or more. Removing whole channels shrinks
every coupled tensor, so the dense kernels do less work: :func:`prune_structured` is the one that trains faster.
The callbacks that run these on a schedule are in :mod:`lightning_speedups.callbacks.pruning`.

The modules, from the bottom:

- ``common``: what both kinds share: :class:`PruningSummary`, :func:`sparsity_report` (exact counts, masks applied),
  :func:`count_macs`, the output layers a prune must leave alone (:func:`default_ignored_layers`) and the layer-name
  check (:func:`resolve_layers`).
- ``masks``: weight masks as ``torch.nn.utils.parametrize`` parametrizations (correct where a parent reads the
  weight directly), cleaning them out of state dicts and folding them in (:func:`make_pruning_permanent`).
- ``unstructured``: :func:`prune_unstructured`, which masks the smallest weights.
- ``records``: the pruned structure stored in checkpoints, so they load into a freshly built model
  (:func:`save_pruned`, :func:`load_pruned`).
- ``groups``: which channel groups structured pruning may remove (feed-forward blocks only in models with attention)
  and the checks that a pruned model still runs.
- ``structured``: :func:`prune_structured`, a transaction that puts the model back when a check fails.
"""

from lightning_speedups.functional.pruning.common import (
    PruningSummary,
    SparsityReport,
    count_macs,
    default_ignored_layers,
    resolve_layers,
    sparsity_report,
)
from lightning_speedups.functional.pruning.masks import (
    clean_pruned_state_dict,
    make_pruning_permanent,
    masked_modules,
    weight_mask,
)
from lightning_speedups.functional.pruning.records import (
    RECORD_KEY,
    apply_pruned_structure,
    load_pruned,
    pruned_structure_record,
    save_pruned,
)
from lightning_speedups.functional.pruning.structured import (
    DEFAULT_GRAPH_BUDGET,
    STRUCTURED_IMPORTANCES,
    prune_structured,
)
from lightning_speedups.functional.pruning.unstructured import (
    UNSTRUCTURED_IMPORTANCES,
    mask_targets,
    prune_unstructured,
)

__all__ = [
    "DEFAULT_GRAPH_BUDGET",
    "RECORD_KEY",
    "PruningSummary",
    "SparsityReport",
    "STRUCTURED_IMPORTANCES",
    "UNSTRUCTURED_IMPORTANCES",
    "apply_pruned_structure",
    "clean_pruned_state_dict",
    "count_macs",
    "default_ignored_layers",
    "load_pruned",
    "make_pruning_permanent",
    "mask_targets",
    "masked_modules",
    "prune_structured",
    "prune_unstructured",
    "pruned_structure_record",
    "resolve_layers",
    "save_pruned",
    "sparsity_report",
    "weight_mask",
]
