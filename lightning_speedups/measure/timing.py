"""The timing loop: interleaved rounds after warm-up, medians and ratios, and the torch thread count.

Example::

    >>> times = interleaved_timings({"a": lambda: sum(range(100)), "b": lambda: sum(range(100))}, repeats=3)
    >>> sorted(times), len(times["a"])
    (['a', 'b'], 3)
    >>> speed_ratio([2.0, 2.0, 2.0], [1.0, 1.0, 1.0])
    2.0
"""

from __future__ import annotations

import contextlib
import statistics
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

__all__ = ["interleaved_ratio", "interleaved_timings", "median", "speed_ratio", "time_call", "torch_threads"]


def median(values: Sequence[float]) -> float:
    """The median as a float (``statistics.median``)."""
    return float(statistics.median(values))


def speed_ratio(baseline_times: Sequence[float], candidate_times: Sequence[float]) -> float:
    """``median(baseline) / median(candidate)``: how many times faster the candidate is."""
    return median(baseline_times) / max(median(candidate_times), 1e-12)


def time_call(fn: Callable[[], Any], clock: Callable[[], float], sync: bool = False) -> tuple[float, Any]:
    """``(seconds, result)`` of one call of ``fn``; ``sync``: ``torch.cuda.synchronize()`` before and after."""
    if sync:
        torch.cuda.synchronize()
    t0 = clock()
    out = fn()
    if sync:
        torch.cuda.synchronize()
    return clock() - t0, out


def interleaved_timings(
    candidates: dict[str, Callable[[], Any]],
    repeats: int = 5,
    warmup: int = 1,
    *,
    sync: bool | None = None,
    budget_s: float | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, list[float]]:
    """Time each callable ``repeats`` times, interleaved A B C A B C ..., after ``warmup`` untimed rounds.

    The raw times, for a benchmark table. A decision between candidates goes through
    :func:`~lightning_speedups.measure.compare`, and a reported ratio through
    :func:`~lightning_speedups.measure.measured_ratio`.

    Args:
        candidates: ``{name: callable}``, timed in this order within each round.
        repeats: timed rounds.
        warmup: untimed rounds first (lazy init, allocator, caches).
        sync: ``torch.cuda.synchronize()`` around each call; ``None`` (default) does so whenever CUDA is available.
        budget_s: stop early once this many seconds (warm-up included) have been spent, after at least
            ``min(2, repeats)`` timed rounds, so a slow model or a loaded machine cannot stretch the measurement.
        clock: seconds as a float; injectable so tests can feed simulated costs.

    Returns:
        ``{name: [seconds per call, ...]}``.
    """
    if sync is None:
        sync = torch.cuda.is_available()
    start = clock()
    for _ in range(warmup):
        for fn in candidates.values():
            fn()
    times: dict[str, list[float]] = {name: [] for name in candidates}
    for done in range(1, repeats + 1):
        for name, fn in candidates.items():
            times[name].append(time_call(fn, clock, sync)[0])
        if budget_s is not None and done >= min(2, repeats) and clock() - start > budget_s:
            break
    return times


def interleaved_ratio(
    base: Callable[[], Any],
    cand: Callable[[], Any],
    repeats: int,
    sync: bool = False,
    budget_s: float | None = 3.0,
) -> float:
    """Deprecated: use :func:`~lightning_speedups.measure.measured_ratio` (a ratio with its interval and rounds).

    ``median(base) / median(cand)`` over :func:`interleaved_timings` after one warm-up each (> 1: candidate faster).
    """
    warnings.warn(
        "`interleaved_ratio` is deprecated; use `lightning_speedups.measure.measured_ratio`.",
        DeprecationWarning,
        stacklevel=2,
    )
    times = interleaved_timings({"base": base, "cand": cand}, repeats, warmup=1, sync=sync, budget_s=budget_s)
    return speed_ratio(times["base"], times["cand"])


@contextlib.contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    """Run the body on ``n`` torch CPU threads (``None``: unchanged), then restore the previous count."""
    before = torch.get_num_threads()
    if n is not None:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)
