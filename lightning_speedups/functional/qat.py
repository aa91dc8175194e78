"""Quantization-aware training without Lightning: torchao fake quantization that survives checkpoints.

:func:`prepare_qat` swaps ``nn.Linear`` / ``nn.Conv2d`` for fake-quantized twins built on torchao's
``IntxFakeQuantizer`` (int8 per-channel symmetric weights, int8 per-token asymmetric activations). The twins share the
original ``Parameter`` objects and add no parameters or buffers, so optimizers, DDP and ``state_dict`` keys are
unchanged; :func:`qat_record` / the ``"qat"`` structure hook rebuild them in a fresh model before a strict load.
torchao's quantizers are *dynamic* (scales recomputed from every tensor), so there are no observers to calibrate.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from lightning_speedups._errors import SpeedupConfigError, check_choice, require
from lightning_speedups._structure import register_structure_hook

__all__ = [
    "ACTIVATION_DTYPES",
    "QAT_LAYERS",
    "QAT_RECORD_KEY",
    "WEIGHT_DTYPES",
    "FakeQuantConfig",
    "FakeQuantConv2d",
    "FakeQuantLinear",
    "QATSummary",
    "is_fake_quantized",
    "prepare_qat",
    "qat_record",
    "remove_fake_quantization",
]

QAT_RECORD_KEY = "qat"
WEIGHT_DTYPES = ("int8", "int4")
ACTIVATION_DTYPES = ("int8", None)
QAT_LAYERS = ("linear", "conv2d")


@dataclass
class FakeQuantConfig:
    """What to fake-quantize during QAT.

    Args:
        weight_dtype: ``"int8"`` (matches the int8 inference kernels) or ``"int4"``; per-channel symmetric.
        activation_dtype: ``"int8"`` (per-token asymmetric, dynamic) or ``None`` for weight-only fake quantization.
        layers: layer kinds to convert, any of ``"linear"``, ``"conv2d"``.
        exclude: module names (or name prefixes) left in float, e.g. ``("head",)``.
    """

    weight_dtype: str = "int8"
    activation_dtype: str | None = "int8"
    layers: tuple[str, ...] = QAT_LAYERS
    exclude: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        check_choice("weight_dtype", self.weight_dtype, WEIGHT_DTYPES)
        check_choice("activation_dtype", self.activation_dtype, ACTIVATION_DTYPES)
        self.layers = tuple(self.layers)
        self.exclude = tuple(self.exclude)
        if not self.layers:
            raise SpeedupConfigError(f"`layers`={self.layers!r} is empty. Allowed values: a subset of {QAT_LAYERS}.")
        for kind in self.layers:
            check_choice("layers", kind, QAT_LAYERS)


@dataclass
class QATSummary:
    """What :func:`prepare_qat` did: converted layer names and the layers it left in float (with reasons)."""

    converted: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)


def _fake_quantizers(config: FakeQuantConfig) -> tuple[nn.Module, nn.Module | None]:
    qat = require("torchao.quantization.qat", "quantization", "Quantization-aware training")
    from torchao.quantization.qat.fake_quantizer import IntxFakeQuantizer

    wdtype: Any = torch.int8 if config.weight_dtype == "int8" else torch.int4
    weight = IntxFakeQuantizer(qat.IntxFakeQuantizeConfig(wdtype, "per_channel", is_symmetric=True))
    act = None
    if config.activation_dtype is not None:
        act = IntxFakeQuantizer(qat.IntxFakeQuantizeConfig(torch.int8, "per_token", is_symmetric=False))
    return weight, act


class _FakeQuantMixin:
    """Adds torchao fake quantizers (no parameters, no buffers) in front of a Linear/Conv2d's weight and input."""

    weight: nn.Parameter
    weight_fake_quantizer: nn.Module
    activation_fake_quantizer: nn.Module | None

    def _fq_weight(self) -> torch.Tensor:
        # under no_grad a view of the weight would still claim requires_grad without a grad_fn, which breaks
        # hooks that inspect inputs (Lightning's model summary runs a FLOP counter under no_grad)
        w = self.weight if torch.is_grad_enabled() else self.weight.detach()
        # per-output-channel scales: torchao quantizes 2-D tensors row-wise, so flatten the conv kernel
        return self.weight_fake_quantizer(w.reshape(w.shape[0], -1)).reshape(w.shape)

    def _fq_input(self, x: torch.Tensor) -> torch.Tensor:
        if self.activation_fake_quantizer is None:
            return x
        if x.dim() > 2 and isinstance(self, nn.Conv2d):  # one scale per sample for feature maps
            return self.activation_fake_quantizer(x.reshape(x.shape[0], -1)).reshape(x.shape)
        return self.activation_fake_quantizer(x)


class FakeQuantLinear(_FakeQuantMixin, nn.Linear):
    """``nn.Linear`` with fake-quantized weight and input; same parameters and ``state_dict`` keys."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(self._fq_input(x), self._fq_weight(), self.bias)


class FakeQuantConv2d(_FakeQuantMixin, nn.Conv2d):
    """``nn.Conv2d`` with fake-quantized weight and input; same parameters and ``state_dict`` keys."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._conv_forward(self._fq_input(x), self._fq_weight(), self.bias)


def _swap(parent: nn.Module, child_name: str, module: nn.Module, config: FakeQuantConfig) -> nn.Module:
    cls: type = FakeQuantLinear if isinstance(module, nn.Linear) else FakeQuantConv2d
    new = copy.copy(module)  # shallow: shares Parameters, hooks and attributes with the original
    new.__class__ = cls
    new._modules = dict(module._modules)
    new._parameters = dict(module._parameters)
    weight, act = _fake_quantizers(config)
    new.weight_fake_quantizer = weight
    new.activation_fake_quantizer = act
    setattr(parent, child_name, new)
    return new


def _eligible(name: str, module: nn.Module, config: FakeQuantConfig) -> str | None:
    """``None`` when ``module`` can be fake-quantized, else the reason it is skipped."""
    if any(name == p or name.startswith(p + ".") for p in config.exclude):
        return "excluded"
    if type(module) is nn.Linear and "linear" in config.layers:
        return None if module.in_features > 1 else "in_features < 2"
    if type(module) is nn.Conv2d and "conv2d" in config.layers:
        return None if module.weight[0].numel() > 1 else "kernel with a single weight per channel"
    return "layer kind not selected"


def prepare_qat(model: nn.Module, config: FakeQuantConfig | None = None, dry_run: bool = False) -> QATSummary:
    """Insert torchao fake quantization into ``model`` in place (idempotent) and return what changed.

    Args:
        model: any module; its ``nn.Linear`` / ``nn.Conv2d`` children are swapped for fake-quantized twins that share
            the same parameters (the optimizer keeps working, no new ``state_dict`` keys).
        config: what to fake-quantize (default: int8 weights and activations, Linear and Conv2d).
        dry_run: only report what would be converted (and raise if nothing would), change nothing.

    Returns:
        A :class:`QATSummary`.

    Raises:
        SpeedupConfigError: when no layer is eligible.
        ImportError: when torchao (the ``quantization`` extra) is missing.

    Example::

        >>> net = nn.Sequential(nn.Linear(8, 4), nn.ReLU(), nn.Linear(4, 2))
        >>> prepare_qat(net).converted
        ['0', '2']
    """
    config = config or FakeQuantConfig()
    summary = QATSummary()
    for name, module in list(model.named_modules()):
        if isinstance(module, _FakeQuantMixin):
            summary.converted.append(name)
            continue
        if not isinstance(module, (nn.Linear, nn.Conv2d)):
            continue
        reason = _eligible(name, module, config)
        if reason is not None:
            summary.skipped[name] = reason
            continue
        if not dry_run:
            parent_name, _, child = name.rpartition(".")
            _swap(model.get_submodule(parent_name), child, module, config)
        summary.converted.append(name)
    if not summary.converted:
        raise SpeedupConfigError(
            f"`model` has no layer eligible for QAT with `layers`={config.layers!r}, `exclude`={config.exclude!r}. "
            f"Skipped: {summary.skipped or 'no Linear/Conv2d layers'}. Allowed values: a model with an nn.Linear or "
            "nn.Conv2d layer of a kind in `layers` and not in `exclude`. HINT: QAT converts nn.Linear and nn.Conv2d."
        )
    return summary


def remove_fake_quantization(model: nn.Module) -> list[str]:
    """Turn fake-quantized layers back into plain ``nn.Linear`` / ``nn.Conv2d`` in place; return their names."""
    names = []
    for name, module in list(model.named_modules()):
        if isinstance(module, _FakeQuantMixin):
            plain = copy.copy(module)
            plain.__class__ = nn.Linear if isinstance(module, nn.Linear) else nn.Conv2d
            plain._modules = {k: v for k, v in module._modules.items() if not k.endswith("_fake_quantizer")}
            parent_name, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent_name), child, plain)
            names.append(name)
    return names


def qat_record(model: nn.Module) -> dict[str, Any] | None:
    """The plain-python architecture record of ``model``'s fake quantization, or ``None`` if it has none."""
    layers: dict[str, dict[str, Any]] = {}
    for name, module in model.named_modules():
        if isinstance(module, _FakeQuantMixin):
            wcfg = module.weight_fake_quantizer.config
            act = module.activation_fake_quantizer
            layers[name] = {
                "weight_dtype": "int8" if wcfg.dtype == torch.int8 else "int4",
                "activation_dtype": None if act is None else "int8",
            }
    return {"version": 1, "layers": layers} if layers else None


def _apply_qat_record(module: nn.Module, record: dict[str, Any]) -> None:
    """Structure hook: re-insert the recorded fake quantizers into a fresh model (idempotent)."""
    for name, spec in record["layers"].items():
        layer = module.get_submodule(name)
        if isinstance(layer, _FakeQuantMixin):
            continue
        config = FakeQuantConfig(spec["weight_dtype"], spec["activation_dtype"])
        parent_name, _, child = name.rpartition(".")
        _swap(module.get_submodule(parent_name), child, layer, config)


register_structure_hook(QAT_RECORD_KEY, _apply_qat_record)


def is_fake_quantized(module: nn.Module) -> bool:
    """True for a layer :func:`prepare_qat` converted."""
    return isinstance(module, _FakeQuantMixin)
