"""Decisions by measurement: :func:`compare` times candidates in shuffled rounds until the choice holds under noise.

Example::

    >>> result = compare({"a": lambda: sum(range(2_000)), "b": lambda: sum(range(2_000))}, "a", budget_s=1.0)
    >>> result.baseline, result.trials >= 5
    ('a', True)
"""

from __future__ import annotations

import math
import random
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from lightning_speedups.measure.timing import median

__all__ = ["Comparison", "Settled", "compare", "look_rounds", "median_interval", "settle"]


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
    alpha = (1.0 - confidence) / 2.0
    k = 0
    tail = 0.0
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
    warn: bool = True,
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
        warn: warn when fewer than ``min_rounds`` rounds fit in ``budget_s``. Callers that report the result's
            ``note`` and ``trusted`` in their own words pass ``False``.

    Raises:
        SpeedupConfigError: a ``budget_s`` <= 0, an unknown ``baseline``, fewer than two candidates.
    """
    times = _checked_start(candidates, baseline, budget_s, min_rounds, initial)
    start = clock()
    for _ in range(warmup):
        for fn in candidates.values():
            fn()
    threshold = 1.0 + min_gain
    # looks at geometrically spaced rounds, each at a stricter level: peeking after every round would let noise
    # "separate" equal candidates far more often than 1 - confidence
    level = _look_level(confidence)
    rounds = _Rounds(candidates, baseline, times, threshold, level, random.Random(seed), clock, returns_time)
    ratios, decided = rounds.run(min_rounds, max_rounds, start, budget_s)
    winner, note = _pick(ratios, baseline, list(candidates), threshold, prefer)
    if rounds.done < min_rounds:  # every round hit the budget: too few to trust, keep the conservative choice
        winner = baseline
        note = f"only {rounds.done} of {min_rounds} rounds fit in {budget_s:.3g}s; kept {baseline!r} untested"
        if warn:
            warnings.warn(f"compare: timing cannot be trusted ({note}).", stacklevel=2)
    elif winner == baseline and not note:
        unclear = [n for n, (_lo, _m, hi) in ratios.items() if n != baseline and hi >= threshold]
        if unclear:
            note = f"{', '.join(unclear)} within noise of {baseline!r} (min gain {min_gain:.0%}); kept {baseline!r}"
    return Comparison(
        winner=winner,
        baseline=baseline,
        medians={n: median(t) for n, t in times.items()},
        spread={n: (min(t), max(t)) for n, t in times.items()},
        ratios={n: r for n, r in ratios.items() if n != baseline},
        trials=rounds.done,
        separated=decided,
        elapsed_s=clock() - start,
        note=note,
        times=times,
        confidence=level,
        trusted=rounds.done >= min_rounds,
    )


@dataclass(frozen=True)
class Settled:
    """What rounds timed elsewhere say (:func:`settle`): the winner, each candidate's ``(low, median, high)`` speed
    ratio over the baseline, whether more rounds could still change the winner, and a note on ties."""

    winner: str
    ratios: dict[str, tuple[float, float, float]]
    settled: bool
    note: str = ""


def look_rounds(min_rounds: int, max_rounds: int) -> list[int]:
    """The round counts at which :func:`compare` looks at its rounds: ``min_rounds``, then each 1.5x the last (at
    least one more), up to ``max_rounds``. Looking after every round would let noise "separate" equal candidates far
    more often than the confidence says; callers that time their own rounds look at these counts too."""
    looks = []
    n = min_rounds
    while n < max_rounds:
        looks.append(n)
        n = max(n + 1, math.ceil(n * 1.5))
    return [*looks, max_rounds]


def settle(
    times: Mapping[str, Sequence[float]],
    baseline: str,
    *,
    min_gain: float = 0.0,
    confidence: float = 0.95,
    prefer: Sequence[str] | None = None,
) -> Settled:
    """:func:`compare`'s decision on rounds timed elsewhere (``times[name][i]``: round ``i`` of ``name``, the same
    count for every name), at :func:`compare`'s stricter per-look level. For decisions whose rounds are not calls
    this process can repeat at will, such as the training steps of a running fit.

    Example::

        >>> settle({"fp32": [1.0, 1.1, 1.0], "bf16": [0.5, 0.52, 0.49]}, "fp32", min_gain=0.05).winner
        'bf16'
    """
    from lightning_speedups._errors import SpeedupConfigError, check_choice

    check_choice("baseline", baseline, list(times))
    counts = {len(t) for t in times.values()}
    if len(times) < 2 or len(counts) > 1 or counts == {0}:
        raise SpeedupConfigError(
            f"`times` has {[len(t) for t in times.values()]} rounds for {list(times)!r}. Allowed values: two or more "
            "names with the same number of rounds, at least one."
        )
    threshold = 1.0 + min_gain
    ratios = _ratio_intervals(times, baseline, _look_level(confidence))
    winner, note = _pick(ratios, baseline, list(times), threshold, prefer)
    rest = {n: r for n, r in ratios.items() if n != baseline}
    return Settled(winner, rest, _separated(ratios, baseline, threshold), note)


def _look_level(confidence: float) -> float:
    """The level of each look at the rounds: stricter than ``confidence``, since several looks are taken."""
    return 1.0 - (1.0 - confidence) / 4.0


def _checked_start(
    candidates: Mapping[str, Callable[[], Any]],
    baseline: str,
    budget_s: float,
    min_rounds: int,
    initial: Mapping[str, Sequence[float]] | None,
) -> dict[str, list[float]]:
    """:func:`compare`'s arguments checked, and its times so far (the ``initial`` rounds, else none)."""
    from lightning_speedups._errors import SpeedupConfigError, check_choice, check_range

    check_range("budget_s", budget_s, 0.0, None, low_inclusive=False, hint="seconds, e.g. 5.0")
    check_choice("baseline", baseline, list(candidates))
    check_range("min_rounds", min_rounds, 2, None)
    if len(candidates) < 2:
        raise SpeedupConfigError(f"`candidates`={list(candidates)!r} needs at least two entries to compare.")
    times = {n: [float(x) for x in (initial or {}).get(n, ())] for n in candidates}
    if len({len(t) for t in times.values()}) > 1:
        raise SpeedupConfigError(
            f"`initial` has {[len(t) for t in times.values()]} rounds per candidate; "
            "Allowed values: the same number of rounds for every candidate."
        )
    return times


@dataclass
class _Rounds:
    """The shuffled rounds of one :func:`compare`, looked at geometrically spaced rounds until they settle."""

    candidates: Mapping[str, Callable[[], Any]]
    baseline: str
    times: dict[str, list[float]]
    threshold: float
    level: float
    rng: random.Random
    clock: Callable[[], float]
    returns_time: bool

    @property
    def done(self) -> int:
        return len(self.times[self.baseline])

    def look(self) -> tuple[dict[str, tuple[float, float, float]], bool]:
        ratios = _ratio_intervals(self.times, self.baseline, self.level)
        return ratios, _separated(ratios, self.baseline, self.threshold)

    def one(self) -> None:
        order = list(self.candidates)
        self.rng.shuffle(order)
        for name in order:
            t0 = self.clock()
            out = self.candidates[name]()
            self.times[name].append(float(out) if self.returns_time else self.clock() - t0)

    def run(self, min_rounds: int, max_rounds: int, start: float, budget_s: float) -> tuple[dict[str, Any], bool]:
        """Rounds until settled, out of time or ``max_rounds``: the last look's ratios and whether they settled."""
        ratios: dict[str, tuple[float, float, float]] = {}
        decided = False
        if self.done >= min_rounds:  # the initial rounds may decide already
            ratios, decided = self.look()
        next_look = max(min_rounds, self.done + 1)
        while self.done < max_rounds and not decided:
            self.one()
            out_of_time = self.clock() - start > budget_s
            if self.done < next_look and not out_of_time:
                continue
            next_look = max(self.done + 1, math.ceil(self.done * 1.5))
            ratios, settled = self.look()
            decided = self.done >= min_rounds and settled
            if decided or out_of_time:
                break
        return ratios or self.look()[0], decided


def _pick(
    ratios: Mapping[str, tuple[float, float, float]],
    baseline: str,
    names: list[str],
    threshold: float,
    prefer: Sequence[str] | None,
) -> tuple[str, str]:
    """The fastest candidate that clears ``threshold`` (those within noise of it resolved by ``prefer``), and a
    note when there was a tie; the baseline and no note when none clears."""
    winners = [n for n, (lo, _m, _hi) in ratios.items() if n != baseline and lo > threshold]
    if not winners:
        return baseline, ""
    best = max(winners, key=lambda n: ratios[n][1])
    tied = [n for n in winners if ratios[n][2] >= ratios[best][0]]
    order = list(prefer or []) + [n for n in names if n not in (prefer or [])]
    winner = min(tied, key=order.index)
    note = f"{', '.join(sorted(tied))} are within noise of each other; chose {winner!r} by preference"
    return winner, note if len(tied) > 1 else ""


def _separated(ratios: Mapping[str, tuple[float, float, float]], baseline: str, threshold: float) -> bool:
    """Whether the decision is settled, so that more rounds cannot change the winner: every candidate either clears
    or misses ``threshold``, or lies wholly below the best candidate that clears (its median the highest). Such a
    candidate can neither become the best nor be tied with it, whichever side of the threshold it would settle on,
    so timing it further is wasted (a borderline channels_last beside a clearly better bf16, say)."""
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
