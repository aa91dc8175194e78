"""How the batch-size search walks and when it stops: :class:`BatchSizeSearchConfig`, checked in ``__post_init__``."""

from __future__ import annotations

from dataclasses import dataclass

from lightning_speedups._errors import SpeedupConfigError, check_choice, check_range

__all__ = ["LR_RULES", "MODES", "BatchSizeSearchConfig"]

MODES = ("throughput", "max_fit", "sweep")
LR_RULES = ("linear", "sqrt", None)


@dataclass
class BatchSizeSearchConfig:
    """How the search walks and when it stops.

    Args:
        mode: ``"throughput"`` (highest samples/s), ``"max_fit"`` (largest size within ``memory_budget``) or
            ``"sweep"`` (measure every size of the ladder, pick the fastest; the exhaustive reference).
        init_val: first batch size tried.
        max_val: largest batch size tried.
        steps_per_trial: at most this many timed optimizer steps per size.
        warmup_steps: untimed steps before timing: at the first size only on CPU (the process is warm after it, a
            new batch shape costs nothing extra there), at every size on CUDA (cuDNN autotunes each new shape).
        trial_samples: a size stops timing once its timed steps have seen this many samples (``None``: no limit),
            so large sizes take one step instead of ``steps_per_trial``.
        trial_time: a size stops timing once its timed steps took this many seconds (``None``: no limit).
        trial_min_time: but not before its timed steps took this many seconds, whatever ``steps_per_trial`` and
            ``trial_samples`` say (``None``: no floor). Linux gives a CPU-bound neighbour slices of several
            milliseconds, so a trial of a few millisecond steps can read whether the neighbour ran rather than the
            step. Tried at 0.05 s on the workload suite beside a busy process, it did not help the MLP whose one-step
            trials motivated it (7 of 10 searches within 0.9x of the best, against 8 of 10 without) and made its
            search 2-10x longer, so it is off by default (docs/evidence.md, section 'Batch-size finder').
        min_gain: a doubling must raise samples/s by more than this fraction to count as progress; also the
            tolerance inside which the smallest size is preferred.
        patience: stop after this many doublings in a row without progress (the plateau rule). The default 3 spans
            8x in batch size: a curve flat from 16 to 64 that is faster from 128 on (a small CNN on a CPU that
            reaches faster kernels at larger batches) is climbed past; 2 stopped at 64 and kept 16, 0.75x of the best.
        early_plateau: a doubling from the best size so far that still gains, but less than ``min_gain``, ends the
            ladder at once, where the fixed plus per-sample step cost explains it: the doubling that reached the best
            size gained little enough that the model's next gain
            (:func:`~lightning_speedups.functional.batch_size.curve.next_doubling_gain`) is within ``2 * min_gain``.
            Every further doubling then gains about half as much again, so confirming it would cost the two largest
            sizes for nothing. A flat stretch the model does not explain (no rise before it, or a rise that stops
            dead) and a doubling that *loses* samples/s (noise from other processes, cache effects) count toward
            ``patience`` instead.
        refine_steps: bisection steps after the doubling phase (0 = none).
        memory_budget: fraction of device memory (CUDA) or of memory available to the process (CPU: the
            machine's available memory, or what a cgroup's memory limit leaves, if less) a size may use at its
            peak; sizes predicted or measured above it are not chosen.
        max_trials: hard cap on the number of sizes measured.
        confirm_rounds: when timings are noisy (trials with step times), a stop of the ladder needs this many
            fresh, interleaved rounds of both sizes whose median-ratio interval lies below ``1 + min_gain``
            (still within noise, the ladder goes on), and the final choice re-measures the fastest sizes for at
            least this many rounds (at most three times as many, fewer once the sizes are known to be within
            ``2 * min_gain`` of each other). ``1`` decides from single trials (no guard against noise). When every
            measured size agrees with one fitted step-cost curve, the curve decides without re-measuring (see
            :mod:`lightning_speedups.functional.batch_size.policy`).
        confirm_top: this many of the fastest sizes are re-measured interleaved at the end (>= 2).
        confidence: level of the median-ratio intervals, in [0.5, 1).
        search_time: seconds for the whole search, trials and re-measurements (``None``: no limit). When it runs
            out the ladder stops where it is; when the final re-measurement does not fit, the finder warns that
            timing cannot be trusted and keeps the smallest near-best size.
        confirm_budget: the final re-measurement may take at most this multiple of the time the first-pass trials
            took (``None``: only ``search_time`` bounds it; the climb's confirmations are bounded by
            ``confirm_rounds`` each). Under heavy noise its rounds would otherwise go on to three times
            ``confirm_rounds`` of the largest sizes, several times the ladder's own cost; what the default costs and
            keeps under simulated noise is in docs/evidence.md, section 'Batch-size finder'. When even
            ``confirm_rounds`` rounds do not fit, the finder warns and keeps the smaller size, as for ``search_time``.

    Example::

        >>> BatchSizeSearchConfig(mode="max_fit", init_val=8, max_val=256).max_val
        256
    """

    mode: str = "throughput"
    init_val: int = 16
    max_val: int = 4096
    steps_per_trial: int = 3
    warmup_steps: int = 1
    trial_samples: int | None = 256
    trial_time: float | None = 1.0
    trial_min_time: float | None = None
    min_gain: float = 0.05
    patience: int = 3
    early_plateau: bool = True
    refine_steps: int = 0
    memory_budget: float = 0.9
    max_trials: int = 16
    confirm_rounds: int = 3
    confirm_top: int = 2
    confidence: float = 0.95
    search_time: float | None = None
    confirm_budget: float | None = 2.0

    def trial_done(self, steps: int, samples: int, seconds: float) -> bool:
        """Whether a trial that has timed ``steps`` steps of ``samples`` samples in ``seconds`` stops: after
        ``steps_per_trial`` steps, ``trial_samples`` samples or ``trial_time`` seconds, once ``trial_min_time``
        seconds are reached (and after one step at least).

        Example::

            >>> cfg = BatchSizeSearchConfig(trial_min_time=0.05)
            >>> cfg.trial_done(3, 48, 0.3), cfg.trial_done(3, 48, 0.006), cfg.trial_done(1, 512, 2.0)
            (True, False, True)
        """
        if steps < 1 or (self.trial_min_time is not None and seconds < self.trial_min_time):
            return False
        return (
            steps >= self.steps_per_trial
            or (self.trial_samples is not None and samples >= self.trial_samples)
            or (self.trial_time is not None and seconds >= self.trial_time)
        )

    def __post_init__(self) -> None:
        check_choice("mode", self.mode, MODES)
        for name in ("init_val", "max_val", "steps_per_trial", "max_trials", "patience", "confirm_rounds"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise SpeedupConfigError(f"`{name}`={value!r} is invalid. Allowed values: a positive integer.")
        for name in ("warmup_steps", "refine_steps"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise SpeedupConfigError(f"`{name}`={value!r} is invalid. Allowed values: an integer >= 0.")
        if self.trial_samples is not None and (
            not isinstance(self.trial_samples, int) or isinstance(self.trial_samples, bool) or self.trial_samples < 1
        ):
            raise SpeedupConfigError(
                f"`trial_samples`={self.trial_samples!r} is invalid. Allowed values: a positive integer or None."
            )
        if self.trial_time is not None and (
            isinstance(self.trial_time, bool) or not isinstance(self.trial_time, (int, float)) or self.trial_time <= 0
        ):
            raise SpeedupConfigError(
                f"`trial_time`={self.trial_time!r} is invalid. Allowed values: a positive number of seconds or None."
            )
        if self.trial_min_time is not None:
            hint = "seconds of timed steps a trial takes at least, e.g. 0.05, or None for no floor"
            check_range("trial_min_time", self.trial_min_time, 0.0, None, low_inclusive=False, hint=hint)
        if self.init_val > self.max_val:
            raise SpeedupConfigError(
                f"`init_val`={self.init_val!r} is larger than `max_val`={self.max_val!r}. "
                "Allowed values: init_val <= max_val."
            )
        check_range("min_gain", self.min_gain, 0.0, 1.0, high_inclusive=False)
        check_range("confidence", self.confidence, 0.5, 1.0, high_inclusive=False)
        if not isinstance(self.confirm_top, int) or isinstance(self.confirm_top, bool) or self.confirm_top < 2:
            raise SpeedupConfigError(f"`confirm_top`={self.confirm_top!r} is invalid. Allowed values: an integer >= 2.")
        if self.search_time is not None:
            check_range(
                "search_time",
                self.search_time,
                0.0,
                None,
                low_inclusive=False,
                hint="seconds for the whole search, e.g. 30.0, or None for no limit",
            )
        if self.confirm_budget is not None:
            check_range(
                "confirm_budget",
                self.confirm_budget,
                0.0,
                None,
                low_inclusive=False,
                hint="a multiple of the first pass's time, e.g. 1.0, or None for no limit",
            )
        check_range(
            "memory_budget",
            self.memory_budget,
            0.0,
            1.0,
            low_inclusive=False,
            hint="it is a fraction of device (or available system) memory, e.g. 0.9.",
        )
