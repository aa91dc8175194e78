"""Plain-PyTorch functions, usable without Lightning: each does one technique in place and returns a summary.

This package re-exports each technique's entry points; the rest of a technique (its configs, summaries and helpers)
is in its module, ``lightning_speedups.functional.<technique>``.

Example::

    >>> import torch.nn as nn
    >>> from lightning_speedups.functional import freeze
    >>> model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 1))
    >>> _ = freeze(model[0])  # the first layer only
    >>> [p.requires_grad for p in model.parameters()]
    [False, False, True, True]
"""

from lightning_speedups.functional.advisor import AdvisorReport, Finding, diagnose
from lightning_speedups.functional.batch_size import BatchSizeSearchResult
from lightning_speedups.functional.channels_last import apply_channels_last
from lightning_speedups.functional.compile import compile_model, uncompile_model
from lightning_speedups.functional.ema import create_ema_model
from lightning_speedups.functional.fast_schedule import create_fast_schedule
from lightning_speedups.functional.finetuning import (
    find_head,
    freeze,
    layer_groups,
    load_pretrained,
    replace_head,
    unfreeze,
)
from lightning_speedups.functional.label_smoothing import apply_label_smoothing, smooth_labels
from lightning_speedups.functional.progressive_resizing import progressive_scale, resize_batch
from lightning_speedups.functional.pruning import (
    load_pruned,
    prune_structured,
    prune_unstructured,
    save_pruned,
    sparsity_report,
)
from lightning_speedups.functional.quantization import load_quantized, quantize_for_inference, save_quantized

__all__ = [
    # advisor
    "AdvisorReport",
    "Finding",
    "diagnose",
    # batch size
    "BatchSizeSearchResult",
    # code
    "apply_channels_last",
    "compile_model",
    "uncompile_model",
    # fewer steps to the target
    "apply_label_smoothing",
    "create_ema_model",
    "create_fast_schedule",
    "progressive_scale",
    "resize_batch",
    "smooth_labels",
    # fine-tuning
    "find_head",
    "freeze",
    "layer_groups",
    "load_pretrained",
    "replace_head",
    "unfreeze",
    # pruning
    "load_pruned",
    "prune_structured",
    "prune_unstructured",
    "save_pruned",
    "sparsity_report",
    # quantization
    "load_quantized",
    "quantize_for_inference",
    "save_quantized",
]
