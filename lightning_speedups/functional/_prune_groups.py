"""Which channel groups structured pruning may remove, and checks that a pruned model still runs.

CNNs: every group torch-pruning finds (residual additions, concatenations and BatchNorms are coupled for us).

Models with attention: only the groups that stay inside one feed-forward block (``fc1`` out / activation / ``fc2``
in). Everything else is unsafe to prune channel by channel:

- the residual stream's width is hard-coded in reshapes (torchvision ViT's ``hidden_dim``), positional encodings
  and class tokens, and couples every block;
- query/key/value widths must stay ``num_heads * head_dim`` (BERT's ``attention_head_size``, timm's qkv reshape),
  which channel pruning breaks silently or loudly;
- window attention (Swin) makes torch-pruning's index analysis grow without bound.

The feed-forward blocks hold about two thirds of a transformer's weights and FLOPs, so this is where the speedup is.
"""

from __future__ import annotations

import sys
import traceback
from collections.abc import Iterable, Iterator
from typing import Any

from torch import nn

from lightning_speedups._compat import GraphBudgetExceeded, tp_index_budget

__all__ = ["attention_modules", "blame_module", "safe_attention_roots"]

_HEAD_ATTRS = ("num_heads", "num_attention_heads", "n_head", "n_heads")


def _attention_like(module: nn.Module) -> bool:
    if isinstance(module, nn.MultiheadAttention):
        return True
    return any(isinstance(getattr(module, a, None), int) for a in _HEAD_ATTRS)


def attention_modules(model: nn.Module) -> list[nn.Module]:
    """Innermost attention modules: ``nn.MultiheadAttention`` or a module with a head-count attribute.

    Innermost, because blocks and whole encoders often carry ``num_heads`` too (torchvision's ``EncoderBlock``);
    the attention is the module that holds the query/key/value projections.
    """
    return [m for m in model.modules() if _attention_like(m) and not any(_attention_like(d) for d in _below(m))]


def _below(module: nn.Module) -> Iterator[nn.Module]:
    return (d for d in module.modules() if d is not module)


def _group_is_ffn(tp: Any, dg: Any, group: Any, root: nn.Module, attention_ids: set[int]) -> bool:
    """One root's out-channels feeding only elementwise ops and the next layer's in-channels, outside attention."""
    layers = {tp.ops.OPTYPE.LINEAR, tp.ops.OPTYPE.CONV}
    # reshapes appear where a Linear runs on (batch, tokens, channels); a hard-coded one is caught by the forward check
    allowed = layers | {tp.ops.OPTYPE.ELEMENTWISE, tp.ops.OPTYPE.BN, tp.ops.OPTYPE.RESHAPE}
    for dep, _idxs in group:
        target = dep.target.module
        kind = tp.ops.module2type(target)
        if id(target) in attention_ids or kind not in allowed:
            return False
        if kind in layers and target is not root and dg.is_out_channel_pruning_fn(dep.handler):
            return False  # a second layer's outputs are coupled: this is the residual stream, not a block's inside
    return True


def safe_attention_roots(
    tp: Any, model: nn.Module, example_inputs: Any, ignored: Iterable[nn.Module], budget_per_root: int = 200_000
) -> tuple[list[nn.Module], list[str]]:
    """Feed-forward roots that can be pruned in a model with attention, and why the others cannot.

    Returns ``(roots, skipped)`` where ``skipped`` holds one line per kind of refusal, for the error message when
    nothing is left.
    """
    attn = attention_modules(model)
    attention_ids = {id(m) for a in attn for m in a.modules()}
    ignored_ids = {id(m) for layer in ignored for m in layer.modules()}
    dg = tp.DependencyGraph().build_dependency(model, example_inputs=example_inputs)
    names = {m: n for n, m in model.named_modules()}
    roots, skipped = [], []
    for module in model.modules():
        if not isinstance(module, (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)) or id(module) in ignored_ids:
            continue
        if id(module) in attention_ids or module not in dg.module2node:
            continue
        pruner = dg.get_pruner_of_module(module)
        channels = pruner.get_out_channels(module) if pruner is not None else None
        if not channels:
            continue
        try:
            with tp_index_budget(budget_per_root):
                group = dg.get_pruning_group(module, pruner.prune_out_channels, list(range(channels)))
        except GraphBudgetExceeded:
            skipped.append(f"{names.get(module)!r}: couples too many layers (residual stream)")
            continue
        if _group_is_ffn(tp, dg, group, module, attention_ids):
            roots.append(module)
        else:
            skipped.append(f"{names.get(module)!r}: its channels are shared with attention or the residual stream")
    return roots, skipped


def blame_module(model: nn.Module, err: BaseException) -> str | None:
    """Name of the innermost module of ``model`` whose ``forward`` was running when ``err`` was raised."""
    names = {id(m): n for n, m in model.named_modules()}
    found = None
    for frame, _line in traceback.walk_tb(err.__traceback__ or sys.exc_info()[2]):
        owner = frame.f_locals.get("self")
        if owner is not None and id(owner) in names:
            found = names[id(owner)] or type(owner).__name__
    return found
