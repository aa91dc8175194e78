"""Speed advisor, pure part: turn measured training-step numbers into a ranked list of findings with fixes.

Nothing here touches a Trainer: :func:`diagnose` reads a :class:`Measurements` record (filled by the
``SpeedAdvisor`` callback, or by hand / with mocked timings in tests), runs the ordered rules of
``_advisor_rules.py`` (one small function per finding) and returns :class:`Finding` objects ranked by ``score`` = the
estimated share of step time the fix would save (Amdahl-style, 0..1). The records live in ``_advisor_records.py``,
the report rendering in ``_advisor_report.py``; all are re-exported here. The cheap micro-measurements the callback
uses to put numbers on "expected effect" (bf16 vs fp32, channels_last, fused optimizer step) live here too and work on
plain modules and tensors, timed interleaved through :func:`lightning_speedups.measure.compare` until the interval
clears the finding's threshold or a budget runs out; they return a
:class:`~lightning_speedups._measure_ratio.MeasuredRatio` (conservative within noise, with its evidence).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from lightning_speedups._measure_ratio import MeasuredRatio, measured_ratio
from lightning_speedups.functional import (  # importing them registers their rules, after _advisor_rules'
    _advisor_rules_sequences,  # noqa: F401  (padding)
    _advisor_rules_threads,  # noqa: F401  (CPU threads)
)
from lightning_speedups.functional._advisor_records import (
    SEVERITIES,
    AdvisorThresholds,
    Finding,
    Measurements,
    OptimizerInfo,
)
from lightning_speedups.functional._advisor_report import AdvisorReport
from lightning_speedups.functional._advisor_rules import RULES, Rule, advisor_rule
from lightning_speedups.measure import model_copy, torch_threads

__all__ = [
    "AdvisorReport",
    "AdvisorThresholds",
    "Finding",
    "Measurements",
    "OptimizerInfo",
    "RULES",
    "Rule",
    "advisor_rule",
    "bf16_autocast_speedup",
    "channels_last_speedup",
    "diagnose",
    "fewer_threads_speedup",
    "fused_optimizer_speedup",
]


def diagnose(m: Measurements, thresholds: AdvisorThresholds | None = None) -> list[Finding]:
    """Rank what slows this training run down, from measurements alone.

    Args:
        m: the window's measurements.
        thresholds: when a number becomes a finding (defaults: :class:`AdvisorThresholds`).

    Returns:
        Findings sorted by ``score`` (highest first).

    Example::

        >>> m = Measurements(batch_size=32, compute_times=[0.01] * 5, data_waits=[0.03] * 5,
        ...                  loader_kind="DataLoader", num_workers=0)
        >>> [f.key for f in diagnose(m)][:1]
        ['data_bound']
    """
    th = thresholds or AdvisorThresholds()
    out: list[Finding] = []
    for rule in RULES:
        found = rule(m, th)
        if found is not None:
            out.extend(found if isinstance(found, list) else [found])
    out.sort(key=lambda f: (-f.score, SEVERITIES.index(f.severity)))
    return out


# ---- cheap micro-measurements ------------------------------------------------------------------------------------
_Candidate = Callable[[nn.Module, torch.Tensor], tuple[nn.Module, torch.Tensor, Any]]


def _copy_ratio(module: nn.Module, example: torch.Tensor, candidate: _Candidate, repeats: int, min_gain: float,
                budget_s: float, backward_in_context: bool = False) -> MeasuredRatio | None:
    """Forward+backward time of a copy of ``module`` / of a candidate copy (> 1: candidate faster); None on failure.

    The candidate's context covers its forward (autocast), or forward and backward with ``backward_in_context``
    (a setting the whole step must run under, such as the thread count)."""
    try:
        base = model_copy(module, train=True)
        cand, xc, ctx = candidate(model_copy(module, train=True), example.detach())
    except Exception:  # noqa: BLE001 - measurement is best effort
        return None
    x = example.detach()

    def run(model: nn.Module, inp: torch.Tensor, context: Any) -> Callable[[], None]:
        forward_context, step_context = (contextlib.nullcontext, context) if backward_in_context else (
            context, contextlib.nullcontext)

        def f() -> None:
            with step_context():
                with forward_context():
                    out = model(inp)
                out = out[0] if isinstance(out, (tuple, list)) else out
                out.float().sum().backward()
                model.zero_grad(set_to_none=True)

        return f

    try:
        return measured_ratio(_synced(run(base, x, contextlib.nullcontext), x.is_cuda), _synced(run(cand, xc, ctx),
                              x.is_cuda), min_gain=min_gain, budget_s=budget_s, min_rounds=repeats)
    except Exception:  # noqa: BLE001
        return None


def _synced(fn: Callable[[], Any], cuda: bool) -> Callable[[], Any]:
    """``fn`` followed by ``torch.cuda.synchronize()`` on CUDA, so its time covers the kernels it launched."""
    if not cuda:
        return fn

    def f() -> Any:
        out = fn()
        torch.cuda.synchronize()
        return out

    return f


def channels_last_speedup(
    module: nn.Module, example: torch.Tensor, repeats: int = 3, budget_s: float = 2.0
) -> MeasuredRatio | None:
    """Forward+backward time NCHW / channels_last on deep copies of ``module`` (> 1: channels_last faster).

    The copies keep the real model, its grads and its optimizer untouched. At least ``repeats`` interleaved rounds,
    more until the interval clears the advisor's 2% threshold or ``budget_s`` runs out; the value is conservative
    (1.0 within noise). Returns ``None`` for non-image inputs or when the copy or the forward fails (e.g. a model that
    cannot be deep-copied).
    """
    if example.dim() != 4:
        return None

    def cand(model: nn.Module, x: torch.Tensor) -> tuple[nn.Module, torch.Tensor, Any]:
        return model.to(memory_format=torch.channels_last), x.contiguous(memory_format=torch.channels_last), (
            contextlib.nullcontext
        )

    return _copy_ratio(module, example, cand, repeats, min_gain=0.02, budget_s=budget_s)


def bf16_autocast_speedup(
    module: nn.Module, example: torch.Tensor, repeats: int = 3, budget_s: float = 2.0, min_gain: float = 0.3
) -> MeasuredRatio | None:
    """Forward+backward time fp32 / bf16 autocast on deep copies of ``module`` with this batch (> 1: bf16 faster).

    Measures the user's own model: on a Xeon with AMX a bf16 matmul is ~20x faster than fp32 while a small conv net's
    step under bf16 autocast can be slower, and CPUs without bf16 units emulate it (~10x slower). Interleaved rounds
    until the interval clears ``1 + min_gain`` (the 30% the advisor and ``trainer_settings`` ask of bf16) or
    ``budget_s`` runs out; the value is conservative (1.0 within noise, fp32 stays).
    """
    if not example.is_floating_point():
        return None
    device_type = example.device.type

    def cand(model: nn.Module, x: torch.Tensor) -> tuple[nn.Module, torch.Tensor, Any]:
        return model, x, functools.partial(torch.autocast, device_type, dtype=torch.bfloat16)

    return _copy_ratio(module, example, cand, repeats, min_gain=min_gain, budget_s=budget_s)


def fused_optimizer_speedup(
    optimizer: torch.optim.Optimizer, repeats: int = 5, budget_s: float = 2.0
) -> MeasuredRatio | None:
    """Step time of ``optimizer``'s settings / the same with ``fused=True``, on cloned parameters with random grads.

    Only parameters that currently have a grad are cloned; interleaved rounds until the interval clears the advisor's
    5% threshold or ``budget_s`` runs out (conservative value: 1.0 within noise). Returns ``None`` when the class has no
    fused kernel for these tensors (construction or step raises).
    """
    params = [p for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
    if not params or "fused" not in optimizer.defaults:
        return None
    defaults = {k: v for k, v in optimizer.defaults.items() if k not in ("fused", "foreach", "differentiable")}

    def make(**flags: Any) -> torch.optim.Optimizer:
        clones = [p.detach().clone().requires_grad_(True) for p in params]
        for c, p in zip(clones, params):
            c.grad = torch.randn_like(p)
        return type(optimizer)(clones, **defaults, **flags)

    try:
        plain = make(**{k: optimizer.defaults[k] for k in ("foreach",) if k in optimizer.defaults})
        fused = make(fused=True)
        cuda = params[0].is_cuda
        return measured_ratio(_synced(plain.step, cuda), _synced(fused.step, cuda), min_gain=0.05, budget_s=budget_s,
                              min_rounds=repeats)
    except Exception:  # noqa: BLE001 - no fused kernel for this class/device/dtype
        return None


def fewer_threads_speedup(
    module: nn.Module, example: torch.Tensor, threads: int | None = None, repeats: int = 3, budget_s: float = 2.0,
    min_gain: float = 0.1,
) -> MeasuredRatio | None:
    """Forward+backward time at torch's current CPU threads / at ``threads`` (default half, at least 1), on a copy.

    On a quiet machine more threads are faster; when another process competes for the same cores (a second job, a
    data-loading pool, a notebook kernel), torch's threads wait for each other at every parallel region and fewer
    threads can be several times faster (measured: a small CNN's step 181 ms with 2 threads, 73 ms with 1, beside one
    busy process on 2 cores). Interleaved rounds until the interval clears ``1 + min_gain``; the value is
    conservative (1.0 within noise). The thread count is restored after every round. Returns ``None`` on GPU inputs,
    with fewer than 2 threads, or when the copy or the forward fails.
    """
    current = torch.get_num_threads()
    fewer = max(1, current // 2) if threads is None else int(threads)
    if example.device.type != "cpu" or current < 2 or not 1 <= fewer < current:
        return None

    def cand(model: nn.Module, x: torch.Tensor) -> tuple[nn.Module, torch.Tensor, Any]:
        return model, x, functools.partial(torch_threads, fewer)

    return _copy_ratio(module, example, cand, repeats, min_gain=min_gain, budget_s=budget_s, backward_in_context=True)
