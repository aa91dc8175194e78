"""Measuring speed, the one way the whole package does it: interleaved A/B timings, medians, ratios, model copies.

Low in the stack (torch only): the functional measurements, the callbacks, the recipes and the benchmarks all time
through here, so a fix to the timing loop (synchronisation, warm-up, a time budget) reaches every number at once.

Ratios, not absolute times: candidates run interleaved (A B A B ...) after warm-up so machine noise (other
processes, thermal state) spreads evenly over them, and :func:`speed_ratio` compares medians.

Example::

    >>> times = interleaved_timings({"a": lambda: sum(range(100)), "b": lambda: sum(range(100))}, repeats=3)
    >>> sorted(times), len(times["a"])
    (['a', 'b'], 3)
    >>> speed_ratio([2.0, 2.0, 2.0], [1.0, 1.0, 1.0])
    2.0
"""

from __future__ import annotations

import copy
import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

__all__ = [
    "cpu_model",
    "interleaved_ratio",
    "interleaved_timings",
    "machine_info",
    "make_train_step",
    "median",
    "model_copy",
    "speed_ratio",
]


def median(values: Sequence[float]) -> float:
    """The median as a float (``statistics.median``)."""
    return float(statistics.median(values))


def interleaved_timings(
    candidates: dict[str, Callable[[], Any]],
    repeats: int = 5,
    warmup: int = 1,
    *,
    sync: bool | None = None,
    budget_s: float | None = None,
) -> dict[str, list[float]]:
    """Time each callable ``repeats`` times, interleaved A B C A B C ..., after ``warmup`` untimed rounds.

    Args:
        candidates: ``{name: callable}``, timed in this order within each round.
        repeats: timed rounds.
        warmup: untimed rounds first (lazy init, allocator, caches).
        sync: ``torch.cuda.synchronize()`` around each call; ``None`` (default) does so whenever CUDA is available.
        budget_s: stop early once this many seconds (warm-up included) have been spent, after at least
            ``min(2, repeats)`` timed rounds, so a slow model or a loaded machine cannot stretch the measurement.

    Returns:
        ``{name: [seconds per call, ...]}``.
    """
    if sync is None:
        sync = torch.cuda.is_available()
    start = time.perf_counter()
    for _ in range(warmup):
        for fn in candidates.values():
            fn()
    times: dict[str, list[float]] = {name: [] for name in candidates}
    for done in range(1, repeats + 1):
        for name, fn in candidates.items():
            if sync:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            fn()
            if sync:
                torch.cuda.synchronize()
            times[name].append(time.perf_counter() - t0)
        if budget_s is not None and done >= min(2, repeats) and time.perf_counter() - start > budget_s:
            break
    return times


def speed_ratio(baseline_times: Sequence[float], candidate_times: Sequence[float]) -> float:
    """``median(baseline) / median(candidate)``: how many times faster the candidate is."""
    return median(baseline_times) / max(median(candidate_times), 1e-12)


def interleaved_ratio(
    base: Callable[[], Any],
    cand: Callable[[], Any],
    repeats: int,
    sync: bool = False,
    budget_s: float | None = 3.0,
) -> float:
    """``median(base) / median(cand)`` over interleaved runs after one warm-up each (> 1: candidate faster).

    The A/B form of :func:`interleaved_timings`, with a time budget (default 3 s) for cheap in-run measurements.
    """
    times = interleaved_timings({"base": base, "cand": cand}, repeats, warmup=1, sync=sync, budget_s=budget_s)
    return speed_ratio(times["base"], times["cand"])


def model_copy(module: nn.Module, train: bool | None = None) -> nn.Module:
    """A deep copy of ``module`` to measure on, so the real model, its grads and its optimizer stay untouched.

    Args:
        module: the model to copy.
        train: put the copy in train (``True``) or eval (``False``) mode; ``None`` keeps the original's modes.
    """
    clone = copy.deepcopy(module)
    if train is not None:
        clone.train(train)
    return clone


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else what ``platform`` knows."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info() -> dict[str, Any]:
    """CPU model, threads, torch version and device, printed above every benchmark table."""
    info: dict[str, Any] = {
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "device": "cpu",
    }
    if torch.cuda.is_available():
        info["device"] = torch.cuda.get_device_name(0)
        info["cuda_capability"] = ".".join(map(str, torch.cuda.get_device_capability(0)))
    return info


def make_train_step(
    model: torch.nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    optimizer: torch.optim.Optimizer | None = None,
    autocast_dtype: torch.dtype | None = None,
) -> Callable[[], float]:
    """A closure doing one forward/backward/optimizer step of ``model`` on ``(x, y)``; returns the loss.

    ``autocast_dtype=torch.bfloat16`` runs the forward under autocast on ``x``'s device, as ``precision="bf16-mixed"``.
    """
    optimizer = optimizer or torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    loss_fn = torch.nn.CrossEntropyLoss()
    model.train()

    def step() -> float:
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(x.device.type, dtype=autocast_dtype or torch.float32, enabled=autocast_dtype is not None):
            loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        return float(loss.detach())

    return step
