"""Structured pruning: channels really removed (torch-pruning's dependency graph), so every later step is cheaper.

Removing whole channels shrinks every coupled tensor (conv out-channels, its BatchNorm, the next layer's in-channels),
so the dense kernels do less work. torch-pruning's ``DependencyGraph`` finds the coupled tensors; nothing here traces
graphs. A structural prune is a transaction: the pruned model must run and give outputs of the same shape, or it is put
back as it was.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import nn

from lightning_speedups._compat import (
    GraphBudgetExceeded,
    GraphLoop,
    tp_allow_every_group,
    tp_group_loop_guard,
    tp_index_budget,
    tp_on_param_slice,
    tp_scope_channels,
)
from lightning_speedups._errors import SpeedupConfigError, check_choice, check_range, require
from lightning_speedups._heads import CONV_LINEAR
from lightning_speedups._inputs import eval_mode, flat_tensors
from lightning_speedups._rebuild import ParamOrigin
from lightning_speedups._structure import ModuleSnapshot
from lightning_speedups.functional.pruning.common import (
    PruningSummary,
    all_trainable,
    count_macs,
    default_ignored_layers,
    feeding_layers,
    resolve_layers,
    training_only_layers,
)
from lightning_speedups.functional.pruning.groups import (
    attention_modules,
    check_still_runs,
    dependency_error,
    raised_in_torch_pruning,
    retie,
    safe_attention_roots,
    shapes_by_mode,
    tied_parameters,
    tracer,
)

__all__ = ["DEFAULT_GRAPH_BUDGET", "STRUCTURED_IMPORTANCES", "prune_structured"]

STRUCTURED_IMPORTANCES = ("l1", "l2", "taylor", "bn_scale")
# channel-index records torch-pruning may create in one call (about 64 bytes each: ~1.3 GB) before it is stopped
DEFAULT_GRAPH_BUDGET = 20_000_000


@contextlib.contextmanager
def _record_origins(origins: dict[int, ParamOrigin]) -> Iterator[None]:
    """Record, for every parameter torch-pruning slices, where it came from (so optimizer state can follow)."""
    sources: dict[int, torch.Tensor] = {}  # keep new tensors alive while their id() is a key

    def record(weight: torch.Tensor, new: torch.Tensor, keep_idxs: Sequence[int], pruning_dim: int) -> None:
        dim = pruning_dim % weight.dim()
        idx = torch.as_tensor(list(keep_idxs), dtype=torch.long)
        root, kept = origins.pop(id(weight), (weight, {}))  # sliced twice in one call: compose the slices
        kept = dict(kept)
        kept[dim] = kept[dim][idx] if dim in kept else idx
        origins[id(new)] = (root, kept)
        sources[id(new)] = new

    with tp_on_param_slice(record):
        yield


class _CachedImportance:
    """Remembers each group's scores in the dry run and replays them in the real pass (scoring is the slow part)."""

    def __init__(self, importance: Any) -> None:
        self.importance = importance
        self.replay = False
        self.scores: dict[tuple[int, str], torch.Tensor | None] = {}

    def __call__(self, group: Any) -> torch.Tensor | None:
        key = (id(group[0].dep.target.module), getattr(group[0].dep.handler, "__name__", ""))
        if not self.replay or key not in self.scores:
            self.scores[key] = self.importance(group)
        return self.scores[key]


def _nothing_to_prune(model: nn.Module, ignored_names: list[str]) -> SpeedupConfigError:
    recurrent = [f"{n!r} ({type(m).__name__})" for n, m in model.named_modules() if isinstance(m, nn.RNNBase)]
    held = f" Recurrent modules {', '.join(recurrent)} keep their widths." if recurrent else ""
    return SpeedupConfigError(
        f"`ignored_layers`={ignored_names!r} leaves no prunable layer in {type(model).__name__}.{held} Allowed "
        "values: a list that leaves at least one conv/linear layer outside recurrent modules. HINT: the default "
        "ignores only the output layers; a model with a single layer cannot be pruned structurally. Use "
        "mask pruning (MaskPruning, prune_unstructured) to prune recurrent weights."
    )


def _importance(tp: Any, name: str, model: nn.Module) -> Any:
    if name == "l1":
        return tp.importance.MagnitudeImportance(p=1)
    if name == "l2":
        return tp.importance.MagnitudeImportance(p=2)
    if name == "bn_scale":
        return tp.importance.BNScaleImportance()
    if not any(p.grad is not None for p in model.parameters()):
        raise SpeedupConfigError(
            "`importance`='taylor' needs gradients, but no parameter has `.grad`. Allowed values: "
            f"{', '.join(STRUCTURED_IMPORTANCES)}. HINT: call loss.backward() before pruning, or use 'l1'."
        )
    return tp.importance.TaylorImportance()


def prune_structured(
    model: nn.Module,
    example_inputs: Any,
    amount: float,
    importance: str = "l1",
    ignored_layers: Sequence[str] | None = None,
    global_pruning: bool = False,
    round_to: int | None = None,
    dry_run: bool = False,
    reference_channels: dict[str, int] | None = None,
    max_graph_indices: int = DEFAULT_GRAPH_BUDGET,
) -> PruningSummary:
    """Remove ``amount`` of the channels of every prunable layer group, in place (torch-pruning's dependency graph).

    Models with attention (``nn.MultiheadAttention``, or modules with a ``num_heads``-style attribute) have only
    their feed-forward blocks pruned: the residual stream, the q/k/v projections and the head counts keep their
    widths, so head sizes stay consistent (see ``functional/pruning/groups.py`` for why).

    The prune is a transaction: the pruned model must run on ``example_inputs`` and give outputs of the same shapes;
    otherwise, or on any other error, every module is put back exactly as it was (same ``Parameter`` objects) and a
    :class:`SpeedupConfigError` names the module that failed.

    Args:
        model: any ``nn.Module`` (a LightningModule works too); pruned in place.
        example_inputs: an input batch for one forward pass (tensor, tuple of args or dict of kwargs); batch size 1
            is enough. The model is traced in eval mode, or in train mode when some layers run only in training (aux
            heads); checks run in both modes. BatchNorm statistics and the RNG state are put back afterwards.
        amount: fraction of the *current* channels to remove per group, in ``[0, 1)``.
        importance: ``"l1"`` / ``"l2"`` (weight magnitude), ``"taylor"`` (weight x gradient: call ``backward`` first)
            or ``"bn_scale"`` (BatchNorm gamma).
        ignored_layers: module names whose outputs keep all channels; ``None`` = the output layers (the final layer of
            every head: dict, tuple and ``ModelOutput`` outputs, aux heads that run only in training). Recurrent
            layers and the layers feeding them always keep their widths; tied parameters are pruned together.
        global_pruning: rank channels across all layers instead of per layer.
        round_to: keep channel counts multiples of this (e.g. 8 for tensor cores).
        dry_run: validate and plan only: the prune is carried out, checked and undone, so ``layers`` holds the
            planned (before, after) channels and the model is left untouched.
        reference_channels: ``{root layer name: channels}`` of the unpruned model (``summary.channels`` of the
            first call): ``amount`` is then the fraction of *those* channels removed in total, so gradual schedules
            hit their targets exactly instead of compounding rounding errors.
        max_graph_indices: bound on torch-pruning's dependency analysis (channel-index records, about 64 bytes
            each); a model past it is refused with a clear error instead of exhausting memory.

    Returns:
        A :class:`PruningSummary` with parameter/MAC counts and, per root layer, channels before and after.

    Raises:
        SpeedupConfigError: bad arguments, unknown layer names, every layer ignored, a layer that would lose all its
            channels, an analysis past ``max_graph_indices``, an error inside torch-pruning (a channel shuffle, a
            token-mixing MLP, a layer type it does not know), tied parameters that would be pruned apart, or a pruned
            model that no longer runs in eval or train mode (the module is named in the message). Nothing is pruned
            when it raises.

    Example::

        >>> from lightning_speedups.demo import DemoClassifier
        >>> model = DemoClassifier(width=8)
        >>> summary = prune_structured(model, torch.zeros(1, 3, 32, 32), 0.5)
        >>> summary.layers["backbone.0.0"]
        (8, 4)
    """
    check_range("amount", amount, 0.0, 1.0, high_inclusive=False, hint="a fraction of channels, e.g. 0.5.")
    check_choice("importance", importance, STRUCTURED_IMPORTANCES)
    check_range("max_graph_indices", max_graph_indices, 1, None)
    tp = require("torch_pruning", "pruning", "Structured pruning")
    if ignored_layers is None:
        ignored_layers = default_ignored_layers(model, example_inputs)
    ignored = _held_layers(model, example_inputs, ignored_layers)
    shapes_before = shapes_by_mode(model, example_inputs)
    # aux heads run only in training: trace the way training runs, or their input channels are left unpruned
    trace = {"forward_fn": tracer(bool(training_only_layers(model, example_inputs))), "output_transform": flat_tensors}
    params_before = sum(p.numel() for p in model.parameters())
    summary = PruningSummary("structured", float(amount), params_before, params_before, 0.0)
    summary.macs_before = summary.macs_after = count_macs(model, example_inputs)
    snapshot = ModuleSnapshot(model)
    tied = tied_parameters(model)
    with torch.enable_grad(), eval_mode(model), all_trainable(model):
        try:
            with tp_index_budget(max_graph_indices), tp_group_loop_guard():
                _prune(
                    tp,
                    model,
                    example_inputs,
                    summary,
                    importance,
                    list(ignored_layers),
                    ignored,
                    global_pruning,
                    round_to,
                    reference_channels,
                    trace,
                )
            retie(model, tied)
            check_still_runs(model, example_inputs, shapes_before)
        except GraphBudgetExceeded as err:
            snapshot.restore()
            raise _budget_error(model, max_graph_indices, err) from None
        except GraphLoop as err:
            snapshot.restore()
            raise _loop_error(model, err) from None
        except Exception as err:
            snapshot.restore()
            if isinstance(err, SpeedupConfigError) or not raised_in_torch_pruning(err):
                raise
            raise dependency_error(tp, model, err) from err
        except BaseException:
            snapshot.restore()
            raise
        if dry_run:
            snapshot.restore()
            summary.origins = {}
            return summary
    live = {id(p) for p in model.parameters()}
    summary.origins = {k: v for k, v in summary.origins.items() if k in live}
    summary.params_after = sum(p.numel() for p in model.parameters())
    summary.sparsity = 1.0 - summary.params_after / max(params_before, 1)
    summary.macs_after = count_macs(model, example_inputs)
    return summary


def _held_layers(model: nn.Module, example_inputs: Any, ignored_layers: Sequence[str]) -> list[nn.Module]:
    """The modules whose outputs keep all their channels: ``ignored_layers``, recurrent layers and what feeds them."""
    ignored = resolve_layers(model, ignored_layers)
    # recurrent layers keep their widths (torch-pruning slices an LSTM's gates wrongly and knows no GRU): hold them
    # and the layers that feed them
    recurrent = [m for m in model.modules() if isinstance(m, nn.RNNBase)]
    return ignored + [*recurrent, *feeding_layers(model, example_inputs, recurrent)]


def _budget_error(model: nn.Module, max_graph_indices: int, err: GraphBudgetExceeded) -> SpeedupConfigError:
    """The refusal of a model whose dependency analysis made more than ``max_graph_indices`` index records."""
    return SpeedupConfigError(
        f"`max_graph_indices`={max_graph_indices:,} was exceeded: torch-pruning's dependency analysis of "
        f"{type(model).__name__} made {err}. The model is unchanged. Allowed values: a larger bound if the "
        "machine has the memory (about 64 bytes each). HINT: add the blocks that reshape channels into "
        "windows or heads to `ignored_layers`, or use mask pruning (MaskPruning, prune_unstructured)."
    )


def _loop_error(model: nn.Module, err: GraphLoop) -> SpeedupConfigError:
    """The refusal of a model on which torch-pruning's dependency analysis went round in a loop."""
    return SpeedupConfigError(
        f"structured pruning cannot analyse {type(model).__name__}: torch-pruning's dependency analysis went "
        f"round {err}. The model is unchanged. Allowed values: a model whose channel dependencies "
        "torch-pruning can follow. HINT: add the blocks that split and re-join channels (rotary embeddings, "
        "attention) to `ignored_layers`, or use mask pruning (MaskPruning, prune_unstructured)."
    )


def _prune(
    tp: Any,
    model: nn.Module,
    example_inputs: Any,
    summary: PruningSummary,
    importance: str,
    ignored_names: list[str],
    ignored: list[nn.Module],
    global_pruning: bool,
    round_to: int | None,
    reference_channels: dict[str, int] | None,
    trace: dict[str, Any],
) -> None:
    """Plan every group, refuse a layer that would lose all its channels, then prune (fills ``summary``)."""
    # long: one transaction: plan every group, refuse, then prune; split, the plan would be passed around
    names = {m: n for n, m in model.named_modules()}
    prunable_ignored = list(ignored)
    if attention_modules(model):  # transformers: feed-forward blocks only; every other root is held fixed
        roots, skipped = safe_attention_roots(tp, model, example_inputs, ignored, trace=trace)
        if not roots:
            raise SpeedupConfigError(
                f"{type(model).__name__} has attention and no feed-forward block that can be pruned structurally "
                f"({'; '.join(skipped[:4]) or 'no conv/linear layer outside attention'}). Allowed values: "
                "mask pruning (MaskPruning, prune_unstructured) for this model. HINT: check `ignored_layers`."
            )
        keep = {id(r) for r in roots}
        prunable_ignored += [m for m in model.modules() if isinstance(m, CONV_LINEAR) and id(m) not in keep]
    scorer = _CachedImportance(_importance(tp, importance, model))
    pruner = tp.pruner.BasePruner(
        model,
        example_inputs,
        importance=scorer,
        global_pruning=global_pruning,
        pruning_ratio=float(summary.amount),
        ignored_layers=prunable_ignored,
        round_to=round_to,
        **trace,
    )
    dg = pruner.DG
    roots = [g[0].dep.target.module for g in dg.get_all_groups(ignored_layers=pruner.ignored_layers)]
    if not roots:
        raise _nothing_to_prune(model, ignored_names)
    summary.channels = {names[r]: int(dg.get_out_channels(r)) for r in roots}
    initial: dict[str, int] = {}
    if reference_channels:  # torch-pruning keeps `target = initial * (1 - ratio)` per ranking scope
        scopes = tp_scope_channels(pruner)
        for name, ch in reference_channels.items():
            scopes[name] = int(ch)
        scopes["DEFAULT_SCOPE"] = sum(reference_channels.get(n, c) for n, c in summary.channels.items())
        initial = dict(scopes)
    # plan every group before touching the model; torch-pruning silently skips a group that would lose every
    # channel, so let it through to refuse it by name
    plan: list[tuple[nn.Module, Any, int]] = []
    with tp_allow_every_group(dg):
        for group in pruner.step(interactive=True):
            plan.append((group[0].dep.target.module, group[0].dep.handler, len(group[0].idxs)))
    for root, handler, n in plan:
        get = dg.get_out_channels if dg.is_out_channel_pruning_fn(handler) else dg.get_in_channels
        if n >= get(root):
            raise SpeedupConfigError(
                f"`amount`={summary.amount!r} would remove all {get(root)} channels of layer {names.get(root)!r}. "
                "Allowed values: an amount that keeps at least one channel per layer. "
                f"HINT: lower the amount or add {names.get(root)!r} to `ignored_layers`."
            )
    pruner.reset()
    if initial:
        tp_scope_channels(pruner).update(initial)
    scorer.replay = True  # all scores are computed before the first group is pruned: reuse the planning pass's
    before = {root: dg.get_out_channels(root) for root in roots}
    with _record_origins(summary.origins):
        for group in pruner.step(interactive=True):
            group.prune()
    for root, ch in before.items():
        after = dg.get_out_channels(root)
        if after != ch:
            summary.layers[names[root]] = (int(ch), int(after))
