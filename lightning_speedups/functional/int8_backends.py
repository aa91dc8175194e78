"""The int8 inference paths :func:`~lightning_speedups.functional.quantize_for_inference` chooses from: a handler
registry.

Each backend is one :class:`Int8Backend` entry (torchao's ``register_quantize_module_handler`` style): a builder that
turns a float eval-mode copy into an int8 model, plus what the chooser and the loaders need to know about it. A new
path is a new entry, not an edit of a long ``if`` chain::

    register_int8_backend(Int8Backend("my_backend", build=my_builder))
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from lightning_speedups._errors import check_choice, require

__all__ = [
    "Int8Backend",
    "called_linears",
    "count_quantized_layers",
    "get_int8_backend",
    "list_int8_backends",
    "register_int8_backend",
]

# build(float_copy, example_args, calibration_batches, calibrate) -> int8 model
Builder = Callable[[nn.Module, tuple[Any, ...], Sequence[tuple[Any, ...]], bool], nn.Module]
# torch.ao's converted modules (static, dynamic, fused): their `weight` is a method returning the int8 weight
_AO_QUANTIZED = ("torch.ao.nn.quantized", "torch.ao.nn.intrinsic.quantized")


def count_quantized_layers(model: nn.Module) -> int:
    """How many layers of ``model`` compute with int8 weights: torch.ao's quantized modules and layers whose weight is
    a quantized tensor subclass (torchao).

    Example::

        >>> count_quantized_layers(nn.Sequential(nn.Linear(4, 4)))
        0
    """
    count = 0
    for module in model.modules():
        weight = getattr(module, "weight", None)
        if type(module).__module__.startswith(_AO_QUANTIZED) and callable(weight):
            count += 1
        elif isinstance(weight, torch.Tensor) and (weight.is_quantized or type(weight.data) is not torch.Tensor):
            count += 1  # torchao swaps the weight for an int8 tensor subclass and keeps the module class
    return count


@dataclass(frozen=True)
class Int8Backend:
    """One int8 inference path.

    Args:
        name: the ``backend=`` value.
        build: ``build(float_copy, example_args, calibration_batches, calibrate) -> int8 model``; ``calibrate=False``
            when rebuilding for :func:`~lightning_speedups.functional.load_quantized` (the saved scales are loaded
            next).
        saveable: whether ``state_dict`` + recipe can rebuild it (compiled graphs cannot).
        needs_compile: tried by ``backend="auto"`` only with ``allow_compile=True`` (compiling takes tens of seconds).
        load_assign: load its ``state_dict`` with ``assign=True`` (tensor-subclass weights).
        static: calibrated on data (its held-out error is the one that can differ from the calibration error).
        count: ``count(int8_model) -> int``, how many layers it quantized; a candidate that quantized none is never
            chosen.
    """

    name: str
    build: Builder
    saveable: bool = True
    needs_compile: bool = False
    load_assign: bool = False
    static: bool = False
    count: Callable[[nn.Module], int] = count_quantized_layers


_BACKENDS: dict[str, Int8Backend] = {}


def register_int8_backend(backend: Int8Backend) -> Int8Backend:
    """Add (or replace) an int8 inference path; ``"auto"`` tries them in registration order."""
    _BACKENDS[backend.name] = backend
    return backend


def list_int8_backends() -> list[str]:
    """Names of the registered int8 inference paths, in the order ``"auto"`` tries them."""
    return list(_BACKENDS)


def get_int8_backend(name: str) -> Int8Backend:
    """The registered backend called ``name``; an unknown name raises and lists the valid ones."""
    check_choice("backend", name, list(_BACKENDS), hint="use 'auto' to measure every path")
    return _BACKENDS[name]


@contextlib.contextmanager
def quiet_ao() -> Iterator[None]:
    """Silence only ``torch.ao.quantization``'s deprecation and "observer never ran" notices."""
    # torch.ao.quantization is deprecated (torchao PT2E replaces it) but its int8 CPU kernels are still the fastest
    # eager path here
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"torch\.ao\.quantization is deprecated")
        warnings.filterwarnings("ignore", message=r".*must run observer before calling calculate_qparams")
        warnings.filterwarnings("ignore", message=r".*reduce_range will be deprecated")
        yield


def _x86_engine() -> None:
    engines = torch.backends.quantized.supported_engines
    for engine in ("x86", "fbgemm", "qnnpack"):
        if engine in engines:
            torch.backends.quantized.engine = engine
            return


def _calibrate(model: nn.Module, calibration: Sequence[tuple[Any, ...]]) -> None:
    with torch.no_grad():
        for batch in calibration:
            model(*batch)


def _fx_static(model: nn.Module, example: tuple[Any, ...], calibration: Sequence[tuple[Any, ...]], calibrate: bool):
    with quiet_ao():
        from torch.ao.quantization import get_default_qconfig_mapping
        from torch.ao.quantization.quantize_fx import convert_fx, prepare_fx

        _x86_engine()
        prepared = prepare_fx(model, get_default_qconfig_mapping(torch.backends.quantized.engine), example)
        if calibrate:
            _calibrate(prepared, calibration)
        return convert_fx(prepared)


def called_linears(model: nn.Module, example: tuple[Any, ...]) -> set[str]:
    """The names of the ``nn.Linear`` modules that a forward pass on ``example`` calls as modules.

    A Linear whose weight the parent's forward reads itself (``F.linear(x, self.qkv.weight)``: timm's EVA, BEiT and
    Swin v2 attention) is never called. Swapping it for a dynamic int8 layer breaks that read (a torch.ao quantized
    Linear's ``weight`` is a method) or quantizes nothing, so the dynamic paths leave such layers in float and
    quantize the others.

    Example::

        >>> sorted(called_linears(nn.Sequential(nn.Linear(4, 4), nn.ReLU()), (torch.randn(2, 4),)))
        ['0']
    """
    called: set[str] = set()

    def hook(name: str) -> Callable[..., None]:
        return lambda _module, _args: called.add(name)

    handles = [m.register_forward_pre_hook(hook(n)) for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    try:
        with torch.no_grad():
            model(*example)
    finally:
        for handle in handles:
            handle.remove()
    return called


def _eager_dynamic(model: nn.Module, example: tuple[Any, ...], calibration: Sequence[tuple[Any, ...]], calibrate: bool):
    layers = called_linears(model, example)
    with quiet_ao():
        from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

        _x86_engine()
        return quantize_dynamic(model, dict.fromkeys(sorted(layers), per_channel_dynamic_qconfig), dtype=torch.qint8)


def _torchao_dynamic(
    model: nn.Module, example: tuple[Any, ...], calibration: Sequence[tuple[Any, ...]], calibrate: bool
):
    tq = require("torchao.quantization", "quantization", "torchao int8 inference")
    layers = called_linears(model, example)
    tq.quantize_(
        model,
        tq.Int8DynamicActivationInt8WeightConfig(),
        filter_fn=lambda module, name: isinstance(module, nn.Linear) and name in layers,
    )
    return model


def _pt2e_inductor(model: nn.Module, example: tuple[Any, ...], calibration: Sequence[tuple[Any, ...]], calibrate: bool):
    require("torchao.quantization.pt2e", "quantization", "PT2E int8 inference")
    import torchao.quantization.pt2e.quantizer.x86_inductor_quantizer as xiq
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    exported = torch.export.export(model, example).module()
    quantizer = xiq.X86InductorQuantizer().set_global(xiq.get_default_x86_inductor_quantization_config())
    prepared = prepare_pt2e(exported, quantizer)
    _calibrate(prepared, calibration)
    return torch.compile(convert_pt2e(prepared))


def _count_pt2e(model: nn.Module) -> int:
    """Weights dequantized per channel in the converted graph: one per quantized conv/linear (X86InductorQuantizer)."""
    graph_module = getattr(model, "_orig_mod", model)  # under torch.compile's wrapper; compiles nothing
    graph = getattr(graph_module, "graph", None)
    return 0 if graph is None else sum("dequantize_per_channel" in str(node.target) for node in graph.nodes)


# "auto" tries them in this order: torch.ao FX static (Conv/Linear/BN/ReLU fused), torch.ao dynamic (Linear only),
# torchao dynamic (the maintained API; slow on CPU without compile), PT2E + inductor (compile: opt-in)
register_int8_backend(Int8Backend("fx_static", _fx_static, static=True))
register_int8_backend(Int8Backend("eager_dynamic", _eager_dynamic))
register_int8_backend(Int8Backend("torchao_dynamic", _torchao_dynamic, load_assign=True))
register_int8_backend(
    Int8Backend("pt2e_inductor", _pt2e_inductor, saveable=False, needs_compile=True, static=True, count=_count_pt2e)
)
