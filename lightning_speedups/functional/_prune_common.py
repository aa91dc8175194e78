"""What both pruning modes share: summaries, exact parameter counts, MACs, the classifier default, name checks."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from lightning_speedups._errors import check_module_names
from lightning_speedups._rebuild import ParamOrigin
from lightning_speedups.functional._masks import weight_mask

__all__ = [
    "PRUNABLE",
    "PruningSummary",
    "SparsityReport",
    "count_macs",
    "default_ignored_layers",
    "eval_mode",
    "forward",
    "resolve_layers",
    "sparsity_report",
]

PRUNABLE = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.Linear)
_MASKED_SUFFIX = ".parametrizations.weight.original"


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
        if name.endswith(_MASKED_SUFFIX):  # a parametrized (masked) weight: count it as `weight`, mask applied
            mod_name = name[: -len(_MASKED_SUFFIX)]
            mask = weight_mask(model.get_submodule(mod_name))
            name = f"{mod_name}.weight"
            tensor = tensor * mask if mask is not None else tensor
        elif name.endswith("_orig"):  # torch.nn.utils.prune's weight_orig / weight_mask pair
            mod_name, _, attr = name[: -len("_orig")].rpartition(".")
            mask = getattr(model.get_submodule(mod_name), attr + "_mask", None)
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

    _forward_with_hooks(model, example_inputs, hook)
    return total


def _forward_with_hooks(model: nn.Module, example_inputs: Any, hook: Any) -> None:
    """One eval-mode, no-grad forward with ``hook`` on every conv/linear layer (removed afterwards)."""
    handles = [m.register_forward_hook(hook) for m in model.modules() if isinstance(m, PRUNABLE)]
    try:
        with torch.no_grad(), eval_mode(model):
            forward(model, example_inputs)
    finally:
        for h in handles:
            h.remove()


def forward(model: nn.Module, example_inputs: Any) -> Any:
    if isinstance(example_inputs, dict):
        return model(**example_inputs)
    if isinstance(example_inputs, (tuple, list)):
        return model(*example_inputs)
    return model(example_inputs)


@contextlib.contextmanager
def eval_mode(model: nn.Module) -> Iterator[None]:
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
        _forward_with_hooks(model, example_inputs, lambda mod, _i, _o: order.append(names[mod]))
    else:
        order = [n for n, m in model.named_modules() if isinstance(m, PRUNABLE)]
    return order[-1:]


def resolve_layers(model: nn.Module, names: Sequence[str]) -> list[nn.Module]:
    hint = "use the attribute path, like 'head' or 'backbone.0.0'."
    check_module_names("ignored_layers", [n for n in names if n != ""], model, hint=hint)  # "" is the model itself
    return [model.get_submodule(n) for n in names]
