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

The checks run the model the way training will (eval and train mode, every output tensor), and every failure, inside
torch-pruning or in a pruned forward, becomes a refusal that names the module (:func:`blame_module`).
"""

from __future__ import annotations

import contextlib
import traceback
from collections.abc import Iterable, Iterator
from types import FrameType
from typing import Any

import torch
from torch import nn

from lightning_speedups._compat import GraphBudgetExceeded, tp_index_budget
from lightning_speedups._errors import SpeedupConfigError
from lightning_speedups._heads import CONV_LINEAR
from lightning_speedups._inputs import call_model, eval_mode, failing_module, flat_tensors, train_mode

__all__ = [
    "attention_modules",
    "blame_module",
    "check_still_runs",
    "dependency_error",
    "output_shapes",
    "raised_in_torch_pruning",
    "retie",
    "safe_attention_roots",
    "shapes_by_mode",
    "tied_parameters",
    "tracer",
    "unknown_layers",
]

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
    tp: Any,
    model: nn.Module,
    example_inputs: Any,
    ignored: Iterable[nn.Module],
    budget_per_root: int = 200_000,
    trace: dict[str, Any] | None = None,
) -> tuple[list[nn.Module], list[str]]:
    """Feed-forward roots that can be pruned in a model with attention, and why the others cannot.

    ``trace`` holds extra arguments of torch-pruning's ``build_dependency`` (``forward_fn``, ``output_transform``).
    Returns ``(roots, skipped)`` where ``skipped`` holds one line per kind of refusal, for the error message when
    nothing is left.
    """
    attn = attention_modules(model)
    attention_ids = {id(m) for a in attn for m in a.modules()}
    ignored_ids = {id(m) for layer in ignored for m in layer.modules()}
    dg = tp.DependencyGraph().build_dependency(model, example_inputs=example_inputs, **(trace or {}))
    names = {m: n for n, m in model.named_modules()}
    roots = []
    skipped = []
    for module in model.modules():
        if not isinstance(module, CONV_LINEAR) or id(module) in ignored_ids:
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
    """Name of the innermost module of ``model`` that was running or being analysed when ``err`` was raised.

    A forward's frames name their module (:func:`~lightning_speedups._inputs.failing_module`); torch-pruning's frames
    name the layer, dependency or graph node they were working on, and a node of a function (a reshape, a channel
    shuffle) is named by the smallest module that holds the layers feeding it. ``""`` (the model itself) is reported
    as the model's type name.
    """
    where = failing_module(model, err, _torch_pruning_modules)
    return None if where is None else where or type(model).__name__


def _torch_pruning_modules(frame: FrameType, names: dict[int, str]) -> list[nn.Module]:
    if "torch_pruning" not in frame.f_code.co_filename:
        return []
    for key in ("layer", "module", "node", "dep", "self"):  # what torch-pruning's functions call what they work on
        found = _as_modules(frame.f_locals.get(key), names)
        if found:
            return found
    return []


def _as_modules(value: Any, names: dict[int, str]) -> list[nn.Module]:
    """The model's modules behind a torch-pruning object: a layer, a ``Dependency`` (its target) or a ``Node``."""
    found: list[nn.Module] = []
    stack = [value]
    seen = set()
    while stack:
        item = stack.pop()
        if item is None or id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, nn.Module):
            found += [item] if id(item) in names else []
            continue
        target = getattr(item, "target", None)
        module = getattr(item, "module", None)
        if target is not None:
            stack.append(target)
        elif isinstance(module, nn.Module) and id(module) in names:
            found.append(module)
        elif isinstance(getattr(item, "inputs", None), list):  # a function node (reshape, cat...): what feeds it
            stack.extend(item.inputs)
    return found


def unknown_layers(tp: Any, model: nn.Module) -> list[str]:
    """``'name' (Type)`` of every module with its own parameters of a type torch-pruning has no pruner for.

    Such a layer (Hugging Face's ``Conv1D``, a custom norm) is seen only as loose parameters, so the channel counts
    around it may be unknown to the dependency analysis: the usual suspect when it fails.
    """
    known = tuple(
        cls
        for cls in (tp.ops.type2class(t) for t in tp.pruner.function.PrunerBox)
        if isinstance(cls, type) and issubclass(cls, nn.Module) and cls.__module__.startswith("torch.nn")
    )
    return [
        f"{name!r} ({type(m).__name__})"
        for name, m in model.named_modules()
        if not isinstance(m, known) and any(True for _ in m.parameters(recurse=False))
    ]


def tied_parameters(model: nn.Module) -> list[list[tuple[str, nn.Module, str]]]:
    """Parameters that several modules hold (tied input/output embeddings): ``[(module name, module, attr), ...]``."""
    holders: dict[int, list[tuple[str, nn.Module, str]]] = {}
    for name, module in model.named_modules(remove_duplicate=False):
        for attr, param in module.named_parameters(recurse=False):
            refs = holders.setdefault(id(param), [])
            if all(m is not module for _, m, _ in refs):
                refs.append((name, module, attr))
    return [refs for refs in holders.values() if len(refs) > 1]


def retie(model: nn.Module, tied: list[list[tuple[str, nn.Module, str]]]) -> None:
    """torch-pruning slices a tied parameter once per holder: tie the slices again, or refuse if they differ."""
    for refs in tied:
        params = [getattr(module, attr) for _, module, attr in refs]
        if all(p is params[0] for p in params):
            continue
        same = all(p.shape == params[0].shape and torch.equal(p, params[0]) for p in params)
        if not same:
            where = ", ".join(f"{f'{n}.{a}'.lstrip('.')!r} ({type(m).__name__})" for n, m, a in refs)
            raise SpeedupConfigError(
                f"structured pruning would untie the parameter shared by {where} in {type(model).__name__}: its "
                f"holders would keep different channels ({[tuple(p.shape) for p in params]}). The model is unchanged. "
                "Allowed values: `ignored_layers` that hold the tied layers and the layers feeding them. HINT: "
                "tied input/output embeddings are pruned together only when one channel group holds both."
            )
        for _, module, attr in refs[1:]:
            setattr(module, attr, params[0])


def tracer(training: bool) -> Any:
    """torch-pruning's ``forward_fn``: one forward in train mode (aux heads traced) or as torch-pruning set it."""

    def run(model: nn.Module, example_inputs: Any) -> Any:
        if not training:
            return call_model(model, example_inputs)
        with train_mode(model):  # BatchNorm statistics and RNG are put back afterwards
            return call_model(model, example_inputs)

    return run


def output_shapes(model: nn.Module, example_inputs: Any, training: bool = False) -> list[tuple[int, ...]]:
    """Shapes of every tensor in the model's output (the check that a pruned model still fits its head)."""
    try:
        with torch.no_grad(), train_mode(model) if training else eval_mode(model):
            out = call_model(model, example_inputs)
    except Exception as err:
        raise SpeedupConfigError(
            f"`example_inputs` do not run through {type(model).__name__}"
            f"{' in train mode' if training else ''}: {type(err).__name__}: {err}. Allowed values: an input the "
            "model's forward accepts (a tensor, a tuple of arguments or a dict of keyword arguments)."
        ) from err
    return [tuple(t.shape) for t in flat_tensors(out)]


def shapes_by_mode(model: nn.Module, example_inputs: Any) -> dict[bool, list[tuple[int, ...]]]:
    """Output shapes in eval mode and, where the inputs run in train mode too, in train mode (keyed by training)."""
    shapes = {False: output_shapes(model, example_inputs)}
    with contextlib.suppress(SpeedupConfigError):  # e.g. BatchNorm on one sample: train mode cannot be checked
        shapes[True] = output_shapes(model, example_inputs, training=True)
    return shapes


def check_still_runs(model: nn.Module, example_inputs: Any, shapes_before: dict[bool, list[tuple[int, ...]]]) -> None:
    """The pruned model must run in every mode it ran in before (train mode: branches that run only in training)."""
    for training, before in shapes_before.items():
        mode = " in train mode" if training else ""
        try:
            shapes = output_shapes(model, example_inputs, training)
        except SpeedupConfigError as err:
            cause = err.__cause__ or err
            where = blame_module(model, cause)
            raise SpeedupConfigError(
                f"structured pruning would break {type(model).__name__}: after pruning, its forward{mode} fails"
                f"{f' in module {where!r}' if where else ''} with {type(cause).__name__}: {cause}. The model is "
                "unchanged. Allowed values: `ignored_layers` that hold the layer feeding that module. HINT: that "
                "module hard-codes a channel count (e.g. `x.view(-1, 16)`) or its input is detached from the graph "
                "torch-pruning traces; add the layer feeding it to `ignored_layers`, or compute the size from the "
                "tensor (`x.flatten(1)`)."
            ) from cause
        if shapes != before:
            raise SpeedupConfigError(
                f"structured pruning would change {type(model).__name__}'s output shapes{mode} from {before} to "
                f"{shapes}. The model is unchanged. Allowed values: `ignored_layers` that hold the output layer. "
                "HINT: add the output layer to `ignored_layers`."
            )


def raised_in_torch_pruning(err: BaseException) -> bool:
    return any("torch_pruning" in frame.f_code.co_filename for frame, _ in traceback.walk_tb(err.__traceback__))


def dependency_error(tp: Any, model: nn.Module, err: Exception) -> SpeedupConfigError:
    """A torch-pruning crash (a channel shuffle, a token-mixing MLP...) as a refusal that names the module."""
    found = failing_module(model, err, _torch_pruning_modules)
    where = None if found is None else found or type(model).__name__  # the model itself: its type, no kind
    kind = type(model.get_submodule(found)).__name__ if found else None
    at = f" at module {where!r}{f' ({kind})' if kind else ''}" if where else ""
    unknown = unknown_layers(tp, model)
    if unknown:
        more = f" and {len(unknown) - 3} more" if len(unknown) > 3 else ""
        at += f"; layers of types it does not know: {', '.join(unknown[:3])}{more}"
    return SpeedupConfigError(
        f"structured pruning cannot analyse {type(model).__name__}: torch-pruning failed{at}, with "
        f"{type(err).__name__}: {err}. The model is unchanged. Allowed values: `ignored_layers` that hold "
        f"{repr(where) if where else 'that module'}, or mask pruning (MaskPruning). HINT: channel shuffles, "
        "token-mixing MLPs and reshapes that move channels into other dimensions are beyond its dependency analysis; "
        "mask pruning works on any conv/linear layer."
    )
