"""Quantization without Lightning: fake-quantization for QAT, int8 inference picked by measurement, float8 training.

Three pieces, each a plain function on an ``nn.Module``:

- :func:`prepare_qat` swaps ``nn.Linear`` / ``nn.Conv2d`` for fake-quantized twins built on torchao's
  ``IntxFakeQuantizer`` (int8 per-channel symmetric weights, int8 per-token asymmetric activations). The twins share
  the original ``Parameter`` objects and add no parameters or buffers, so optimizers, DDP and ``state_dict`` keys are
  unchanged; :func:`qat_record` / the ``"qat"`` structure hook rebuild them in a fresh model before a strict load.
  torchao's quantizers are *dynamic* (scales recomputed from every tensor), so there are no observers to calibrate.
- :func:`quantize_for_inference` measures the int8 paths available on this machine and keeps the fastest whose output
  stays within tolerance; when none is faster than the float model it returns the float model and warns.
  :func:`save_quantized` / :func:`load_quantized` store and rebuild the int8 model as ``state_dict`` + recipe.
- :func:`convert_to_float8` converts eligible ``nn.Linear`` layers with torchao float8 (CUDA capability >= 8.9).
"""

from __future__ import annotations

import contextlib
import copy
import io
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from lightning_speedups._errors import SpeedupConfigError, check_choice, check_range, require
from lightning_speedups._structure import register_structure_hook
from lightning_speedups.measure import interleaved_timings, median

__all__ = [
    "FakeQuantConfig",
    "QATSummary",
    "QuantizationReport",
    "Float8Summary",
    "INFERENCE_BACKENDS",
    "prepare_qat",
    "remove_fake_quantization",
    "qat_record",
    "quantize_for_inference",
    "save_quantized",
    "load_quantized",
    "model_size_bytes",
    "float8_supported",
    "float8_filter",
    "convert_to_float8",
]

QAT_RECORD_KEY = "qat"
WEIGHT_DTYPES = ("int8", "int4")
ACTIVATION_DTYPES = ("int8", None)
QAT_LAYERS = ("linear", "conv2d")
# candidate int8 inference paths, in the order they are tried; "auto" measures all that apply
INFERENCE_BACKENDS = ("fx_static", "eager_dynamic", "torchao_dynamic", "pt2e_inductor")
FLOAT8_RECIPES = ("tensorwise", "rowwise", "rowwise_with_gw_hp")
_TORCH_DTYPES = {"int8": torch.int8, "int4": "int4"}


# ----------------------------------------------------------------------------------------------------------------- QAT
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
            f"Skipped: {summary.skipped or 'no Linear/Conv2d layers'}. HINT: QAT converts nn.Linear and nn.Conv2d."
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


# ------------------------------------------------------------------------------------------------ int8 inference
@dataclass
class QuantizationReport:
    """What :func:`quantize_for_inference` measured and chose.

    ``speedup`` is fp32 latency / int8 latency on the example input (> 1 = faster); ``max_abs_diff`` compares outputs
    on the example input; ``candidates`` holds every backend tried (speedup, error, or why it failed).
    """

    backend: str
    size_before_bytes: int
    size_after_bytes: int
    latency_before_s: float
    latency_after_s: float
    max_abs_diff: float
    unsupported_layers: list[str] = field(default_factory=list)
    candidates: dict[str, dict[str, Any]] = field(default_factory=dict)
    recipe: dict[str, Any] = field(default_factory=dict)

    @property
    def speedup(self) -> float:
        return self.latency_before_s / max(self.latency_after_s, 1e-12)

    @property
    def size_ratio(self) -> float:
        """How many times smaller the returned model is."""
        return self.size_before_bytes / max(self.size_after_bytes, 1)

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(speedup=self.speedup, size_ratio=self.size_ratio)
        return d


@contextlib.contextmanager
def _quiet_ao() -> Iterator[None]:
    # torch.ao.quantization is deprecated (torchao PT2E replaces it) but its int8 CPU kernels are still the fastest
    # eager path here; silence only its deprecation and "observer never ran" notices
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"torch\.ao\.quantization is deprecated")
        warnings.filterwarnings("ignore", message=r".*must run observer before calling calculate_qparams")
        warnings.filterwarnings("ignore", message=r".*reduce_range will be deprecated")
        yield


def model_size_bytes(model: nn.Module) -> int:
    """Bytes of ``model``'s serialized ``state_dict`` (works for float, packed int8 and torchao tensors)."""
    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)
    return buf.getbuffer().nbytes


def _as_tuple(example_inputs: Any) -> tuple[Any, ...]:
    items = tuple(example_inputs) if isinstance(example_inputs, (tuple, list)) else (example_inputs,)
    return tuple(t.cpu() if isinstance(t, torch.Tensor) else t for t in items)


def _float_copy(model: nn.Module) -> nn.Module:
    """An eval-mode deep copy without fake quantization (never copying an attached Trainer)."""
    memo: dict[int, Any] = {}
    for attr in ("_trainer", "_fabric"):
        obj = model.__dict__.get(attr)
        if obj is not None:
            memo[id(obj)] = None
    for module in model.modules():  # fake quantizers cache scales that may carry autograd history: drop, not copy
        if isinstance(module, _FakeQuantMixin):
            for fq in (module.weight_fake_quantizer, module.activation_fake_quantizer):
                if fq is not None:
                    memo[id(fq)] = None
    clone = copy.deepcopy(model, memo)
    remove_fake_quantization(clone)
    return clone.cpu().eval()  # the int8 kernels measured here are CPU kernels


def _float_layers(model: nn.Module) -> list[str]:
    kinds = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)
    # torchao keeps the module class and swaps the weight for an int8 tensor subclass: only plain tensors are float
    return [
        n
        for n, m in model.named_modules()
        if (type(m) in kinds or isinstance(m, _FakeQuantMixin)) and type(m.weight.data) is torch.Tensor
    ]


def _x86_engine() -> None:
    engines = torch.backends.quantized.supported_engines
    for engine in ("x86", "fbgemm", "qnnpack"):
        if engine in engines:
            torch.backends.quantized.engine = engine
            return


def _build(
    backend: str, model: nn.Module, example: tuple[Any, ...], calibration: Sequence[tuple[Any, ...]], calibrate: bool
) -> nn.Module:
    """Build one int8 candidate from a float eval-mode copy (``calibrate=False`` when rebuilding for a load)."""
    if backend == "eager_dynamic":
        with _quiet_ao():
            from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

            _x86_engine()
            return quantize_dynamic(model, {nn.Linear: per_channel_dynamic_qconfig}, dtype=torch.qint8)
    if backend == "fx_static":
        with _quiet_ao():
            from torch.ao.quantization import get_default_qconfig_mapping
            from torch.ao.quantization.quantize_fx import convert_fx, prepare_fx

            _x86_engine()
            prepared = prepare_fx(model, get_default_qconfig_mapping(torch.backends.quantized.engine), example)
            if calibrate:
                with torch.no_grad():
                    for batch in calibration:
                        prepared(*batch)
            return convert_fx(prepared)
    if backend == "torchao_dynamic":
        tq = require("torchao.quantization", "quantization", "torchao int8 inference")
        tq.quantize_(model, tq.Int8DynamicActivationInt8WeightConfig())
        return model
    if backend == "pt2e_inductor":
        require("torchao.quantization.pt2e", "quantization", "PT2E int8 inference")
        import torchao.quantization.pt2e.quantizer.x86_inductor_quantizer as xiq
        from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

        exported = torch.export.export(model, example).module()
        quantizer = xiq.X86InductorQuantizer().set_global(xiq.get_default_x86_inductor_quantization_config())
        prepared = prepare_pt2e(exported, quantizer)
        with torch.no_grad():
            for batch in calibration:
                prepared(*batch)
        return torch.compile(convert_pt2e(prepared))
    raise SpeedupConfigError(f"`backend`={backend!r} is not supported. Allowed values: {INFERENCE_BACKENDS}.")


def _recipe(backend: str, example: tuple[Any, ...]) -> dict[str, Any]:
    return {
        "format_version": 1,
        "backend": backend,
        "engine": torch.backends.quantized.engine,
        "example_shapes": [list(t.shape) for t in example if isinstance(t, torch.Tensor)],
        "torch": torch.__version__,
    }


def quantize_for_inference(
    model: nn.Module,
    example_inputs: Any,
    backend: str = "auto",
    *,
    calibration_data: Iterable[Any] | None = None,
    max_rel_error: float = 0.1,
    min_speedup: float = 1.0,
    allow_compile: bool = False,
    repeats: int = 7,
) -> tuple[nn.Module, QuantizationReport]:
    """Return an int8 copy of ``model`` that is faster on this machine, and a :class:`QuantizationReport`.

    ``model`` itself is not changed (fake quantization from QAT is stripped in a CPU copy). Candidates:

    - ``"fx_static"``: ``torch.ao`` FX static int8 (Conv/Linear/BN/ReLU fused, calibrated on ``calibration_data``);
    - ``"eager_dynamic"``: ``torch.ao`` dynamic int8 for ``nn.Linear`` (weights int8, activations quantized per call);
    - ``"torchao_dynamic"``: torchao ``Int8DynamicActivationInt8WeightConfig`` in eager mode (the maintained API;
      slow on CPU without ``torch.compile``, so it rarely wins here);
    - ``"pt2e_inductor"``: torchao PT2E + ``X86InductorQuantizer`` + ``torch.compile`` (only with
      ``allow_compile=True``: compiling takes tens of seconds on a small CPU).

    Args:
        model: float model (``nn.Module`` or ``LightningModule``).
        example_inputs: a tensor or tuple of tensors with a realistic batch size: latency is measured on it.
        backend: ``"auto"`` (measure all, keep the fastest within tolerance) or one of the names above.
        calibration_data: batches (tensors or tuples) for static calibration; default: ``example_inputs``.
        max_rel_error: a candidate is rejected when ``max|out_int8 - out_fp32| > max_rel_error * max|out_fp32|``.
        min_speedup: a result must be at least this much faster, otherwise the float model is returned with a warning.
        allow_compile: also try the ``torch.compile`` based PT2E path.
        repeats: interleaved timing rounds.

    Returns:
        ``(model, report)``; ``report.backend == "none"`` and the float copy when nothing qualified.

    Raises:
        SpeedupConfigError: unknown ``backend`` or out-of-range tolerances.

    Example::

        >>> net = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
        >>> qnet, report = quantize_for_inference(net, torch.randn(64, 256), repeats=2)
        >>> report.size_ratio > 1 or report.backend == "none"
        True
    """
    check_choice("backend", backend, ("auto", *INFERENCE_BACKENDS), hint="use 'auto' to measure every path")
    check_range("max_rel_error", max_rel_error, 0.0, None, low_inclusive=False)
    check_range("min_speedup", min_speedup, 0.0, None)
    check_range("repeats", repeats, 1, None)
    if backend == "pt2e_inductor":
        allow_compile = True
    example = _as_tuple(example_inputs)
    calibration = [_as_tuple(b) for b in (calibration_data if calibration_data is not None else [example])]
    reference = _float_copy(model)
    with torch.no_grad():
        ref_out = reference(*example)
    scale = max(float(ref_out.abs().max()), 1e-12)
    names = list(INFERENCE_BACKENDS) if backend == "auto" else [backend]
    if not allow_compile and "pt2e_inductor" in names:
        names.remove("pt2e_inductor")

    candidates: dict[str, dict[str, Any]] = {}
    built: dict[str, nn.Module] = {}
    for name in names:
        try:
            qmodel = _build(name, _float_copy(model), example, calibration, calibrate=True)
            with torch.no_grad():
                diff = float((qmodel(*example).float() - ref_out).abs().max())
        except Exception as err:  # a path that cannot handle this model is reported, not fatal
            candidates[name] = {"status": "failed", "error": f"{type(err).__name__}: {err}"[:300]}
            continue
        ok = diff <= max_rel_error * scale
        candidates[name] = {"status": "ok" if ok else "too_inaccurate", "max_abs_diff": diff}
        if ok:
            built[name] = qmodel

    def runner(m: nn.Module) -> Callable[[], Any]:
        def fn() -> Any:
            with torch.no_grad():
                return m(*example)

        return fn

    times = interleaved_timings(
        {"fp32": runner(reference), **{n: runner(m) for n, m in built.items()}}, repeats=repeats, warmup=2
    )
    base = median(times["fp32"])
    for name in built:
        candidates[name]["latency_s"] = median(times[name])
        candidates[name]["speedup"] = base / max(median(times[name]), 1e-12)
    size_before = model_size_bytes(reference)
    best = max(built, key=lambda n: candidates[n]["speedup"], default=None)
    if best is None or candidates[best]["speedup"] < max(min_speedup, 1e-12):
        why = "no candidate within tolerance"
        if best is not None:
            why = f"best ({best}) only {candidates[best]['speedup']:.2f}x"
        warnings.warn(f"quantize_for_inference: returning the float model ({why}; tried {candidates}).", stacklevel=2)
        return reference, QuantizationReport(
            "none", size_before, size_before, base, base, 0.0, _float_layers(reference), candidates
        )
    qmodel = built[best]
    report = QuantizationReport(
        backend=best,
        size_before_bytes=size_before,
        size_after_bytes=model_size_bytes(qmodel) if best != "pt2e_inductor" else size_before,
        latency_before_s=base,
        latency_after_s=candidates[best]["latency_s"],
        max_abs_diff=candidates[best]["max_abs_diff"],
        unsupported_layers=_float_layers(qmodel),
        candidates=candidates,
        recipe=_recipe(best, example),
    )
    return qmodel, report


def save_quantized(model: nn.Module, report: QuantizationReport, path: str) -> None:
    """Save an int8 model from :func:`quantize_for_inference` as ``{"recipe", "state_dict"}``.

    Rebuild it with :func:`load_quantized` from a freshly built float model of the same architecture.

    Raises:
        SpeedupConfigError: when the backend cannot be saved this way (``"pt2e_inductor"``, ``"none"``).
    """
    if report.backend not in ("fx_static", "eager_dynamic", "torchao_dynamic"):
        raise SpeedupConfigError(
            f"`report.backend`={report.backend!r} cannot be saved as state dict + recipe. Allowed values: "
            "'fx_static', 'eager_dynamic', 'torchao_dynamic'. HINT: save a compiled PT2E model with torch.export."
        )
    torch.save({"recipe": report.recipe, "state_dict": model.state_dict()}, path)


def load_quantized(path: str, float_model: nn.Module, example_inputs: Any) -> nn.Module:
    """Rebuild an int8 model saved by :func:`save_quantized` on a fresh float model (same architecture).

    The recipe replays the conversion without calibration, then the saved scales and int8 weights are loaded.
    """
    saved = torch.load(path, map_location="cpu", weights_only=False)
    recipe = saved["recipe"]
    if recipe.get("engine") in torch.backends.quantized.supported_engines:
        torch.backends.quantized.engine = recipe["engine"]
    example = _as_tuple(example_inputs)
    qmodel = _build(recipe["backend"], _float_copy(float_model), example, [], calibrate=False)
    with _quiet_ao():
        qmodel.load_state_dict(saved["state_dict"], assign=recipe["backend"] == "torchao_dynamic")
    return qmodel.eval()


# ------------------------------------------------------------------------------------------------------- float8
@dataclass
class Float8Summary:
    """Which ``nn.Linear`` layers :func:`convert_to_float8` converted and why the others were skipped."""

    converted: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)


def _cuda_capability() -> tuple[int, int] | None:
    return torch.cuda.get_device_capability() if torch.cuda.is_available() else None


def float8_supported() -> tuple[bool, str]:
    """``(True, "")`` on CUDA compute capability >= 8.9 (Ada, Hopper, Blackwell), else ``(False, reason)``."""
    cap = _cuda_capability()
    if cap is None:
        return False, "float8 training needs a CUDA GPU with compute capability >= 8.9, but no CUDA GPU is available"
    if tuple(cap) < (8, 9):
        return False, (
            f"float8 training needs CUDA compute capability >= 8.9 (Ada/Hopper); this GPU has {cap[0]}.{cap[1]}"
        )
    return True, ""


def float8_filter(
    module: nn.Module,
    fqn: str,
    *,
    min_features: int = 1024,
    exclude: Sequence[str] = (),
    filter_fn: Callable[[nn.Module, str], bool] | None = None,
) -> str | None:
    """``None`` when ``module`` should run in float8, else the reason it stays in high precision.

    Eligible: an ``nn.Linear`` whose in/out features are divisible by 16 (float8 GEMM requirement) and both at least
    ``min_features`` (small GEMMs get slower from the casts), not named in ``exclude``, and accepted by ``filter_fn``.
    """
    if type(module) is not nn.Linear:
        return "not an nn.Linear"
    if any(fqn == p or fqn.startswith(p + ".") for p in exclude):
        return "excluded"
    n, k = module.weight.shape
    if n % 16 or k % 16:
        return f"dims {k}x{n} not divisible by 16"
    if min(n, k) < min_features:
        return f"dims {k}x{n} below min_features={min_features}"
    if filter_fn is not None and not filter_fn(module, fqn):
        return "rejected by filter_fn"
    return None


def convert_to_float8(
    model: nn.Module,
    *,
    recipe: str = "tensorwise",
    min_features: int = 1024,
    exclude: Sequence[str] = (),
    filter_fn: Callable[[nn.Module, str], bool] | None = None,
    check_hardware: bool = True,
) -> Float8Summary:
    """Swap eligible ``nn.Linear`` layers for torchao ``Float8Linear`` in place (see :func:`float8_filter`).

    Raises:
        SpeedupConfigError: unknown recipe, hardware without float8 (when ``check_hardware``), no eligible layer.
    """
    check_choice("recipe", recipe, FLOAT8_RECIPES)
    if check_hardware:
        ok, reason = float8_supported()
        if not ok:
            raise SpeedupConfigError(
                f"float8 is unavailable: {reason}. HINT: Float8Training(skip_if_unsupported=True) skips instead."
            )
    summary = Float8Summary()
    for name, module in model.named_modules():
        why = float8_filter(module, name, min_features=min_features, exclude=exclude, filter_fn=filter_fn)
        if why is None:
            summary.converted.append(name)
        elif isinstance(module, nn.Linear):
            summary.skipped[name] = why
    if not summary.converted:
        raise SpeedupConfigError(
            f"`model` has no nn.Linear eligible for float8 (`min_features`={min_features}). Skipped: "
            f"{summary.skipped or 'no nn.Linear layers'}. HINT: float8 pays off for Linear layers >= 1024 wide."
        )
    f8 = require("torchao.float8", "quantization", "Float8 training")
    chosen = set(summary.converted)
    f8.convert_to_float8_training(
        model,
        module_filter_fn=lambda _m, fqn: fqn in chosen,
        config=f8.Float8LinearConfig.from_recipe_name(recipe),
    )
    return summary
