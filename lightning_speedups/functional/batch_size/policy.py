"""The batch-size search under timing noise: paired re-measurements before a stop, an interleaved final choice.

Timing on a shared machine is noisy: other processes, data loaders and thermal limits slow some steps down, and a
search that stops on one unlucky trial can pick a size far below the best (see docs/evidence.md, section 'Batch-size
finder'). So a stop of the doubling ladder (a plateau or a dip) is a claim that the larger size does not gain
``min_gain``; under noise it is only made once paired, interleaved re-measurements of both sizes put the whole
confidence interval of the median ratio below ``1 + min_gain`` (at ``confirm_rounds`` rounds that is a sign test:
every round agrees). A verdict still within noise is no stop: the ladder goes on (also, unconfirmed, when measuring
the rest of the ladder once costs less than the confirming rounds). The final choice re-measures the fastest sizes
in fresh interleaved rounds and keeps the smaller size unless a larger one is clearly faster. Both go through
:func:`lightning_speedups.measure.compare` (shuffled rounds until the intervals separate).

Three things keep that affordable. An indifference zone: once every interval lies within ``1 / (1 + 2 min_gain)``
and ``1 + 2 min_gain``, either size is within about twice ``min_gain`` of the other, so more rounds cannot change
the choice by more than that; the climb counts it as a stall and the final check stops there. A fitted step-cost
curve (:mod:`lightning_speedups.functional.batch_size.curve`): when every size measured so far agrees with one
smooth curve within the measured step noise, the curve's pooled estimate decides a verdict or the final choice that
clears its threshold by 3 standard errors, with no re-measurement. And a robust step-noise estimate (a stalled
step is clipped at 3 robust sigmas), inflated by the curve's residuals when whole trials vary more than steps
inside a trial do, so the 4-sigma shortcuts are not fooled by bursty neighbours. Those estimates live in
:mod:`lightning_speedups.functional.batch_size.measurements`; the verdicts and the final choice live here.

Every decision depends only on the trials returned (their step times and elapsed times), so DDP ranks that agree on
their trials take the same steps. Without step times (a hand-made ``measure``) the single-trial rules apply.
Used by :func:`lightning_speedups.functional.batch_size.search.search_batch_size`; the records live in
:mod:`lightning_speedups.functional.batch_size.records`.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from typing import Any

from lightning_speedups.functional.batch_size.config import BatchSizeSearchConfig
from lightning_speedups.functional.batch_size.curve import CurveFit
from lightning_speedups.functional.batch_size.measurements import Measurements
from lightning_speedups.functional.batch_size.records import BatchSizeTrial, per_sample_time, trial_cost
from lightning_speedups.measure import Comparison

__all__ = ["CURVE_Z", "Search"]

CURVE_Z = 3.0  # a verdict from the fitted curve must clear its threshold by this many standard errors


class Search(Measurements):
    """The state of one search: its ``Measurements``, the climb's verdicts and the final choice.

    The arguments are those of ``Measurements``.
    """

    def __init__(
        self,
        run: Callable[[int, bool], BatchSizeTrial],
        config: BatchSizeSearchConfig,
        epoch_samples: int | None = None,
    ) -> None:
        super().__init__(run, config, epoch_samples)
        self.decisions: list[dict[str, Any]] = []
        self.final: dict[str, Any] = {}
        self.note = ""
        self.trusted = True

    # ------------------------------------------------------------------ the climb
    def judge(self, a: int, b: int, rest: Sequence[int] = ()) -> str:
        """Verdict on the doubling ``a`` (best so far) -> ``b`` (just measured): ``"gain"``, ``"small"`` (gains less
        than ``min_gain``), ``"dip"`` (slower) or ``"unclear"`` (within noise of ``1 + min_gain``: never a stop).

        ``rest`` are the sizes the ladder would still try: when measuring them once costs less than the rounds that
        could confirm a stop, the ladder goes on unconfirmed (the final choice re-measures the fastest sizes anyway).
        """
        threshold = 1.0 + self.cfg.min_gain
        first = (
            per_sample_time(self.by_size[a][-1])
            * self.epoch_factor(a)
            / max(per_sample_time(self.by_size[b][-1]) * self.epoch_factor(b), 1e-12)
        )
        if first > threshold or not self.guarded:
            # a gain only continues the climb (the final choice re-checks it); without noise, the single-trial rules
            return "gain" if first > threshold else ("small" if first >= 1.0 else "dip")
        curve = self.fit()
        noise = self.shortcut_noise(curve)
        # quiet machine: a single pair already clears the measured per-step noise by a wide margin (4 sigma of a ratio)
        if noise is not None and abs(math.log(first / threshold)) > 4.0 * math.sqrt(2.0) * noise:
            verdict = "small" if first >= 1.0 else "dip"
            return self._decided([a, b], verdict, median_ratio=round(first, 4), step_noise=round(noise, 4), rounds=1)
        if curve is not None and curve.decides:  # every size so far agrees with one smooth curve: it decides
            verdict = self._curve_verdict(a, b, curve, threshold)
            if verdict is not None:
                return verdict
        return self._paired_verdict(a, b, first, threshold, rest)

    def _decided(self, sizes: list[int], verdict: str, **evidence: Any) -> str:
        """Record a verdict of the climb with its evidence (kept in the result's ``decisions``) and return it."""
        self.decisions.append({"sizes": sizes, "verdict": verdict, **evidence})
        return verdict

    def _curve_verdict(self, a: int, b: int, curve: CurveFit, threshold: float) -> str | None:
        """The verdict of the fitted ``curve`` when it clears ``threshold`` by ``CURVE_Z`` standard errors, else
        ``None``."""
        log_gain, se = curve.log_ratio(a, b)
        log_gain += math.log(self.epoch_factor(a, curve) / self.epoch_factor(b, curve))
        limit = math.log(threshold)
        if abs(log_gain - limit) <= CURVE_Z * se:
            return None
        verdict = "gain" if log_gain > limit else ("small" if log_gain >= 0 else "dip")
        interval = [round(math.exp(log_gain - CURVE_Z * se), 4), round(math.exp(log_gain + CURVE_Z * se), 4)]
        return self._decided(
            [a, b],
            verdict,
            by="curve fit",
            median_ratio=round(math.exp(log_gain), 4),
            interval=interval,
            chi2_per_dof=round(curve.chi2_per_dof, 2),
            rounds=0,
        )

    def _paired_verdict(self, a: int, b: int, first: float, threshold: float, rest: Sequence[int]) -> str:
        """The verdict from paired, interleaved rounds of ``a`` and ``b`` (when confirming costs less than climbing
        on through ``rest``), else from the ``first`` pair's ratio: a stop only once the rounds clear the noise."""
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
        interval = None if cmp is None else [round(lo, 4), round(hi, 4)]
        return self._decided([a, b], verdict, median_ratio=round(mid, 4), rounds=rounds, interval=interval)

    # ------------------------------------------------------------------ the final choice
    def point_choice(self, good: list[int]) -> int:
        """The smallest size within ``min_gain`` of the fastest (pooled estimates)."""
        top = max(self.rate(b) for b in good)
        return min(b for b in good if self.rate(b) >= (1.0 - self.cfg.min_gain) * top)

    def choose(self, good: list[int]) -> int:
        """The final size among the measured ``good`` ones (``_choose``); the note says when the partial last
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
        noise = self.shortcut_noise(curve)
        threshold = 1.0 + self.cfg.min_gain
        quiet = noise is not None and all(
            abs(math.log(self.rate(b) / self.rate(sizes[0]) / threshold)) > 4.0 * math.sqrt(2.0) * noise
            for b in sizes[1:]
        )
        if quiet:  # quiet machine: the pooled estimates clear the step noise by 4 sigma
            self.note = f"{sizes} differ by more than 4 sigma of the measured step noise ({noise:.1%}): no re-check"
            return point
        if curve is not None and curve.decides:
            pick = self._curve_choice(good, curve)
            if pick is not None:
                return pick
        return self._measured_choice(sizes)

    def _curve_choice(self, good: list[int], curve: CurveFit) -> int | None:
        """The smallest size the fitted ``curve`` predicts within ``min_gain`` of the fastest, when it ranks the
        contenders that precisely; else ``None`` (the final rounds decide)."""
        pred = {b: curve.per_sample(b) * self.epoch_factor(b, curve) for b in good}
        fastest = min(pred, key=lambda b: pred[b])
        pick = min(b for b in good if pred[b] <= (1.0 + self.cfg.min_gain) * pred[fastest])
        # the contenders: sizes predicted within 3 x min_gain of the fastest (the others are clearly slower)
        near = [b for b in good if b != fastest and pred[b] <= (1.0 + 3.0 * self.cfg.min_gain) * pred[fastest]]
        spread = max((curve.log_ratio(b, fastest)[1] for b in near), default=0.0)
        if CURVE_Z * spread > self.cfg.min_gain:  # the fit cannot rank the contenders within min_gain: re-check
            return None
        self.note = (
            f"chosen from the step-cost curve fitted to all {len(good)} sizes (chi-square per "
            f"degree of freedom {curve.chi2_per_dof:.2f}, consistent with the measured step noise "
            f"{self.step_noise():.1%}): {pick}, within {self.cfg.min_gain:.0%} of the fastest"
        )
        self.final = {
            "sizes": sorted(good),
            "by": "curve fit",
            "rounds": 0,
            "separated": True,
            "median_samples_per_s": {b: round(1.0 / pred[b], 2) for b in sorted(good)},
            "chi2_per_dof": round(curve.chi2_per_dof, 3),
        }
        return pick

    def _measured_choice(self, sizes: list[int]) -> int:
        """The choice among ``sizes`` from fresh interleaved rounds (:meth:`_final_rounds`); the smallest, with a
        warning, when too few rounds fit in the budgets."""
        cmp = self._final_rounds(sizes)
        if cmp is None or cmp.trials < self.cfg.confirm_rounds:
            got = 1 if cmp is None and len(sizes) == 2 else 0 if cmp is None else cmp.trials
            why = f"only {got} of {self.cfg.confirm_rounds} interleaved rounds fit in {self.budget_words()}"
            return self._untrusted(sizes[0], sizes, why, cmp)
        if cmp.separated:
            chosen = int(cmp.winner)
            self.note = cmp.note or f"re-measured {sizes} interleaved: {chosen} separated from the rest"
        else:
            rates = {int(n): 1.0 / max(m, 1e-12) for n, m in cmp.medians.items()}
            chosen = max(rates, key=lambda b: rates[b])
            if self._indifferent(cmp):
                why = (
                    f"within {2 * self.cfg.min_gain:.0%} of each other after {cmp.trials} interleaved rounds (every "
                    "interval inside the indifference zone)"
                )
            else:
                why = (
                    f"within noise of each other after {cmp.trials} interleaved rounds (the interval straddles "
                    "`min_gain`)"
                )
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
        # one budget for all the final's rounds
        cap = self.remeasure_left(final=True)
        spent = self.spent_s
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
            "spread_samples_per_s": {
                int(n): [round(1.0 / max(hi, 1e-12), 2), round(1.0 / max(lo, 1e-12), 2)]
                for n, (lo, hi) in cmp.spread.items()
            },
            "ratio_vs_baseline": {int(n): [round(x, 4) for x in r] for n, r in cmp.ratios.items()},
            "note": self.note,  # the decision as made: the comparison's own note keeps its baseline when unseparated
        }

    def _untrusted(self, chosen: int, sizes: list[int], why: str, cmp: Comparison | None = None) -> int:
        """Keep ``chosen`` (the smallest near-best size), mark the result untrusted and warn with what happened."""
        self.trusted = False
        noise = self.step_noise()
        measured = "" if noise is None else f"; the step noise measured in this search: {noise:.1%}"
        self.note = (
            f"timing cannot be trusted ({why}{measured}); kept the smallest near-best size {chosen} of "
            f"{sizes}. HINT: raise `confirm_budget` or `search_time` (or set None), or search on a quieter "
            "machine; on a CPU shared with other work, SpeedAdvisor's `cpu_threads` finding measures whether "
            "fewer torch threads are faster."
        )
        if cmp is not None:
            self._record(cmp, sizes)
        warnings.warn(f"Batch-size search: {self.note}", stacklevel=3)
        return chosen
