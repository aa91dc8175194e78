"""What both pruning modes share: summaries, exact parameter counts, MACs, the classifier default, name checks."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from lightning_speedups._errors import check_module_names
from lightning_speedups._heads import CONV_LINEAR, is_conv_or_linear, is_linear_like
from lightning_speedups._inputs import call_model, eval_mode, flat_tensors, train_mode
from lightning_speedups._rebuild import ParamOrigin

__all__ = [
    "PruningSummary",
    "SparsityReport",
    "all_trainable",
    "count_macs",
    "default_ignored_layers",
    "feeding_layers",
    "output_layers",
    "training_only_layers",
    "resolve_layers",
    "sparsity_report",
]

# `<module>.parametrizations.<tensor>.original` (or original0 / original1 under a weight norm)
_PARAMETRIZED = re.compile(r"^(?:(.*)\.)?parametrizations\.([^.]+)\.original\d?$")


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
    """Count parameters and exact zeros; masked or weight-normed tensors count as the tensor forward sees.

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
        parametrized = _PARAMETRIZED.match(name)
        if parametrized:  # a parametrized tensor (mask, weight norm, both): count what forward sees, once
            mod_name = parametrized.group(1) or ""
            attr = parametrized.group(2)
            name = f"{mod_name}.{attr}" if mod_name else attr
            if name in layers:  # weight norm's second stored tensor (original1) of a tensor already counted
                continue
            tensor = getattr(model.get_submodule(mod_name), attr).detach()
        elif name.endswith("_orig"):  # torch.nn.utils.prune's weight_orig / weight_mask pair
            mod_name, _, attr = name[: -len("_orig")].rpartition(".")
            mask = getattr(model.get_submodule(mod_name), attr + "_mask", None)
            if mask is not None:
                tensor = tensor * mask
                name = name[: -len("_orig")]
        layers[name] = (tensor.numel(), int((tensor == 0).sum()))
    return SparsityReport(sum(n for n, _ in layers.values()), sum(z for _, z in layers.values()), layers)


def count_macs(model: nn.Module, example_inputs: Any) -> int:
    """Multiply-accumulates of one forward pass through the model's conv and linear layers (eval mode, no grad)."""
    total = 0

    def hook(module: nn.Module, _inp: Any, out: torch.Tensor) -> None:
        nonlocal total
        if isinstance(module, nn.Linear):
            total += out.numel() * module.in_features
        elif is_linear_like(module):  # HF Conv1D: weight (in, out)
            total += out.numel() * int(module.weight.shape[0])
        else:
            kernel = 1
            for k in module.weight.shape[2:]:
                kernel *= int(k)
            total += out.numel() * (module.weight.shape[1]) * kernel

    _forward_with_hooks(model, example_inputs, hook)
    return total


def _forward_with_hooks(model: nn.Module, example_inputs: Any, hook: Any) -> None:
    """One eval-mode, no-grad forward with ``hook`` on every conv/linear layer (removed afterwards)."""
    handles = [m.register_forward_hook(hook) for m in model.modules() if is_conv_or_linear(m)]
    try:
        with torch.no_grad(), eval_mode(model):
            call_model(model, example_inputs)
    finally:
        for h in handles:
            h.remove()


@contextlib.contextmanager
def all_trainable(model: nn.Module) -> Iterator[None]:
    """Frozen layers produce no autograd graph, which tracing needs: unfreeze while tracing, then restore."""
    frozen = {n for n, p in model.named_parameters() if not p.requires_grad}
    for p in model.parameters():
        p.requires_grad_(True)
    try:
        yield
    finally:
        for n, p in model.named_parameters():
            p.requires_grad_(n not in frozen)


def _layers_run(model: nn.Module, example_inputs: Any, training: bool) -> list[nn.Module] | None:
    """Conv/linear layers one forward runs, in order (``None`` when the forward fails in that mode)."""
    order: list[nn.Module] = []
    handles = [
        m.register_forward_hook(lambda mod, _i, _o: order.append(mod))
        for m in model.modules()
        if isinstance(m, CONV_LINEAR)
    ]
    try:
        with torch.no_grad(), train_mode(model) if training else eval_mode(model):
            call_model(model, example_inputs)
    except Exception:  # e.g. BatchNorm on one sample in train mode: that mode is not checked
        return None
    finally:
        for h in handles:
            h.remove()
    return order


def training_only_layers(model: nn.Module, example_inputs: Any) -> list[nn.Module]:
    """Conv/linear layers that run in train mode but not in eval mode (aux heads): tracing must see them too."""
    trained = _layers_run(model, example_inputs, True)
    evaluated = _layers_run(model, example_inputs, False)
    if trained is None or evaluated is None:
        return []
    seen = {id(m) for m in evaluated}
    return list({id(m): m for m in trained if id(m) not in seen}.values())


def output_layers(
    model: nn.Module, example_inputs: Any, training: bool = False, every_path: bool = True
) -> list[nn.Module]:
    """The conv/linear layers that produce the model's outputs: for every output tensor (dict, tuple, ModelOutput),
    the nearest layer on every path behind it in the autograd graph (``every_path=False``: only the nearest of them,
    the head itself). Their output channels are what the caller consumes.
    """
    return _layers_behind(model, example_inputs, None, training, every_path)


def feeding_layers(model: nn.Module, example_inputs: Any, targets: Sequence[nn.Module]) -> list[nn.Module]:
    """The conv/linear layers nearest behind the inputs of ``targets`` (eval mode): the layers that set their widths."""
    return _layers_behind(model, example_inputs, targets, False) if targets else []


def _layers_behind(
    model: nn.Module, example_inputs: Any, targets: Sequence[nn.Module] | None, training: bool, every_path: bool = True
) -> list[nn.Module]:
    """Nearest conv/linear layers behind the outputs (``targets=None``) or behind the inputs of ``targets``."""
    producers: dict[Any, nn.Module] = {}
    starts: list[torch.Tensor] = []

    def hook(module: nn.Module, _inp: Any, out: Any) -> None:
        if isinstance(out, torch.Tensor) and out.grad_fn is not None:
            producers[out.grad_fn] = module

    handles = [m.register_forward_hook(hook) for m in model.modules() if is_conv_or_linear(m)]
    handles += [t.register_forward_pre_hook(lambda _m, inp: starts.extend(flat_tensors(inp))) for t in targets or []]
    try:
        with torch.enable_grad(), all_trainable(model), train_mode(model) if training else eval_mode(model):
            outputs = flat_tensors(call_model(model, example_inputs))
    finally:
        for h in handles:
            h.remove()
    found: dict[int, nn.Module] = {}
    roots = [t.grad_fn for t in (outputs if targets is None else starts) if t.grad_fn is not None]
    for level in [roots] if every_path else [[r] for r in roots]:  # all at once, or each output on its own
        visited: set[Any] = set()
        while level:
            hits = [fn for fn in level if fn in producers]
            found.update({id(producers[fn]): producers[fn] for fn in hits})
            if hits and not every_path:
                break  # the nearest layers (the head); deeper ones reach the output only through it or a residual
            visited.update(level)
            # stop at the first layer on each path: what is behind it keeps its width freely
            level = list(
                {
                    nxt: None
                    for fn in level
                    if fn not in producers
                    for nxt, _ in fn.next_functions
                    if nxt is not None and nxt not in visited
                }
            )
    return list(found.values())


def default_ignored_layers(model: nn.Module, example_inputs: Any = None, every_path: bool = True) -> list[str]:
    """The output layers: every head's final conv/linear (dict, tuple and ``ModelOutput`` outputs, aux heads that run
    only in training included), found from the outputs' autograd graphs; without inputs, the last registered layer.

    ``every_path=True`` (structured pruning) holds the nearest layer on every path to an output, so that no output
    changes shape (a concatenation of two branches, a hidden state at the end of a residual stream);
    ``every_path=False`` (masks, which change no shape) holds only the nearest layers of each output.
    """
    names = {m: n for n, m in model.named_modules()}
    if example_inputs is None:
        return [n for n, m in model.named_modules() if is_conv_or_linear(m)][-1:]
    heads = {id(m): m for m in output_layers(model, example_inputs, every_path=every_path)}
    with contextlib.suppress(Exception):  # a model whose train-mode forward fails on these inputs: eval heads only
        heads.update({id(m): m for m in output_layers(model, example_inputs, True, every_path)})
    if not heads:  # outputs without an autograd graph (e.g. computed under no_grad): the last layer run
        order: list[str] = []
        _forward_with_hooks(model, example_inputs, lambda mod, _i, _o: order.append(names[mod]))
        return order[-1:]
    return [names[m] for m in model.modules() if id(m) in heads]


def resolve_layers(model: nn.Module, names: Sequence[str]) -> list[nn.Module]:
    hint = "use the attribute path, like 'head' or 'backbone.0.0'."
    check_module_names("ignored_layers", [n for n in names if n != ""], model, hint=hint)  # "" is the model itself
    return [model.get_submodule(n) for n in names]
