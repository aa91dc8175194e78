"""Pruning without Lightning: structural (channels really removed, via torch-pruning) and unstructured (masks).

Masks (``torch.nn.utils.prune``) zero weights but keep every tensor dense, so a step costs the same or more. Removing
whole channels shrinks every coupled tensor (conv out-channels, its BatchNorm, the next layer's in-channels), so the
dense kernels do less work. torch-pruning's ``DependencyGraph`` finds the coupled tensors; nothing here traces graphs.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.nn.utils import prune as torch_prune

from lightning_speedups._errors import SpeedupConfigError, check_choice, check_range, require
from lightning_speedups._rebuild import ParamOrigin
from lightning_speedups._structure import CHECKPOINT_KEY, register_structure_hook

__all__ = [
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
    "prune_structured",
    "prune_unstructured",
    "pruned_structure_record",
    "save_pruned",
    "sparsity_report",
]

STRUCTURED_IMPORTANCES = ("l1", "l2", "taylor", "bn_scale")
UNSTRUCTURED_IMPORTANCES = ("l1", "l2")
RECORD_KEY = "pruning"
# integer attributes torch-pruning rewrites when it shrinks a layer; recorded so a fresh model can be resized
_SHAPE_ATTRS = (
    "in_channels", "out_channels", "groups", "in_features", "out_features", "num_features", "num_channels",
    "num_groups", "normalized_shape", "embed_dim", "kdim", "vdim", "num_heads", "head_dim", "hidden_size",
    "input_size", "proj_size", "embedding_dim",
)  # fmt: skip
_PRUNABLE = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.Linear)


@dataclass
class PruningSummary:
    """What one pruning call did. ``sparsity`` is the fraction of parameters removed (structured) or zeroed."""

    mode: str
    amount: float
    params_before: int
    params_after: int
    sparsity: float
    layers: dict[str, tuple[int, int]] = field(default_factory=dict)  # name -> (before, after) channels or nonzeros
    channels: dict[str, int] = field(default_factory=dict)  # structured: every prunable root layer's channels before
    macs_before: int | None = None
    macs_after: int | None = None
    origins: dict[int, ParamOrigin] = field(default_factory=dict, repr=False)  # for rebuild_optimizers


@dataclass
class SparsityReport:
    """Exact parameter counts; every parameter is counted once even when shared, masks are applied."""

    total: int
    zeros: int
    layers: dict[str, tuple[int, int]]  # parameter name -> (numel, zeros)

    @property
    def sparsity(self) -> float:
        return self.zeros / max(self.total, 1)

    @property
    def nonzero(self) -> int:
        return self.total - self.zeros


def sparsity_report(model: nn.Module) -> SparsityReport:
    """Count parameters and exact zeros; masked weights (``weight_orig`` * ``weight_mask``) count as ``weight``.

    Example::

        >>> report = sparsity_report(nn.Linear(4, 2, bias=False))
        >>> report.total, report.zeros
        (8, 0)
    """
    layers: dict[str, tuple[int, int]] = {}
    seen: set[int] = set()
    for name, param in model.named_parameters():  # named_parameters already skips shared duplicates
        if id(param) in seen:
            continue
        seen.add(id(param))
        tensor = param.detach()
        if name.endswith("_orig"):
            mod_name, _, attr = name[: -len("_orig")].rpartition(".")
            module = model.get_submodule(mod_name)
            mask = getattr(module, attr + "_mask", None)
            if mask is not None:
                tensor, name = tensor * mask, name[: -len("_orig")]
        layers[name] = (tensor.numel(), int((tensor == 0).sum()))
    return SparsityReport(sum(n for n, _ in layers.values()), sum(z for _, z in layers.values()), layers)


def count_macs(model: nn.Module, example_inputs: Any) -> int:
    """Multiply-accumulates of one forward pass through the model's conv and linear layers (eval mode, no grad)."""
    total = 0

    def hook(module: nn.Module, _inp: Any, out: torch.Tensor) -> None:
        nonlocal total
        if isinstance(module, nn.Linear):
            total += out.numel() * module.in_features
        else:
            kernel = 1
            for k in module.weight.shape[2:]:
                kernel *= int(k)
            total += out.numel() * (module.weight.shape[1]) * kernel

    handles = [m.register_forward_hook(hook) for m in model.modules() if isinstance(m, _PRUNABLE)]
    try:
        with torch.no_grad(), _eval_mode(model):
            _forward(model, example_inputs)
    finally:
        for h in handles:
            h.remove()
    return total


def _forward(model: nn.Module, example_inputs: Any) -> Any:
    if isinstance(example_inputs, dict):
        return model(**example_inputs)
    if isinstance(example_inputs, (tuple, list)):
        return model(*example_inputs)
    return model(example_inputs)


@contextlib.contextmanager
def _eval_mode(model: nn.Module) -> Iterator[None]:
    """Eval mode for tracing (BatchNorm statistics must not see the example input), per-module flags restored."""
    modes = {m: m.training for m in model.modules()}
    model.eval()
    try:
        yield
    finally:
        for m, mode in modes.items():
            m.training = mode


def default_ignored_layers(model: nn.Module, example_inputs: Any = None) -> list[str]:
    """The final classifier layer: the last conv/linear run by a forward pass (or registered, without inputs)."""
    names = {m: n for n, m in model.named_modules()}
    order: list[str] = []
    if example_inputs is not None:
        handles = [
            m.register_forward_hook(lambda mod, _i, _o: order.append(names[mod]))
            for m in model.modules()
            if isinstance(m, _PRUNABLE)
        ]
        try:
            with torch.no_grad(), _eval_mode(model):
                _forward(model, example_inputs)
        finally:
            for h in handles:
                h.remove()
    else:
        order = [n for n, m in model.named_modules() if isinstance(m, _PRUNABLE)]
    return order[-1:]


def _resolve_layers(model: nn.Module, names: Sequence[str]) -> list[nn.Module]:
    known = dict(model.named_modules())
    unknown = [n for n in names if n not in known]
    if unknown:
        sample = [n for n in known if n][:8]
        raise SpeedupConfigError(
            f"`ignored_layers` names unknown modules: {unknown!r}. Allowed values: names from "
            f"model.named_modules(), e.g. {sample!r}. HINT: use the attribute path, like 'head' or 'backbone.0.0'."
        )
    return [known[n] for n in names]


@contextlib.contextmanager
def _record_origins(origins: dict[int, ParamOrigin]) -> Iterator[None]:
    """Record, for every parameter torch-pruning slices, where it came from (so optimizer state can follow)."""
    tp_function = require("torch_pruning.pruner.function", "pruning", "Structured pruning")
    base = tp_function.BasePruningFunc
    original = base._prune_parameter_and_grad
    sources: dict[int, torch.Tensor] = {}  # keep old tensors alive while their id() is a key

    def patched(self: Any, weight: torch.Tensor, keep_idxs: Sequence[int], pruning_dim: int) -> torch.Tensor:
        new = original(self, weight, keep_idxs, pruning_dim)
        dim = pruning_dim % weight.dim()
        idx = torch.as_tensor(list(keep_idxs), dtype=torch.long)
        root, kept = origins.pop(id(weight), (weight, {}))  # sliced twice in one call: compose the slices
        kept = dict(kept)
        kept[dim] = kept[dim][idx] if dim in kept else idx
        origins[id(new)] = (root, kept)
        sources[id(new)] = new
        return new

    base._prune_parameter_and_grad = patched
    try:
        yield
    finally:
        base._prune_parameter_and_grad = original


@contextlib.contextmanager
def _all_trainable(model: nn.Module) -> Iterator[None]:
    """Frozen layers produce no autograd graph, which torch-pruning traces: unfreeze while tracing, then restore."""
    frozen = {n for n, p in model.named_parameters() if not p.requires_grad}
    for p in model.parameters():
        p.requires_grad_(True)
    try:
        yield
    finally:
        for n, p in model.named_parameters():
            p.requires_grad_(n not in frozen)


class _CachedImportance:
    """Remembers each group's scores in the dry run and replays them in the real pass (scoring is the slow part)."""

    def __init__(self, importance: Any) -> None:
        self.importance, self.replay = importance, False
        self.scores: dict[tuple[int, str], torch.Tensor | None] = {}

    def __call__(self, group: Any) -> torch.Tensor | None:
        key = (id(group[0].dep.target.module), getattr(group[0].dep.handler, "__name__", ""))
        if not self.replay or key not in self.scores:
            self.scores[key] = self.importance(group)
        return self.scores[key]


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
) -> PruningSummary:
    """Remove ``amount`` of the channels of every prunable layer group, in place (torch-pruning's dependency graph).

    Args:
        model: any ``nn.Module`` (a LightningModule works too); pruned in place.
        example_inputs: an input batch for one forward pass (tensor, tuple of args or dict of kwargs); batch size 1
            is enough. The model runs in eval mode for tracing, so BatchNorm statistics are untouched.
        amount: fraction of the *current* channels to remove per group, in ``[0, 1)``.
        importance: ``"l1"`` / ``"l2"`` (weight magnitude), ``"taylor"`` (weight x gradient: call ``backward`` first)
            or ``"bn_scale"`` (BatchNorm gamma).
        ignored_layers: module names whose outputs keep all channels; ``None`` = the final classifier layer.
        global_pruning: rank channels across all layers instead of per layer.
        round_to: keep channel counts multiples of this (e.g. 8 for tensor cores).
        dry_run: only validate and plan: ``layers`` then holds the planned (before, after) channels and the model is
            left untouched.
        reference_channels: ``{root layer name: channels}`` of the unpruned model (``summary.channels`` of the
            first call): ``amount`` is then the fraction of *those* channels removed in total, so gradual schedules
            hit their targets exactly instead of compounding rounding errors.

    Returns:
        A :class:`PruningSummary` with parameter/MAC counts and, per root layer, channels before and after.

    Raises:
        SpeedupConfigError: bad arguments, unknown layer names, every layer ignored, or a layer that would lose all its
            channels (named in the message). Nothing is pruned when it raises.

    Example::

        >>> from lightning_speedups.demo import DemoClassifier
        >>> model = DemoClassifier(width=8)
        >>> summary = prune_structured(model, torch.zeros(1, 3, 32, 32), 0.5)
        >>> summary.layers["backbone.0.0"]
        (8, 4)
    """
    check_range("amount", amount, 0.0, 1.0, high_inclusive=False, hint="a fraction of channels, e.g. 0.5.")
    check_choice("importance", importance, STRUCTURED_IMPORTANCES)
    tp = require("torch_pruning", "pruning", "Structured pruning")
    if ignored_layers is None:
        ignored_layers = default_ignored_layers(model, example_inputs)
    ignored = _resolve_layers(model, ignored_layers)
    names = {m: n for n, m in model.named_modules()}
    params_before = sum(p.numel() for p in model.parameters())
    macs_before = count_macs(model, example_inputs)
    summary = PruningSummary("structured", float(amount), params_before, params_before, 0.0)
    summary.macs_before = summary.macs_after = macs_before
    with torch.enable_grad(), _eval_mode(model), _all_trainable(model):
        scorer = _CachedImportance(_importance(tp, importance, model))
        pruner = tp.pruner.BasePruner(
            model,
            example_inputs,
            importance=scorer,
            global_pruning=global_pruning,
            pruning_ratio=float(amount),
            ignored_layers=ignored,
            round_to=round_to,
        )
        roots = [g[0].dep.target.module for g in pruner.DG.get_all_groups(ignored_layers=pruner.ignored_layers)]
        if not roots:
            raise SpeedupConfigError(
                f"`ignored_layers`={list(ignored_layers)!r} leaves no prunable layer in {type(model).__name__}. "
                "Allowed values: a list that leaves at least one conv/linear layer. HINT: the default ignores only "
                "the final classifier layer; a model with a single layer cannot be pruned structurally."
            )
        # dry run: see every group's plan before touching the model, so a refusal leaves it intact
        plan: list[tuple[nn.Module, Any, int]] = []
        # torch-pruning silently skips a group that would lose every channel; let it through to refuse it by name
        summary.channels = {names[r]: int(pruner.DG.get_out_channels(r)) for r in roots}
        if reference_channels:  # torch-pruning keeps `target = initial * (1 - ratio)` per ranking scope
            scopes = pruner._scope_initial_channels
            for name, ch in reference_channels.items():
                scopes[name] = int(ch)
            scopes["DEFAULT_SCOPE"] = sum(reference_channels.get(n, c) for n, c in summary.channels.items())
            initial = dict(scopes)
        pruner.DG.check_pruning_group = lambda group: True
        try:
            for group in pruner.step(interactive=True):
                root, handler = group[0].dep.target.module, group[0].dep.handler
                plan.append((root, handler, len(group[0].idxs)))
        finally:
            del pruner.DG.check_pruning_group
        dg = pruner.DG
        for root, handler, n in plan:
            get = dg.get_out_channels if dg.is_out_channel_pruning_fn(handler) else dg.get_in_channels
            if n >= get(root):
                raise SpeedupConfigError(
                    f"`amount`={amount!r} would remove all {get(root)} channels of layer {names.get(root)!r}. "
                    "Allowed values: an amount that keeps at least one channel per layer. "
                    f"HINT: lower the amount or add {names.get(root)!r} to `ignored_layers`."
                )
        if dry_run:
            for root, _handler, n in plan:
                ch = pruner.DG.get_out_channels(root)
                summary.layers[names[root]] = (int(ch), int(ch) - n)
            return summary
        pruner.reset()
        if reference_channels:
            pruner._scope_initial_channels.update(initial)
        scorer.replay = True  # all scores are computed before the first group is pruned: reuse the dry run's
        before = {root: pruner.DG.get_out_channels(root) for root in roots}
        with _record_origins(summary.origins):
            for group in pruner.step(interactive=True):
                group.prune()
    live = {id(p) for p in model.parameters()}
    summary.origins = {k: v for k, v in summary.origins.items() if k in live}
    for root, ch in before.items():
        after = pruner.DG.get_out_channels(root)
        if after != ch:
            summary.layers[names[root]] = (int(ch), int(after))
    summary.params_after = sum(p.numel() for p in model.parameters())
    summary.sparsity = 1.0 - summary.params_after / max(params_before, 1)
    summary.macs_after = count_macs(model, example_inputs)
    return summary


def _mask_targets(model: nn.Module, ignored: list[nn.Module]) -> list[tuple[str, nn.Module]]:
    skip = {id(m) for layer in ignored for m in layer.modules()}
    return [(n, m) for n, m in model.named_modules() if isinstance(m, _PRUNABLE) and id(m) not in skip]


def prune_unstructured(
    model: nn.Module,
    amount: float,
    importance: str = "l1",
    ignored_layers: Sequence[str] | None = None,
    scope: str = "global",
) -> PruningSummary:
    """Zero ``amount`` of the conv/linear weights with ``torch.nn.utils.prune`` masks (no speedup on dense kernels).

    Masks are updated in place on repeated calls (no stacking of pruning containers, so memory does not grow), and a
    weight once pruned stays pruned. ``amount`` is the total target sparsity of the selected weights.

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
    targets = _mask_targets(model, _resolve_layers(model, ignored_layers))
    if not targets:
        raise SpeedupConfigError(
            f"`ignored_layers`={list(ignored_layers)!r} leaves no conv/linear layer to prune. Allowed values: a list "
            "that leaves at least one layer."
        )
    before = sparsity_report(model)
    scores = [(n, m, _effective_weight(m).abs()) for n, m in targets]  # masked weights score 0: pruned stay pruned
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
        mask = keep.view_as(s).to(s.dtype)
        if hasattr(module, "weight_mask"):
            module.weight_mask.copy_(mask * module.weight_mask)  # in place: no new container, no memory growth
        else:
            torch_prune.custom_from_mask(module, "weight", mask)
        summary.layers[name] = (s.numel(), int((module.weight_mask == 0).sum()))
    summary.sparsity = sparsity_report(model).sparsity
    return summary


def _effective_weight(module: nn.Module) -> torch.Tensor:
    # ``module.weight`` of a masked module is only refreshed by the next forward: compute it from orig * mask
    if hasattr(module, "weight_mask"):
        return (module.weight_orig * module.weight_mask).detach()
    return module.weight.detach()


def make_pruning_permanent(model: nn.Module) -> int:
    """Fold every ``torch.nn.utils.prune`` mask into its weight (same Parameter object); return how many."""
    count = 0
    for module in model.modules():
        for hook in list(module._forward_pre_hooks.values()):
            if isinstance(hook, torch_prune.BasePruningMethod):
                torch_prune.remove(module, hook._tensor_name)
                count += 1
    return count


def clean_pruned_state_dict(state_dict: dict[str, Any]) -> dict[str, Any]:
    """Replace ``x_orig`` / ``x_mask`` pairs by the masked ``x``, so the keys match an unpruned model."""
    out = dict(state_dict)
    for key in [k for k in state_dict if k.endswith("_orig")]:
        base = key[: -len("_orig")]
        if base + "_mask" in out:
            out[base] = out.pop(key) * out.pop(base + "_mask")
    return out


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

    The recorded structure is applied first, then the weights are loaded strictly. Loads with ``weights_only=True``.

    Example::

        >>> import tempfile, os
        >>> from lightning_speedups.demo import DemoClassifier
        >>> model = DemoClassifier(width=8)
        >>> _ = prune_structured(model, torch.zeros(1, 3, 32, 32), 0.5)
        >>> path = os.path.join(tempfile.mkdtemp(), "pruned.pt")
        >>> save_pruned(model, path)
        >>> fresh = load_pruned(DemoClassifier(width=8), path)
        >>> fresh.head.in_features
        16
    """
    checkpoint = torch.load(checkpoint_path, map_location="cpu", weights_only=True)
    record = (checkpoint.get(CHECKPOINT_KEY) or {}).get(RECORD_KEY)
    if record is not None:
        apply_pruned_structure(model, record)
    model.load_state_dict(clean_pruned_state_dict(checkpoint["state_dict"]), strict=strict)
    return model
