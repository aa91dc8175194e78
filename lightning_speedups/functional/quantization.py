"""Quantization without Lightning: int8 inference chosen by measurement, plus the QAT and float8 entry points.

- :func:`quantize_for_inference` builds every registered int8 path (:mod:`~lightning_speedups.functional.int8_backends`)
  on a copy of the model, rejects those whose error on *held-out* inputs is too large (calibrating and judging on
  the same inputs hides overfitted scales), then times the rest against the float model with
  :func:`~lightning_speedups.measure.compare` and keeps an int8 model only when it is faster beyond noise.
  :func:`save_quantized` / :func:`load_quantized` store and rebuild the int8 model as ``state_dict`` + recipe.
- QAT (:mod:`~lightning_speedups.functional.qat`) and float8 (:mod:`~lightning_speedups.functional.float8`) are
  re-exported here.
"""

from __future__ import annotations

import copy
import dataclasses
import io
import os
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import nn

from lightning_speedups._errors import SpeedupConfigError, check_choice, check_range
from lightning_speedups._heads import CONV_LINEAR
from lightning_speedups.functional.float8 import (
    FLOAT8_RECIPES,
    Float8Summary,
    convert_to_float8,
    float8_filter,
    float8_supported,
)
from lightning_speedups.functional.int8_backends import get_int8_backend, list_int8_backends, quiet_ao
from lightning_speedups.functional.qat import (
    ACTIVATION_DTYPES,
    QAT_LAYERS,
    QAT_RECORD_KEY,
    WEIGHT_DTYPES,
    FakeQuantConfig,
    QATSummary,
    is_fake_quantized,
    prepare_qat,
    qat_record,
    remove_fake_quantization,
)
from lightning_speedups.measure import Comparison, compare

__all__ = [
    "ACTIVATION_DTYPES",
    "FLOAT8_RECIPES",
    "INFERENCE_BACKENDS",
    "QAT_LAYERS",
    "QAT_RECORD_KEY",
    "WEIGHT_DTYPES",
    "FakeQuantConfig",
    "Float8Summary",
    "QATSummary",
    "QuantizationReport",
    "convert_to_float8",
    "float8_filter",
    "float8_supported",
    "load_quantized",
    "model_size_bytes",
    "prepare_qat",
    "qat_record",
    "quantize_for_inference",
    "remove_fake_quantization",
    "save_quantized",
    "split_calibration",
]

# the registered int8 paths at import time, in the order "auto" tries them (see int8_backends for the registry)
INFERENCE_BACKENDS = tuple(list_int8_backends())


@dataclass
class QuantizationReport:
    """What :func:`quantize_for_inference` measured and chose.

    ``speedup`` is fp32 latency / int8 latency on the example input (> 1 = faster). Errors are relative to
    ``max|out_fp32|``: ``heldout_rel_error`` on inputs the calibration never saw, ``calibration_rel_error`` on the
    calibration inputs (``max_rel_error`` applies to both); ``max_abs_diff`` is the held-out absolute error.
    ``candidates`` holds every backend tried (errors, speedup and its interval, layers quantized, or why it failed);
    ``decision`` is the timing evidence (medians, spread, trials, whether the winner was separated from noise).
    ``quantized_layers`` counts the layers of the returned model that compute in int8 (0 for the float model); a
    candidate that quantized none is never chosen (status ``"no_layer_quantized"``).
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
    heldout_rel_error: float = 0.0
    calibration_rel_error: float = 0.0
    decision: dict[str, Any] = field(default_factory=dict)
    quantized_layers: int = 0

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
        if is_fake_quantized(module):
            for fq in (module.weight_fake_quantizer, module.activation_fake_quantizer):
                if fq is not None:
                    memo[id(fq)] = None
    clone = copy.deepcopy(model, memo)
    remove_fake_quantization(clone)
    return clone.cpu().eval()  # the int8 kernels measured here are CPU kernels


def _float_layers(model: nn.Module) -> list[str]:
    # torchao keeps the module class and swaps the weight for an int8 tensor subclass: only plain tensors are float
    return [
        n
        for n, m in model.named_modules()
        if (type(m) in CONV_LINEAR or is_fake_quantized(m)) and type(m.weight.data) is torch.Tensor
    ]


def _recipe(backend: str, example: tuple[Any, ...]) -> dict[str, Any]:
    return {
        "format_version": 1,
        "backend": backend,
        "engine": torch.backends.quantized.engine,
        "example_shapes": [list(t.shape) for t in example if isinstance(t, torch.Tensor)],
        "torch": str(torch.__version__),  # plain str: the recipe loads with weights_only=True
    }


def _batch_len(batch: tuple[Any, ...]) -> int:
    return int(batch[0].shape[0]) if batch and isinstance(batch[0], torch.Tensor) and batch[0].dim() > 0 else 1


def split_calibration(
    example: tuple[Any, ...], calibration: Sequence[tuple[Any, ...]] | None
) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """``(calibrate_on, hold_out)``: the last quarter of the calibration batches (at least one) is held out; a
    single batch (or only the example) is split in half along its first dimension, each half tiled back to the
    batch size.

    Raises:
        SpeedupConfigError: a single batch of fewer than 2 samples (nothing to hold out).
    """
    batches = list(calibration) if calibration is not None else [example]
    if len(batches) >= 2:
        cut = len(batches) - max(1, len(batches) // 4)
        return batches[:cut], batches[cut:]
    batch = batches[0]
    n = _batch_len(batch)
    if n < 2:
        raise SpeedupConfigError(
            f"`calibration_data` is one batch of {n} sample(s): too small to split into calibration and held-out "
            "inputs. Allowed values: at least 2 samples (better 2 batches or more), or pass `validation_data`."
        )
    half = n // 2

    def part(sl: slice) -> tuple[Any, ...]:
        # each half is tiled back to the batch size: shape-specialised paths (export, compile) see the same shapes
        def tile(t: torch.Tensor) -> torch.Tensor:
            piece = t[sl]
            return torch.cat([piece] * -(-n // piece.shape[0]))[:n]

        return tuple(tile(t) if isinstance(t, torch.Tensor) and t.dim() > 0 and t.shape[0] == n else t for t in batch)

    return [part(slice(0, half))], [part(slice(half, n))]


def _comparable(out: Any) -> torch.Tensor | None:
    """One float tensor the error check compares: a tensor itself; a mapping's or ``ModelOutput``'s ``logits`` or
    ``out`` entry; else every tensor of a mapping, tuple, list or dataclass, flattened and concatenated. ``None``
    when ``out`` holds no tensor."""
    if isinstance(out, torch.Tensor):
        return out.float()
    if isinstance(out, Mapping):  # dicts and Hugging Face ModelOutputs (an OrderedDict)
        for key in ("logits", "out"):
            if isinstance(out.get(key), torch.Tensor):
                return out[key].float()
        items = list(out.values())
    elif isinstance(out, (tuple, list)):
        items = list(out)
    elif dataclasses.is_dataclass(out) and not isinstance(out, type):
        items = [getattr(out, f.name) for f in dataclasses.fields(out)]
    else:
        return None
    parts = [t.flatten() for t in map(_comparable, items) if t is not None]
    return torch.cat(parts) if parts else None


def _check_comparable(model: nn.Module, reference: nn.Module, example: tuple[Any, ...]) -> None:
    """Raise when the float model's output holds nothing the error check can compare."""
    with torch.no_grad():
        try:
            out = reference(*example)
        except Exception:  # noqa: BLE001 - a model that cannot run is reported per candidate, as before
            return
    if _comparable(out) is None:
        raise SpeedupConfigError(
            f"`model` ({type(model).__name__}) returns a {type(out).__name__} with no tensor in it, so the int8 error "
            "check has nothing to compare. Allowed values: a model whose output is a tensor, or a dict, tuple or "
            "ModelOutput of tensors (its `logits` or `out` entry is compared alone when present). HINT: wrap the "
            "model so that forward returns its logits."
        )


def _rel_error(qmodel: nn.Module, reference: nn.Module, batches: Sequence[tuple[Any, ...]]) -> tuple[float, float]:
    """(max relative error, max absolute error) of ``qmodel`` against ``reference`` over ``batches``."""
    rel = absolute = 0.0
    with torch.no_grad():
        for batch in batches:
            ref = _comparable(reference(*batch))
            out = _comparable(qmodel(*batch))
            if ref is None or out is None or out.shape != ref.shape:
                got = "nothing comparable" if out is None else f"shape {tuple(out.shape)}"
                raise ValueError(f"int8 output ({got}) does not match the float output's structure")
            diff = float((out - ref).abs().max())
            rel = max(rel, diff / max(float(ref.abs().max()), 1e-12))
            absolute = max(absolute, diff)
    return rel, absolute


def _try_candidates(
    model: nn.Module,
    reference: nn.Module,
    names: Sequence[str],
    example: tuple[Any, ...],
    calib: Sequence[tuple[Any, ...]],
    heldout: Sequence[tuple[Any, ...]],
    max_rel_error: float,
) -> tuple[dict[str, dict[str, Any]], dict[str, nn.Module]]:
    """Build every backend in ``names`` and judge it: ``(report entries, int8 models within tolerance)``."""
    candidates: dict[str, dict[str, Any]] = {}
    built: dict[str, nn.Module] = {}
    for name in names:
        try:
            qmodel = get_int8_backend(name).build(_float_copy(model), example, calib, True)
            layers = get_int8_backend(name).count(qmodel)
            if layers == 0:  # an "int8" model that computes in float must never win on timing noise
                candidates[name] = {"status": "no_layer_quantized", "quantized_layers": 0}
                continue
            calib_rel, _ = _rel_error(qmodel, reference, calib)
            held_rel, held_abs = _rel_error(qmodel, reference, heldout)
        except Exception as err:  # a path that cannot handle this model is reported, not fatal
            candidates[name] = {"status": "failed", "error": f"{type(err).__name__}: {err}"[:300]}
            continue
        ok = max(held_rel, calib_rel) <= max_rel_error  # held out: no overfit calibration; seen: no lucky split
        candidates[name] = {
            "status": "ok" if ok else "too_inaccurate",
            "heldout_rel_error": held_rel,
            "calibration_rel_error": calib_rel,
            "max_abs_diff": held_abs,
            "quantized_layers": layers,
        }
        if ok:
            built[name] = qmodel
    return candidates, built


def quantize_for_inference(
    model: nn.Module,
    example_inputs: Any,
    backend: str = "auto",
    *,
    calibration_data: Iterable[Any] | None = None,
    validation_data: Iterable[Any] | None = None,
    max_rel_error: float = 0.1,
    min_speedup: float = 1.0,
    allow_compile: bool = False,
    repeats: int = 7,
    budget_s: float = 10.0,
) -> tuple[nn.Module, QuantizationReport]:
    """Return an int8 copy of ``model`` that is faster on this machine, and a :class:`QuantizationReport`.

    ``model`` itself is not changed (fake quantization from QAT is stripped in a CPU copy). Candidates are the
    registered backends (``fx_static``, ``eager_dynamic``, ``torchao_dynamic``; ``pt2e_inductor`` with
    ``allow_compile``), see :mod:`~lightning_speedups.functional.int8_backends`. The dynamic paths quantize the
    ``nn.Linear`` layers the forward pass calls; a Linear whose weight its parent reads itself
    (``F.linear(x, self.qkv.weight)``, as in timm's EVA, BEiT and Swin v2) stays in float and is listed in the
    report's ``unsupported_layers``.

    Args:
        model: float model (``nn.Module`` or ``LightningModule``).
        example_inputs: a tensor or tuple of tensors with a realistic batch size: latency is measured on it.
        backend: ``"auto"`` (measure all, keep the fastest within tolerance) or one registered name.
        calibration_data: batches (tensors or tuples) for static calibration; default: ``example_inputs``. Without
            ``validation_data`` the last quarter of them (or half of a single batch) is held out for validation.
        validation_data: held-out batches the accuracy gate is judged on (never used for calibration).
        max_rel_error: a candidate is rejected when, on the held-out or on the calibration inputs,
            ``max|out_int8 - out_fp32| > max_rel_error * max|out_fp32|`` (a small held-out split can miss errors the
            calibration inputs show).
        min_speedup: a result must be faster than this beyond timing noise, otherwise the float model is returned
            with a warning.
        allow_compile: also try the ``torch.compile`` based PT2E path.
        repeats: minimum interleaved timing rounds.
        budget_s: time budget of the timing comparison.

    Returns:
        ``(model, report)``; ``report.backend == "none"`` and the float copy when nothing qualified.

    Raises:
        SpeedupConfigError: unknown ``backend``, out-of-range tolerances, or calibration inputs too small to split.

    Example::

        >>> net = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
        >>> qnet, report = quantize_for_inference(net, torch.randn(64, 256), repeats=2, budget_s=1.0)
        >>> report.size_ratio > 1 or report.backend == "none"
        True
    """
    check_choice("backend", backend, ("auto", *list_int8_backends()), hint="use 'auto' to measure every path")
    check_range("max_rel_error", max_rel_error, 0.0, None, low_inclusive=False)
    check_range("min_speedup", min_speedup, 0.0, None)
    check_range("repeats", repeats, 1, None)
    check_range("budget_s", budget_s, 0.0, None, low_inclusive=False, hint="seconds for the timing comparison")
    example = _as_tuple(example_inputs)
    calibration = None if calibration_data is None else [_as_tuple(b) for b in calibration_data]
    if validation_data is not None:
        calib = calibration or [example]
        heldout = [_as_tuple(b) for b in validation_data]
    else:
        calib, heldout = split_calibration(example, calibration)
    reference = _float_copy(model)
    _check_comparable(model, reference, example)
    names = list_int8_backends() if backend == "auto" else [backend]
    names = [n for n in names if backend != "auto" or allow_compile or not get_int8_backend(n).needs_compile]
    candidates, built = _try_candidates(model, reference, names, example, calib, heldout, max_rel_error)
    size_before = model_size_bytes(reference)
    if not built:
        return _float_result(reference, size_before, candidates, _why_none(model, reference, candidates))
    decision = _race(reference, built, candidates, example, min_speedup=min_speedup, budget_s=budget_s, repeats=repeats)
    evidence = {
        "trials": decision.trials,
        "separated": decision.separated,
        "note": decision.note,
        "medians_s": decision.medians,
        "spread_s": decision.spread,
    }
    if decision.winner == "fp32":
        why = decision.note or "no candidate faster than the float model beyond noise"
        return _float_result(reference, size_before, candidates, why, decision.medians["fp32"], evidence)
    best = decision.winner
    qmodel = built[best]
    return qmodel, QuantizationReport(
        backend=best,
        size_before_bytes=size_before,
        size_after_bytes=model_size_bytes(qmodel) if get_int8_backend(best).saveable else size_before,
        latency_before_s=decision.medians["fp32"],
        latency_after_s=decision.medians[best],
        max_abs_diff=candidates[best]["max_abs_diff"],
        unsupported_layers=_float_layers(qmodel),
        candidates=candidates,
        recipe=_recipe(best, example),
        heldout_rel_error=candidates[best]["heldout_rel_error"],
        calibration_rel_error=candidates[best]["calibration_rel_error"],
        decision=evidence,
        quantized_layers=candidates[best]["quantized_layers"],
    )


def _race(
    reference: nn.Module,
    built: dict[str, nn.Module],
    candidates: dict[str, dict[str, Any]],
    example: tuple[Any, ...],
    *,
    min_speedup: float,
    budget_s: float,
    repeats: int,
) -> Comparison:
    """Time the built int8 models against the float ``reference`` on ``example``, interleaved, and write each one's
    latency and speedup into its ``candidates`` record."""

    def runner(m: nn.Module) -> Callable[[], Any]:
        def fn() -> Any:
            with torch.no_grad():
                return m(*example)

        return fn

    # most accurate first: among candidates within noise of the fastest, the smaller error (the worse of the two) wins
    worst = {n: max(candidates[n]["heldout_rel_error"], candidates[n]["calibration_rel_error"]) for n in built}
    prefer = sorted(built, key=worst.__getitem__)
    decision = compare(
        {"fp32": runner(reference), **{n: runner(m) for n, m in built.items()}},
        "fp32",
        min_gain=min_speedup - 1.0,
        budget_s=budget_s,
        min_rounds=max(2, repeats),
        warmup=2,
        prefer=prefer,
    )
    for name in built:
        lo, mid, hi = decision.ratios[name]
        candidates[name].update(latency_s=decision.medians[name], speedup=mid, speedup_interval=(lo, hi))
    return decision


def _why_none(model: nn.Module, reference: nn.Module, candidates: dict[str, dict[str, Any]]) -> str:
    """Why no candidate was built: nothing quantizable, or nothing accurate enough."""
    if any(c["status"] == "too_inaccurate" for c in candidates.values()):
        return "no candidate within tolerance on the held-out and calibration inputs"
    if any(c["status"] == "no_layer_quantized" for c in candidates.values()):
        layers = _float_layers(reference)
        shown = ", ".join(layers[:6]) + (", ..." if len(layers) > 6 else "")
        return (
            f"no layer of {type(model).__name__} could be quantized: every backend that ran left all its layers in "
            f"float ({len(layers)} conv/linear layers: {shown or 'none'})"
        )
    return "every candidate failed"


def _float_result(
    reference: nn.Module,
    size: int,
    candidates: dict[str, dict[str, Any]],
    why: str,
    latency: float = 0.0,
    evidence: dict[str, Any] | None = None,
) -> tuple[nn.Module, QuantizationReport]:
    warnings.warn(f"quantize_for_inference: returning the float model ({why}; tried {candidates}).", stacklevel=3)
    report = QuantizationReport(
        "none", size, size, latency, latency, 0.0, _float_layers(reference), candidates, decision=evidence or {}
    )
    return reference, report


def save_quantized(model: nn.Module, report: QuantizationReport, path: str | os.PathLike[str]) -> None:
    """Save an int8 model from :func:`quantize_for_inference` as ``{"recipe", "state_dict"}``.

    Rebuild it with :func:`load_quantized` from a freshly built float model of the same architecture.

    Raises:
        SpeedupConfigError: when the backend cannot be saved this way (``"pt2e_inductor"``, ``"none"``).
    """
    saveable = [n for n in list_int8_backends() if get_int8_backend(n).saveable]
    if report.backend not in saveable:
        raise SpeedupConfigError(
            f"`report.backend`={report.backend!r} cannot be saved as state dict + recipe. Allowed values: "
            f"{', '.join(repr(n) for n in saveable)}. HINT: save a compiled PT2E model with torch.export."
        )
    torch.save({"recipe": report.recipe, "state_dict": model.state_dict()}, path)


def load_quantized(path: str | os.PathLike[str], float_model: nn.Module, example_inputs: Any) -> nn.Module:
    """Rebuild an int8 model saved by :func:`save_quantized` on a fresh float model (same architecture).

    The recipe replays the conversion without calibration, then the saved scales and int8 weights are loaded.
    """
    saved = torch.load(path, map_location="cpu", weights_only=True)  # tensors and a plain-data recipe
    recipe = saved["recipe"]
    if recipe.get("engine") in torch.backends.quantized.supported_engines:
        torch.backends.quantized.engine = recipe["engine"]
    example = _as_tuple(example_inputs)
    info = get_int8_backend(recipe["backend"])
    qmodel = info.build(_float_copy(float_model), example, [], False)
    with quiet_ao():
        qmodel.load_state_dict(saved["state_dict"], assign=info.load_assign)
    return qmodel.eval()
