"""The advisor's probes: cheap micro-measurements that put a number on a finding's expected effect.

Each probe times a candidate against the current setting on copies (of the module, or of the optimizer's parameters),
so the real model, its grads and its optimizer stay untouched: bf16 autocast vs fp32, channels_last vs NCHW, a fused
optimizer step, fewer CPU threads. They work on plain modules and tensors, are timed interleaved through
:func:`lightning_speedups.measure.measured_ratio` until the interval clears the finding's threshold or a budget
runs out, and return a :class:`~lightning_speedups.measure.MeasuredRatio` (conservative within noise, with its
evidence), or ``None`` when the probe does not apply or fails. :func:`compile_speedup` also times the compile itself
and returns a :class:`CompileProbe` (with the reason when it could not measure).
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from lightning_speedups.functional.channels_last import apply_channels_last
from lightning_speedups.functional.compile import compile_model, compiled_modules
from lightning_speedups.measure import MeasuredRatio, make_train_step, measured_ratio, model_copy, torch_threads

__all__ = [
    "CompileProbe",
    "bf16_autocast_speedup",
    "channels_last_speedup",
    "compile_speedup",
    "fewer_threads_speedup",
    "fused_optimizer_speedup",
]

_Context = Callable[[], AbstractContextManager[Any]]  # a fresh context per round (autocast, thread count)
_Candidate = Callable[[nn.Module, torch.Tensor], tuple[nn.Module, torch.Tensor, _Context]]


def _copy_ratio(
    module: nn.Module,
    example: torch.Tensor,
    candidate: _Candidate,
    repeats: int,
    min_gain: float,
    budget_s: float,
    backward_in_context: bool = False,
) -> MeasuredRatio | None:
    """Forward+backward time of a copy of ``module`` / of a candidate copy (> 1: candidate faster); None on failure.

    The candidate's context covers its forward (autocast), or forward and backward with ``backward_in_context``
    (a setting the whole step must run under, such as the thread count)."""
    try:
        base = model_copy(module, train=True)
        cand, xc, ctx = candidate(model_copy(module, train=True), example.detach())
    except Exception:  # noqa: BLE001 - measurement is best effort
        return None
    x = example.detach()

    def run(model: nn.Module, inp: torch.Tensor, context: _Context) -> Callable[[], None]:
        forward_context, step_context = (
            (contextlib.nullcontext, context) if backward_in_context else (context, contextlib.nullcontext)
        )

        def f() -> None:
            with step_context():
                with forward_context():
                    out = model(inp)
                out = out[0] if isinstance(out, (tuple, list)) else out
                out.float().sum().backward()
                model.zero_grad(set_to_none=True)

        return f

    try:
        return measured_ratio(
            _synced(run(base, x, contextlib.nullcontext), x.is_cuda),
            _synced(run(cand, xc, ctx), x.is_cuda),
            min_gain=min_gain,
            budget_s=budget_s,
            min_rounds=repeats,
        )
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

    def cand(model: nn.Module, x: torch.Tensor) -> tuple[nn.Module, torch.Tensor, _Context]:
        return (
            _to_channels_last(model),
            x.contiguous(memory_format=torch.channels_last),
            (contextlib.nullcontext),
        )

    return _copy_ratio(module, example, cand, repeats, min_gain=0.02, budget_s=budget_s)


def _to_channels_last(model: nn.Module) -> nn.Module:
    """``model`` with its 4-D tensors in channels_last, in place (``Module.to`` raises on a Conv3d's 5-D weight)."""
    apply_channels_last(model, warn=False)
    return model


def bf16_autocast_speedup(
    module: nn.Module, example: torch.Tensor, repeats: int = 3, budget_s: float = 2.0, min_gain: float = 0.3
) -> MeasuredRatio | None:
    """Forward+backward time fp32 / bf16 autocast on deep copies of ``module`` with this batch (> 1: bf16 faster).

    Measures the user's own model, because the answer depends on the CPU and the model: CPUs with bf16 matrix units
    run bf16 matmuls much faster than fp32, a small conv net's step under bf16 autocast can still be slower, and CPUs
    without bf16 units emulate it, slower (``docs/evidence.md``, section "Trainer settings", "bf16 on a CPU").
    Interleaved rounds until the interval clears ``1 + min_gain`` (the 30% the advisor and ``trainer_settings`` ask of
    bf16) or ``budget_s`` runs out; the value is conservative (1.0 within noise, fp32 stays).
    """
    if not example.is_floating_point():
        return None
    device_type = example.device.type

    def cand(model: nn.Module, x: torch.Tensor) -> tuple[nn.Module, torch.Tensor, _Context]:
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
        return measured_ratio(
            _synced(plain.step, cuda), _synced(fused.step, cuda), min_gain=0.05, budget_s=budget_s, min_rounds=repeats
        )
    except Exception:  # noqa: BLE001 - no fused kernel for this class/device/dtype
        return None


def fewer_threads_speedup(
    module: nn.Module,
    example: torch.Tensor,
    threads: int | None = None,
    repeats: int = 3,
    budget_s: float = 2.0,
    min_gain: float = 0.1,
) -> MeasuredRatio | None:
    """Forward+backward time at torch's current CPU threads / at ``threads`` (default half, at least 1), on a copy.

    On a quiet machine more threads are faster; when another process competes for the same cores (a second job, a
    data-loading pool, a notebook kernel), torch's threads wait for each other at every parallel region and fewer
    threads can be several times faster (``docs/evidence.md``, section "Advisor", "`cpu_threads`"). Interleaved
    rounds until the interval clears ``1 + min_gain``; the value is conservative (1.0 within noise). The thread count
    is restored after every round. Returns ``None`` on GPU inputs, with fewer than 2 threads, or when the copy or the
    forward fails.
    """
    current = torch.get_num_threads()
    fewer = max(1, current // 2) if threads is None else int(threads)
    if example.device.type != "cpu" or current < 2 or not 1 <= fewer < current:
        return None

    def cand(model: nn.Module, x: torch.Tensor) -> tuple[nn.Module, torch.Tensor, _Context]:
        return model, x, functools.partial(torch_threads, fewer)

    return _copy_ratio(module, example, cand, repeats, min_gain=min_gain, budget_s=budget_s, backward_in_context=True)


@dataclass
class CompileProbe:
    """What :func:`compile_speedup` measured: the compile's seconds and the eager / compiled step-time ratio.

    ``compile_s`` and ``speedup`` are ``None`` when the probe could not measure; ``error`` then says why.
    ``eager_step_s`` is the median eager step of the copy (seconds), what the ratio saves a share of.
    """

    compile_s: float | None = None
    speedup: float | None = None
    eager_step_s: float | None = None
    error: str = ""


def _sum_loss(model: nn.Module, x: Any) -> torch.Tensor:
    out = model(x)
    out = out[0] if isinstance(out, (tuple, list)) else out
    return out.float().sum()


def compile_speedup(
    module: nn.Module,
    batch: Any,
    loss: Callable[[nn.Module, Any], torch.Tensor] | None = None,
    attrs: str | Sequence[str] | None = None,
    autocast_dtype: torch.dtype | None = None,
    repeats: int = 3,
    budget_s: float = 2.0,
) -> CompileProbe:
    """Compile time and eager / compiled training-step time of copies of ``module`` (ratio > 1: compiled faster).

    One copy stays eager, the other is compiled in place (``attrs`` as in
    :func:`~lightning_speedups.functional.compile.compile_model`, default inductor). The compile is timed once, as
    the first compiled step (forward and backward graphs); then both steps run interleaved for at least ``repeats``
    rounds, more until the ratio's interval clears 1 or ``budget_s`` runs out (stretched to fit ``repeats`` rounds
    of a slow step), so the probe costs one compile plus a few steps. Each step is
    :func:`~lightning_speedups.measure.make_train_step` with ``loss(model, batch)`` (default: the sum of
    ``model(batch)``) and SGD, under autocast to ``autocast_dtype`` when given. The real model, its grads and its
    optimizer stay untouched. Never raises: a failing copy, compile or step, or too few rounds to trust, returns a
    :class:`CompileProbe` whose ``error`` says what happened.

    Example::

        >>> probe = compile_speedup(nn.Linear(4, 4), torch.randn(8, 4))  # doctest: +SKIP
        >>> probe.compile_s > 0 and probe.speedup > 0  # doctest: +SKIP
        True
    """
    try:
        eager_model = model_copy(module, train=True)
        compiled_model = model_copy(module, train=True)
        compile_model(compiled_model, attrs=attrs)
        steps = [
            make_train_step(m, batch, loss=loss or _sum_loss, autocast_dtype=autocast_dtype, return_loss=False)
            for m in (eager_model, compiled_model)
        ]
        t0 = time.perf_counter()
        steps[0]()  # the eager copy's first-call costs (lazy init, allocator) stay out of the comparison
        t1 = time.perf_counter()
        steps[1]()  # the compile happens here: forward graph, then the backward graph inside backward()
        compile_s = time.perf_counter() - t1
        if not any(getattr(c, "calls", 1) for c in compiled_modules(compiled_model).values()):
            return CompileProbe(error="the step never called the compiled module(s): nothing was compiled")
        # room for the warm-up and `repeats` rounds of both steps, however slow a step is
        budget = max(budget_s, 2.5 * (repeats + 1) * (t1 - t0))
        ratio = measured_ratio(steps[0], steps[1], budget_s=budget, min_rounds=repeats)
    except Exception as err:  # noqa: BLE001 - a failing compile must never break the user's fit
        first = str(err).strip().splitlines()[0][:200] if str(err).strip() else ""
        return CompileProbe(error=f"{type(err).__name__}: {first}" if first else type(err).__name__)
    cmp = ratio.comparison
    if cmp is None or not cmp.trusted:
        return CompileProbe(compile_s, error=f"compiled in {compile_s:.1f} s, but too few steps fit in the time budget")
    return CompileProbe(compile_s, ratio, cmp.medians["base"])
