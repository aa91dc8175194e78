"""The batch-size search under timing noise: paired re-measurements before a stop, an interleaved final choice.

Timing on a shared machine is noisy: other processes, data loaders and thermal limits slow some steps down, and a
search that stops on one unlucky trial picks a size far below the best (seen: 0.58x under a CPU-bound neighbour).
So a stop of the doubling ladder (a plateau or a dip) is a claim that the larger size does not gain ``min_gain``;
under noise it is only made once paired, interleaved re-measurements of both sizes put the whole confidence
interval of the median ratio below ``1 + min_gain`` (at ``confirm_rounds`` rounds that is a sign test: every round
agrees). A verdict still within noise is no stop: the ladder goes on (also, unconfirmed, when measuring the rest of
the ladder once costs less than the confirming rounds). The final choice re-measures the fastest sizes in fresh
interleaved rounds and keeps the smaller size unless a larger one is clearly faster. Both go through
:func:`lightning_speedups.measure.compare` (shuffled rounds until the intervals separate).

Three things keep that affordable. An indifference zone: once every interval lies within ``1 / (1 + 2 min_gain)``
and ``1 + 2 min_gain``, either size is within about twice ``min_gain`` of the other, so more rounds cannot change
the choice by more than that; the climb counts it as a stall and the final check stops there. A fitted step-cost
curve (``lightning_speedups.functional._batch_size_curve``): when every size measured so far agrees with one
smooth curve within the measured step noise, the curve's pooled estimate decides a verdict or the final choice that
clears its threshold by 3 standard errors, with no re-measurement. And a robust step-noise estimate (a stalled
step is clipped at 3 robust sigmas), inflated by the curve's residuals when whole trials vary more than steps
inside a trial do, so the 4-sigma shortcuts are not fooled by bursty neighbours.

Every decision depends only on the trials returned (their step times and elapsed times), so DDP ranks that agree on
their trials take the same steps. Without step times (a hand-made ``measure``) the single-trial rules apply.
Used by :func:`lightning_speedups.functional.batch_size.search_batch_size`; the records live there.
"""

from __future__ import annotations

import math
import statistics
import warnings
from collections.abc import Callable, Sequence
from typing import Any

from lightning_speedups.functional._batch_size_curve import CurveFit, epoch_factor, fit_curve, interpolate_per_sample
from lightning_speedups.measure import Comparison, compare

__all__ = ["CURVE_Z", "Search", "per_sample_time", "trial_cost", "unit_step_times"]

CURVE_Z = 3.0  # a verdict from the fitted curve must clear its threshold by this many standard errors


def unit_step_times(trial: Any) -> list[float]:
    """Each timed step's seconds per real token (when the trial counted ``step_tokens``), else per sample."""
    tokens = getattr(trial, "step_tokens", None)
    if tokens and len(tokens) == len(trial.step_times):
        return [x / max(n, 1) for x, n in zip(trial.step_times, tokens)]
    return [x / trial.batch_size for x in trial.step_times]


def per_sample_time(trial: Any) -> float:
    """Seconds per sample of one trial: the median timed step / the batch size (``1 / samples_per_s`` without steps).
    On token sequences (``step_tokens``) seconds per real token instead: the median of each step's time / tokens.

    The median, not the fastest step: sizes get different numbers of steps (large ones often one), and the fastest of
    three steps is faster than one step by noise alone, which biased the old rule toward small sizes.
    """
    if not trial.ok:
        return math.inf
    if trial.step_times and getattr(trial, "step_tokens", None):
        return float(statistics.median(unit_step_times(trial)))
    if trial.step_times:
        return float(statistics.median(trial.step_times)) / trial.batch_size
    rate = getattr(trial, "rate", trial.samples_per_s)
    return 1.0 / rate if rate > 0 else math.inf


def trial_cost(trial: Any) -> float:
    """Wall seconds a trial took (its ``elapsed_s``, else the sum of its steps): what ``search_time`` counts."""
    return float(trial.elapsed_s or sum(trial.step_times))


class Search:
    """The state of one search: trials per size, the time spent, the climb's verdicts and the final comparison.

    ``run(b, extra)`` measures size ``b`` (``extra``: a re-measurement, kept out of the first-pass table).
    ``epoch_samples``: samples per epoch (per rank) when the loader keeps its last partial batch; sizes are then
    ranked by the cost of a whole epoch (:func:`~._batch_size_curve.epoch_factor`), not of full batches only.
    """

    def __init__(self, run: Callable[[int, bool], Any], config: Any, epoch_samples: int | None = None) -> None:
        self._run, self.cfg, self.epoch_samples = run, config, epoch_samples
        self.by_size: dict[int, list[Any]] = {}
        self.spent_s = 0.0
        self.extra_s = 0.0  # of spent_s: re-measurements (the climb's confirmations and the final check)
        self.decisions: list[dict[str, Any]] = []
        self.rounds: dict[tuple[int, ...], dict[str, list[float]]] = {}
        self.final: dict[str, Any] = {}
        self.note = ""
        self.trusted = True

    # ------------------------------------------------------------------ measuring
    def run(self, b: int, extra: bool = False) -> Any:
        t = self._run(b, extra)
        self.by_size.setdefault(b, []).append(t)
        self.spent_s += trial_cost(t)
        if extra:
            self.extra_s += trial_cost(t)
        return t

    def time_left(self) -> float:
        """Seconds left of ``search_time`` (``inf`` without one)."""
        return math.inf if self.cfg.search_time is None else self.cfg.search_time - self.spent_s

    def remeasure_left(self, final: bool) -> float:
        """Seconds the next re-measurement may take, within ``search_time``. The final check (``final``) may also
        take at most ``confirm_budget`` x the first-pass trials' time; the climb's confirmations are bounded by
        ``confirm_rounds`` each and run only when cheaper than climbing on.
        """
        left = self.time_left()
        if final and self.cfg.confirm_budget is not None:
            left = min(left, self.cfg.confirm_budget * (self.spent_s - self.extra_s))
        return left

    def budget_words(self) -> str:
        """The budgets in force, in the words of the config."""
        words = []
        if self.cfg.confirm_budget is not None:
            words.append(f"`confirm_budget`={self.cfg.confirm_budget} x the first pass's "
                         f"{self.spent_s - self.extra_s:.2f} s")
        if self.cfg.search_time is not None:
            words.append(f"`search_time`={self.cfg.search_time}")
        return " and ".join(words) or "no budget"

    @property
    def guarded(self) -> bool:
        """Whether to guard against noise: the trials carry step times (a real measurement) and re-measuring is on."""
        return self.cfg.confirm_rounds > 1 and any(t.step_times for ts in self.by_size.values() for t in ts)

    def rate(self, b: int) -> float:
        """Samples/s of size ``b`` over a whole epoch (:meth:`epoch_factor`) from :meth:`step_rate`."""
        step = self.step_rate(b)
        return step / self.epoch_factor(b) if step > 0 else step

    def epoch_factor(self, b: int, curve: CurveFit | None = None) -> float:
        """An epoch's per-sample cost at ``b`` over full batches' (1.0 without ``epoch_samples``): the partial last
        batch priced by ``curve``, else interpolated from the measured sizes."""
        if not self.epoch_samples:
            return 1.0
        if curve is not None:
            return epoch_factor(self.epoch_samples, b, curve.per_sample)
        per = {s: 1.0 / r for s in self.by_size if (r := self.step_rate(s)) > 0}
        return epoch_factor(self.epoch_samples, b, lambda x: interpolate_per_sample(per, x))

    def epoch_words(self, sizes: Sequence[int]) -> str:
        """A note when the partial last batch changed the cost of one of ``sizes`` by more than 1%."""
        moved = [b for b in sizes if self.epoch_factor(b) > 1.01]
        if not moved:
            return ""
        return (f"; ranked by the cost of a whole {self.epoch_samples}-sample epoch (its last, partial batch: "
                + ", ".join(f"{b}: {self.epoch_samples % b} samples, {self.epoch_factor(b):.2f}x" for b in moved) + ")")

    def step_rate(self, b: int) -> float:
        """Samples/s of full batches of size ``b``: the median over its trials (the last trial's ``samples_per_s``
        without noise)."""
        ok = [t for t in self.by_size.get(b, []) if t.ok]
        if not ok:
            return 0.0
        if not self.guarded:
            return getattr(ok[-1], "rate", ok[-1].samples_per_s)
        return 1.0 / max(statistics.median(per_sample_time(t) for t in ok), 1e-12)

    def step_noise(self) -> float | None:
        """Pooled standard deviation of log step times within trials (the measured per-step noise); ``None`` with
        fewer than 4 degrees of freedom. A step more than 3 robust sigmas (1.4826 x the median absolute deviation)
        from its trial's mean counts as 3 sigmas: one stalled step (seen: 0.25 s among 9 ms steps) must not make the
        noise look 50x larger than it is."""
        devs: list[float] = []
        dof = 0
        for ts in self.by_size.values():
            for t in ts:
                steps = unit_step_times(t) if getattr(t, "step_tokens", None) else t.step_times
                logs = [math.log(x) for x in steps if x > 0]
                if len(logs) > 1:
                    mean = sum(logs) / len(logs)
                    devs += [x - mean for x in logs]
                    dof += len(logs) - 1
        if dof < 4:
            return None
        clip = 3.0 * 1.4826 * statistics.median(abs(d) for d in devs)
        return math.sqrt(sum(min(abs(d), clip) ** 2 for d in devs) / dof)

    def fit(self) -> CurveFit | None:
        """The step-cost curve fitted to every size measured so far (:mod:`._batch_size_curve`), when noisy timing is
        guarded against; ``None`` without enough sizes or a noise estimate."""
        if not self.guarded:
            return None
        samples = {b: [x for t in ts if t.ok for x in unit_step_times(t)] for b, ts in self.by_size.items()}
        return fit_curve(samples, self.step_noise())

    def shortcut_noise(self, curve: CurveFit | None) -> float | None:
        """The noise the 4-sigma shortcuts compare against: the within-trial step noise, inflated by the residuals of
        ``curve`` (:meth:`fit`) when those show more (whole trials slowed by another process are invisible inside a
        trial)."""
        noise = self.step_noise()
        if noise is None or curve is None:
            return noise
        return noise * math.sqrt(max(1.0, curve.chi2_per_dof))

    def _compare(self, sizes: list[int], max_rounds: int, final: bool = False,
                 budget: float | None = None) -> Comparison | None:
        """Interleaved rounds of ``sizes`` through :func:`~lightning_speedups.measure.compare` (baseline: the
        smallest), continuing rounds already measured for the same sizes; ``None`` when ``search_time`` has no room
        for one more round."""
        key = tuple(sizes)
        # fresh rounds only: the first-pass trials are why these sizes were picked (the fastest looked fastest partly
        # by luck), so re-using them would favour them
        initial = self.rounds.get(key)
        done = len(next(iter(initial.values()))) if initial else 0
        round_cost = sum(trial_cost(self.by_size[b][-1]) for b in sizes)
        budget = self.remeasure_left(final) if budget is None else budget
        if budget < round_cost:
            return None
        start = self.spent_s

        factors = {b: self.epoch_factor(b) for b in sizes}  # fixed for the whole comparison

        def trial(b: int) -> Callable[[], float]:
            return lambda: per_sample_time(self.run(b, True)) * factors[b]

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # too few rounds is reported by the finder, in its own words
            cmp = compare(
                {str(b): trial(b) for b in sizes}, str(sizes[0]), min_gain=self.cfg.min_gain,
                budget_s=min(budget, 1e12), min_rounds=self.cfg.confirm_rounds,
                max_rounds=max(done + 1, max_rounds), warmup=0,
                confidence=self.cfg.confidence, prefer=[str(b) for b in sizes], clock=lambda: self.spent_s - start,
                returns_time=True, seed=sizes[0], initial=initial,
            )
        self.rounds[key] = dict(cmp.times)
        return cmp

    # ------------------------------------------------------------------ the climb
    def judge(self, a: int, b: int, rest: Sequence[int] = ()) -> str:
        """Verdict on the doubling ``a`` (best so far) -> ``b`` (just measured): ``"gain"``, ``"small"`` (gains less
        than ``min_gain``), ``"dip"`` (slower) or ``"unclear"`` (within noise of ``1 + min_gain``: never a stop).

        ``rest`` are the sizes the ladder would still try: when measuring them once costs less than the rounds that
        could confirm a stop, the ladder goes on unconfirmed (the final choice re-measures the fastest sizes anyway).
        """
        threshold = 1.0 + self.cfg.min_gain
        first = (per_sample_time(self.by_size[a][-1]) * self.epoch_factor(a)
                 / max(per_sample_time(self.by_size[b][-1]) * self.epoch_factor(b), 1e-12))
        if first > threshold or not self.guarded:
            # a gain only continues the climb (the final choice re-checks it); without noise, the single-trial rules
            return "gain" if first > threshold else ("small" if first >= 1.0 else "dip")
        curve = self.fit()
        noise = self.shortcut_noise(curve)
        # quiet machine: a single pair already clears the measured per-step noise by a wide margin (4 sigma of a ratio)
        if noise is not None and abs(math.log(first / threshold)) > 4.0 * math.sqrt(2.0) * noise:
            verdict = "small" if first >= 1.0 else "dip"
            self.decisions.append({"sizes": [a, b], "verdict": verdict, "median_ratio": round(first, 4),
                                   "step_noise": round(noise, 4), "rounds": 1})
            return verdict
        if curve is not None and curve.consistent:  # every size so far agrees with one smooth curve: it decides
            log_gain, se = curve.log_ratio(a, b)
            log_gain += math.log(self.epoch_factor(a, curve) / self.epoch_factor(b, curve))
            limit = math.log(threshold)
            if abs(log_gain - limit) > CURVE_Z * se:
                verdict = "gain" if log_gain > limit else ("small" if log_gain >= 0 else "dip")
                self.decisions.append({"sizes": [a, b], "verdict": verdict, "by": "curve fit",
                                       "median_ratio": round(math.exp(log_gain), 4),
                                       "interval": [round(math.exp(log_gain - CURVE_Z * se), 4),
                                                    round(math.exp(log_gain + CURVE_Z * se), 4)],
                                       "chi2_per_dof": round(curve.chi2_per_dof, 2), "rounds": 0})
                return verdict
        cost_b = trial_cost(self.by_size[b][-1])
        confirm = self.cfg.confirm_rounds * (trial_cost(self.by_size[a][-1]) + cost_b)
        climb = sum(cost_b * c / b for c in rest)  # step time grows about linearly with the batch once it is large
        cmp = self._compare([a, b], self.cfg.confirm_rounds) if confirm < climb else None
        lo, mid, hi = cmp.ratios[str(b)] if cmp is not None else (-math.inf, first, math.inf)
        rounds = cmp.trials if cmp is not None else 1
        verdict = "unclear"
        if rounds >= self.cfg.confirm_rounds and hi < threshold:
            verdict = "small" if mid >= 1.0 else "dip"
        elif rounds >= self.cfg.confirm_rounds and mid < threshold and self._in_zone(lo, hi):
            # inside the indifference zone: b gains at most about 2 x min_gain, and the final check re-measures it
            verdict = "small" if mid >= 1.0 else "dip"
        elif mid > threshold:
            verdict = "gain"
        self.decisions.append({"sizes": [a, b], "verdict": verdict, "median_ratio": round(mid, 4), "rounds": rounds,
                               "interval": None if cmp is None else [round(lo, 4), round(hi, 4)]})
        return verdict

    # ------------------------------------------------------------------ the final choice
    def point_choice(self, good: list[int]) -> int:
        """The smallest size within ``min_gain`` of the fastest (pooled estimates)."""
        top = max(self.rate(b) for b in good)
        return min(b for b in good if self.rate(b) >= (1.0 - self.cfg.min_gain) * top)

    def choose(self, good: list[int]) -> int:
        """The final size among the measured ``good`` ones (:meth:`_choose`); the note says when the partial last
        batch of an epoch changed the ranking's costs."""
        chosen = self._choose(good)
        if self.note:
            self.note += self.epoch_words(sorted(good))
        return chosen

    def _choose(self, good: list[int]) -> int:
        """The final size among the measured ``good`` ones (ascending), re-measured interleaved when noisy.

        The candidates are the ``confirm_top`` fastest sizes (pooled medians); they run in fresh shuffled rounds
        (at least ``confirm_rounds``, at most three times that) until the intervals separate from ``1 + min_gain``.
        Separated, the cheaper size is kept unless a larger one is clearly more than ``min_gain`` faster. Still
        straddling the threshold at the end, the faster median is kept: the smaller size could then be more than
        ``2 * min_gain`` slower, the larger one only costs memory (the note says it was within noise).
        """
        point = self.point_choice(good)
        if not self.guarded or len(good) < 2:
            return point
        sizes = sorted(sorted(good, key=self.rate, reverse=True)[: self.cfg.confirm_top])
        curve = self.fit()
        noise, threshold = self.shortcut_noise(curve), 1.0 + self.cfg.min_gain
        if noise is not None and all(  # quiet machine: the pooled estimates clear the step noise by 4 sigma
            abs(math.log(self.rate(b) / self.rate(sizes[0]) / threshold)) > 4.0 * math.sqrt(2.0) * noise
            for b in sizes[1:]
        ):
            self.note = f"{sizes} differ by more than 4 sigma of the measured step noise ({noise:.1%}): no re-check"
            return point
        if curve is not None and curve.consistent:
            pred = {b: curve.per_sample(b) * self.epoch_factor(b, curve) for b in good}
            fastest = min(pred, key=lambda b: pred[b])
            pick = min(b for b in good if pred[b] <= (1.0 + self.cfg.min_gain) * pred[fastest])
            # the contenders: sizes predicted within 3 x min_gain of the fastest (the others are clearly slower)
            near = [b for b in good if b != fastest and pred[b] <= (1.0 + 3.0 * self.cfg.min_gain) * pred[fastest]]
            spread = max((curve.log_ratio(b, fastest)[1] for b in near), default=0.0)
            if CURVE_Z * spread <= self.cfg.min_gain:  # the fit ranks the contenders within min_gain: no re-check
                self.note = (f"chosen from the step-cost curve fitted to all {len(good)} sizes (chi-square per "
                             f"degree of freedom {curve.chi2_per_dof:.2f}, consistent with the measured step noise "
                             f"{self.step_noise():.1%}): {pick}, within {self.cfg.min_gain:.0%} of the fastest")
                self.final = {"sizes": sorted(good), "by": "curve fit", "rounds": 0, "separated": True,
                              "median_samples_per_s": {b: round(1.0 / pred[b], 2) for b in sorted(good)},
                              "chi2_per_dof": round(curve.chi2_per_dof, 3)}
                return pick
        cmp = self._final_rounds(sizes)
        if cmp is None or cmp.trials < self.cfg.confirm_rounds:
            got = 1 if cmp is None and len(sizes) == 2 else 0 if cmp is None else cmp.trials
            return self._untrusted(sizes[0], sizes, f"only {got} of {self.cfg.confirm_rounds} interleaved rounds "
                                   f"fit in {self.budget_words()}", cmp)
        if cmp.separated:
            chosen = int(cmp.winner)
            self.note = cmp.note or f"re-measured {sizes} interleaved: {chosen} separated from the rest"
        else:
            rates = {int(n): 1.0 / max(m, 1e-12) for n, m in cmp.medians.items()}
            chosen = max(rates, key=lambda b: rates[b])
            why = (f"within {2 * self.cfg.min_gain:.0%} of each other after {cmp.trials} interleaved rounds (every "
                   "interval inside the indifference zone)") if self._indifferent(cmp) else (
                f"within noise of each other after {cmp.trials} interleaved rounds (the interval straddles `min_gain`)")
            self.note = f"{', '.join(map(str, sizes))} {why}; kept the faster median, {chosen}"
        self._record(cmp, sizes)
        return chosen

    def _indifferent(self, cmp: Comparison) -> bool:
        """Every ratio's interval lies within ``1 / (1 + 2 min_gain) .. 1 + 2 min_gain``: whichever size is kept is
        within about twice ``min_gain`` of the other, so more rounds cannot change the choice by more than that."""
        return bool(cmp.ratios) and all(self._in_zone(lo, hi) for lo, _m, hi in cmp.ratios.values())

    def _in_zone(self, lo: float, hi: float) -> bool:
        """The ratio interval ``lo .. hi`` lies inside the indifference zone (see :meth:`_indifferent`)."""
        zone = 1.0 + 2.0 * self.cfg.min_gain
        return 1.0 / zone <= lo and hi <= zone

    def _final_rounds(self, sizes: list[int]) -> Comparison | None:
        """The final interleaved rounds: ``confirm_rounds`` first, then more (geometrically, at most three times
        ``confirm_rounds``) only while the sizes neither separate nor sit inside the indifference zone."""
        most = 3 * self.cfg.confirm_rounds
        cap, spent = self.remeasure_left(final=True), self.spent_s  # one budget for all the final's rounds
        cmp = self._compare(sizes, self.cfg.confirm_rounds, final=True, budget=cap)
        while cmp is not None and not cmp.separated and not self._indifferent(cmp) and cmp.trials < most:
            left = cap - (self.spent_s - spent)
            more = self._compare(sizes, min(most, math.ceil(cmp.trials * 1.5)), final=True, budget=left)
            if more is None:
                break
            cmp = more
        return cmp

    def _record(self, cmp: Comparison, sizes: list[int]) -> None:
        self.final = {
            "sizes": sizes,
            "baseline": sizes[0],
            "rounds": cmp.trials,
            "separated": cmp.separated,
            "median_samples_per_s": {int(n): round(1.0 / max(m, 1e-12), 2) for n, m in cmp.medians.items()},
            "spread_samples_per_s": {int(n): [round(1.0 / max(hi, 1e-12), 2), round(1.0 / max(lo, 1e-12), 2)]
                                     for n, (lo, hi) in cmp.spread.items()},
            "ratio_vs_baseline": {int(n): [round(x, 4) for x in r] for n, r in cmp.ratios.items()},
            "note": cmp.note,
        }

    def _untrusted(self, chosen: int, sizes: list[int], why: str, cmp: Comparison | None = None) -> int:
        self.trusted = False
        self.note = (f"timing cannot be trusted ({why}); kept the smallest near-best size {chosen} of {sizes}. "
                     "HINT: raise `confirm_budget` or `search_time` (or set None), or search on a quieter machine; "
                     "on a CPU shared with other work, SpeedAdvisor's `cpu_threads` finding measures whether fewer "
                     "torch threads are faster (beside one CPU-bound process on 2 cores, 1 was 2.1x faster than 2).")
        if cmp is not None:
            self._record(cmp, sizes)
        warnings.warn(f"Batch-size search: {self.note}", stacklevel=3)
        return chosen
