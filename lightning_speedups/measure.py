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

import contextlib
import copy
import math
import os
import platform
import random
import statistics
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

__all__ = [
    "Comparison",
    "compare",
    "median_interval",
    "cpu_model",
    "interleaved_ratio",
    "interleaved_timings",
    "machine_info",
    "make_train_step",
    "median",
    "model_copy",
    "speed_ratio",
    "torch_threads",
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
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, list[float]]:
    """Time each callable ``repeats`` times, interleaved A B C A B C ..., after ``warmup`` untimed rounds.

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
            if sync:
                torch.cuda.synchronize()
            t0 = clock()
            fn()
            if sync:
                torch.cuda.synchronize()
            times[name].append(clock() - t0)
        if budget_s is not None and done >= min(2, repeats) and clock() - start > budget_s:
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


# ------------------------------------------------------------------------------------------------ decisions
def median_interval(values: Sequence[float], confidence: float = 0.95) -> tuple[float, float]:
    """A distribution-free confidence interval for the median (binomial order statistics).

    With ``n`` samples the interval ``[x_(k), x_(n-k+1)]`` covers the true median with probability at least
    ``confidence``; ``k`` comes from the Binomial(n, 1/2) tail. Too few samples give the full range ``[min, max]``.

    Example::

        >>> median_interval([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0])
        (2.0, 9.0)
    """
    xs = sorted(values)
    n = len(xs)
    if n == 0:
        return (math.nan, math.nan)
    alpha, k, tail = (1.0 - confidence) / 2.0, 0, 0.0
    while k < n // 2:  # largest k with P(Binomial(n, 1/2) <= k - 1) <= alpha
        p = math.comb(n, k) / 2.0**n
        if tail + p > alpha:
            break
        tail += p
        k += 1
    k = max(k, 1)
    return (xs[k - 1], xs[n - k])


@dataclass
class Comparison:
    """The evidence behind a decision by measurement: what won, by how much, and how sure.

    ``ratios[name]`` is ``(low, median, high)`` of the per-round speed ratio baseline_time / candidate_time (> 1 =
    candidate faster), with a ``confidence`` interval; ``separated`` says whether the decision was settled: every
    candidate's interval clears ``1 + min_gain``, is below it, or lies wholly below the best candidate that clears.
    ``trusted`` is ``False`` when fewer than ``min_rounds`` rounds fit in the budget (the baseline was kept, with a
    warning).
    """

    winner: str
    baseline: str
    medians: dict[str, float]
    spread: dict[str, tuple[float, float]]  # min, max seconds per call
    ratios: dict[str, tuple[float, float, float]]
    trials: int
    separated: bool
    elapsed_s: float
    note: str = ""
    times: dict[str, list[float]] = field(default_factory=dict, repr=False)
    confidence: float = 0.95  # level of the ``ratios`` intervals
    trusted: bool = True

    @property
    def gain(self) -> float:
        """The winner's median speed ratio over the baseline (1.0 when the baseline won)."""
        return 1.0 if self.winner == self.baseline else self.ratios[self.winner][1]


def compare(
    candidates: Mapping[str, Callable[[], Any]],
    baseline: str,
    *,
    min_gain: float = 0.0,
    budget_s: float = 5.0,
    min_rounds: int = 5,
    max_rounds: int = 200,
    warmup: int = 1,
    confidence: float = 0.95,
    prefer: Sequence[str] | None = None,
    clock: Callable[[], float] = time.perf_counter,
    seed: int = 0,
    returns_time: bool = False,
    initial: Mapping[str, Sequence[float]] | None = None,
) -> Comparison:
    """Choose among timed callables so that the choice holds under noise.

    Rounds run every candidate once, in a shuffled order (no position bias), after ``warmup`` untimed rounds. From
    ``min_rounds`` on, each candidate's per-round speed ratio against ``baseline`` gets a confidence interval for its
    median (:func:`median_interval`); rounds continue until every interval clears or misses ``1 + min_gain`` (or lies
    wholly below the best candidate that clears, which no further round can change), the ``budget_s`` runs out, or
    ``max_rounds`` is reached. The winner is the fastest candidate whose interval clears
    ``1 + min_gain``; candidates within noise of it are resolved by ``prefer`` (cheaper or more conservative first).
    When no candidate clears, the baseline wins: the conservative choice, with a note saying the difference was
    within noise when it was not clearly slower.

    Args:
        candidates: ``{name: callable}``, the baseline among them.
        baseline: the name to beat (the current plan, or the unchanged model).
        min_gain: the margin a candidate must clear (0.05 = at least 5% faster).
        budget_s: wall time for the whole comparison (warm-up included), measured with ``clock``.
        clock: seconds as a float; injectable so tests can feed noise models.
        returns_time: each candidate call returns its own measured cost (seconds, or seconds per sample), used
            instead of ``clock`` around the call; the ``clock`` then only keeps the budget. For work whose set-up
            must not count, e.g. a training trial at one batch size that reports its per-sample step time.
        initial: rounds already measured (``{name: [time per round, ...]}``, the same count for every candidate),
            continued rather than repeated; they count toward ``min_rounds`` and ``max_rounds``.

    Raises:
        SpeedupConfigError: a ``budget_s`` <= 0, an unknown ``baseline``, fewer than two candidates.
    """
    from lightning_speedups._errors import SpeedupConfigError, check_choice, check_range

    check_range("budget_s", budget_s, 0.0, None, low_inclusive=False, hint="seconds, e.g. 5.0")
    check_choice("baseline", baseline, list(candidates))
    check_range("min_rounds", min_rounds, 2, None)
    if len(candidates) < 2:
        raise SpeedupConfigError(f"`candidates`={list(candidates)!r} needs at least two entries to compare.")
    rng, names = random.Random(seed), list(candidates)
    start = clock()
    for _ in range(warmup):
        for fn in candidates.values():
            fn()
    times: dict[str, list[float]] = {n: [float(x) for x in (initial or {}).get(n, ())] for n in names}
    if len({len(t) for t in times.values()}) > 1:
        raise SpeedupConfigError(f"`initial` has {[len(t) for t in times.values()]} rounds per candidate; "
                                 "Allowed values: the same number of rounds for every candidate.")
    ratios: dict[str, tuple[float, float, float]] = {}
    rounds, threshold = len(times[names[0]]), 1.0 + min_gain
    next_look = max(min_rounds, rounds + 1)
    # looks at geometrically spaced rounds, each at a stricter level: peeking after every round would let noise
    # "separate" equal candidates far more often than 1 - confidence
    look_confidence = 1.0 - (1.0 - confidence) / 4.0
    if rounds >= min_rounds:  # the initial rounds may decide already
        ratios = _ratio_intervals(times, baseline, look_confidence)
    decided = rounds >= min_rounds and _separated(ratios, baseline, threshold)
    while rounds < max_rounds and not decided:
        order = names[:]
        rng.shuffle(order)
        for name in order:
            t0 = clock()
            out = candidates[name]()
            times[name].append(float(out) if returns_time else clock() - t0)
        rounds += 1
        out_of_time = clock() - start > budget_s
        if rounds < next_look and not out_of_time:
            continue
        next_look = max(rounds + 1, math.ceil(rounds * 1.5))
        ratios = _ratio_intervals(times, baseline, look_confidence)
        decided = rounds >= min_rounds and _separated(ratios, baseline, threshold)
        if decided or out_of_time:
            break
    ratios = ratios or _ratio_intervals(times, baseline, look_confidence)
    winners = [n for n, (lo, _m, _hi) in ratios.items() if n != baseline and lo > threshold]
    note, winner = "", baseline
    if rounds < min_rounds:  # every round hit the budget: too few to trust, keep the conservative choice
        winners = []
        note = f"only {rounds} of {min_rounds} rounds fit in `budget_s`={budget_s:.3g}; kept {baseline!r} untested"
        warnings.warn(f"compare: timing cannot be trusted ({note}).", stacklevel=2)
    if winners:
        best = max(winners, key=lambda n: ratios[n][1])
        tied = [n for n in winners if ratios[n][2] >= ratios[best][0]]
        order = list(prefer or []) + [n for n in names if n not in (prefer or [])]
        winner = min(tied, key=order.index)
        if len(tied) > 1:
            note = f"{', '.join(sorted(tied))} are within noise of each other; chose {winner!r} by preference"
    elif not note:
        unclear = [n for n, (_lo, _m, hi) in ratios.items() if n != baseline and hi >= threshold]
        if unclear:
            note = f"{', '.join(unclear)} within noise of {baseline!r} (min gain {min_gain:.0%}); kept {baseline!r}"
    return Comparison(
        winner=winner,
        baseline=baseline,
        medians={n: median(t) for n, t in times.items()},
        spread={n: (min(t), max(t)) for n, t in times.items()},
        ratios={n: r for n, r in ratios.items() if n != baseline},
        trials=rounds,
        separated=decided,
        elapsed_s=clock() - start,
        note=note,
        times=times,
        confidence=look_confidence,
        trusted=rounds >= min_rounds,
    )


def _separated(ratios: Mapping[str, tuple[float, float, float]], baseline: str, threshold: float) -> bool:
    """Whether more rounds could still change the winner: every candidate either clears or misses ``threshold``, or
    lies wholly below the best candidate that clears (its median the highest). Such a candidate can neither become the
    best nor be tied with it, whichever side of the threshold it would settle on, so timing it further is wasted (a
    borderline channels_last beside a clearly better bf16, say)."""
    rest = {n: r for n, r in ratios.items() if n != baseline}
    clearing = [r for r in rest.values() if r[0] > threshold]
    best_lo = max(clearing, key=lambda r: r[1])[0] if clearing else -math.inf  # nothing clears: nothing dominates
    return all(lo > threshold or hi < threshold or hi < best_lo for lo, _m, hi in rest.values())


def _ratio_intervals(
    times: Mapping[str, Sequence[float]], baseline: str, confidence: float
) -> dict[str, tuple[float, float, float]]:
    base = times[baseline]
    out = {}
    for name, ts in times.items():
        per_round = [b / max(t, 1e-12) for b, t in zip(base, ts)]  # paired: both ran in the same round
        lo, hi = median_interval(per_round, confidence)
        out[name] = (lo, median(per_round), hi)
    return out

