"""Ratios for reports: :func:`measured_ratio`, measured through :func:`~lightning_speedups.measure.compare`,
conservative within noise, and carrying its evidence (median ratio, interval, rounds).

The probes that decide by one A/B measurement (the CPU bf16 probe, the recipes' layout and precision check, the
advisor's expected gains) return a :class:`MeasuredRatio`: a ``float`` (so thresholds and formatting work as before)
whose value is the *conservative* end of the confidence interval of the median ratio: the lower end when the candidate
is clearly faster, the upper end when it is clearly slower, ``1.0`` when the interval holds 1 (within noise: no
evidence either way) or when too few rounds fitted. So ``ratio > t`` (``t >= 1``) means "clearly faster than
``t``", and ``ratio < t`` (``t <= 1``) means "clearly slower than ``t``": every threshold check on it is a
confidence-bound decision.

Example::

    >>> r = measured_ratio(lambda: sum(range(20_000)), lambda: sum(range(20_000)), budget_s=1.0)
    >>> isinstance(r, float) and r.trials >= 5 and 0.5 < r.median < 2.0
    True
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from lightning_speedups.measure.decide import Comparison, compare

__all__ = ["MeasuredRatio", "conservative_ratio", "describe_ratio", "measured_ratio", "ratio_evidence"]


class MeasuredRatio(float):
    """``float(conservative ratio)`` plus ``median``, ``interval`` (low, high), ``trials`` and the ``comparison``."""

    comparison: Comparison | None

    def __new__(cls, value: float, comparison: Comparison | None = None, name: str = "cand") -> MeasuredRatio:
        obj = super().__new__(cls, value)
        obj.comparison = comparison
        lo, mid, hi = comparison.ratios[name] if comparison is not None else (value, value, value)
        obj.median = float(mid)
        obj.interval = (float(lo), float(hi))
        obj.trials = comparison.trials if comparison is not None else 0
        return obj

    median: float
    interval: tuple[float, float]
    trials: int

    def __reduce__(self) -> tuple[Any, ...]:  # pickles / deep-copies as a plain float
        return (float, (float(self),))


def conservative_ratio(cmp: Comparison, name: str) -> float:
    """The end of ``name``'s ratio interval nearest 1: low if clearly faster, high if clearly slower, else 1.0."""
    lo, _mid, hi = cmp.ratios[name]
    if not cmp.trusted:
        return 1.0
    return lo if lo > 1.0 else hi if hi < 1.0 else 1.0


def measured_ratio(
    base: Callable[[], Any],
    cand: Callable[[], Any],
    *,
    min_gain: float = 0.0,
    budget_s: float = 2.0,
    min_rounds: int = 5,
    warmup: int = 1,
    clock: Callable[[], float] = time.perf_counter,
    seed: int = 0,
) -> MeasuredRatio:
    """``base`` vs ``cand`` interleaved through :func:`~lightning_speedups.measure.compare` (> 1: cand faster).

    Rounds continue until the interval clears or misses ``1 + min_gain`` (the decision's threshold) or ``budget_s``
    runs out. Returns the conservative :class:`MeasuredRatio` with its evidence; when too few rounds fit, it is 1.0
    and :func:`describe_ratio` says so (no warning: the caller's report carries it).
    """
    cmp = compare(
        {"base": base, "cand": cand},
        "base",
        min_gain=min_gain,
        budget_s=budget_s,
        min_rounds=max(2, min_rounds),
        warmup=warmup,
        clock=clock,
        seed=seed,
        warn=False,
    )
    return MeasuredRatio(conservative_ratio(cmp, "cand"), cmp)


def ratio_evidence(ratio: Any) -> dict[str, Any]:
    """The evidence of a :class:`MeasuredRatio` as plain numbers (``{}`` for a plain float, e.g. a mocked probe)."""
    if not isinstance(ratio, MeasuredRatio) or ratio.comparison is None:
        return {}
    cmp = ratio.comparison
    return {
        "median_ratio": round(ratio.median, 3),
        "interval": [round(x, 3) for x in ratio.interval],
        "confidence": round(cmp.confidence, 4),
        "rounds": ratio.trials,
        "separated": cmp.separated,
        "trusted": cmp.trusted,
    }


def describe_ratio(ratio: Any) -> str:
    """``"median 1.42x, 99% interval 1.30-1.55 over 12 rounds"`` (plus "within noise" when the interval holds 1)."""
    ev = ratio_evidence(ratio)
    if not ev:
        return ""
    lo, hi = ev["interval"]
    text = f"median {ev['median_ratio']:.2f}x, {ev['confidence']:.0%} interval {lo:.2f}-{hi:.2f}"
    text += f" over {ev['rounds']} rounds"
    if not ev["trusted"]:
        return text + "; too few rounds in the time budget to trust"
    return text + ("; within noise" if lo <= 1.0 <= hi else "")
