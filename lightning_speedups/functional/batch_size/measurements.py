"""What one batch-size search has measured, and the estimates the noise rules decide on.

Every trial is kept per size with the time it cost (what ``search_time`` and ``confirm_budget`` count). From them: a
size's rate (the median over its trials when timing is noisy, priced over a whole epoch when the loader keeps its
partial last batch), a robust step-noise estimate (pooled within trials; a stalled step is clipped at 3 robust
sigmas), the step-cost curve fitted to every size (:mod:`lightning_speedups.functional.batch_size.curve`), and
interleaved re-measurements through :func:`lightning_speedups.measure.compare`.
:class:`~lightning_speedups.functional.batch_size.policy.Search` builds its verdicts on these.
"""

from __future__ import annotations

import math
import statistics
import warnings
from collections.abc import Callable, Sequence

from lightning_speedups.functional.batch_size.config import BatchSizeSearchConfig
from lightning_speedups.functional.batch_size.curve import CurveFit, epoch_factor, fit_curve, interpolate_per_sample
from lightning_speedups.functional.batch_size.records import (
    BatchSizeTrial,
    per_sample_time,
    trial_cost,
    unit_step_times,
)
from lightning_speedups.measure import Comparison, compare

__all__ = ["Measurements"]


class Measurements:
    """What one search has measured: trials per size, the time spent and the interleaved rounds, and the estimates
    drawn from them (rates, step noise, the fitted curve). :class:`~.policy.Search` decides on them.

    ``run(b, extra)`` measures size ``b`` (``extra``: a re-measurement, kept out of the first-pass table).
    ``epoch_samples``: samples per epoch (per rank) when the loader keeps its last partial batch; sizes are then
    ranked by the cost of a whole epoch (:func:`~.curve.epoch_factor`), not of full batches only.
    """

    def __init__(
        self,
        run: Callable[[int, bool], BatchSizeTrial],
        config: BatchSizeSearchConfig,
        epoch_samples: int | None = None,
    ) -> None:
        self._run = run
        self.cfg = config
        self.epoch_samples = epoch_samples
        self.by_size: dict[int, list[BatchSizeTrial]] = {}
        self.spent_s = 0.0
        self.extra_s = 0.0  # of spent_s: re-measurements (the climb's confirmations and the final check)
        self.rounds: dict[tuple[int, ...], dict[str, list[float]]] = {}

    # ------------------------------------------------------------------ measuring
    def run(self, b: int, extra: bool = False) -> BatchSizeTrial:
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
            words.append(
                f"`confirm_budget`={self.cfg.confirm_budget} x the first pass's {self.spent_s - self.extra_s:.2f} s"
            )
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
        return (
            f"; ranked by the cost of a whole {self.epoch_samples}-sample epoch (its last, partial batch: "
            + ", ".join(f"{b}: {self.epoch_samples % b} samples, {self.epoch_factor(b):.2f}x" for b in moved)
            + ")"
        )

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
        from its trial's mean counts as 3 sigmas: one stalled step, many times slower than the others, must not make
        the noise look many times larger than it is."""
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
        """The step-cost curve fitted to every size measured so far (:mod:`.curve`), when noisy timing is
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

    def _compare(
        self, sizes: list[int], max_rounds: int, final: bool = False, budget: float | None = None
    ) -> Comparison | None:
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
                {str(b): trial(b) for b in sizes},
                str(sizes[0]),
                min_gain=self.cfg.min_gain,
                budget_s=min(budget, 1e12),
                min_rounds=self.cfg.confirm_rounds,
                max_rounds=max(done + 1, max_rounds),
                warmup=0,
                confidence=self.cfg.confidence,
                prefer=[str(b) for b in sizes],
                clock=lambda: self.spent_s - start,
                returns_time=True,
                seed=sizes[0],
                initial=initial,
            )
        self.rounds[key] = dict(cmp.times)
        return cmp
