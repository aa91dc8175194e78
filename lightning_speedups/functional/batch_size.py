"""Throughput batch-size search (mission tip 7): the policy, its records and the state it must put back.

The records (:class:`BatchSizeTrial`, :class:`BatchSizeSearchResult`) live in ``_batch_size_records.py`` and are
re-exported here. On token sequences the trials carry real (non-pad) tokens and the search ranks tokens/s.

The search itself knows nothing about Lightning: :func:`search_batch_size` walks a ladder of batch sizes, asks a
``measure(batch_size)`` callable for one :class:`BatchSizeTrial` per size, and stops on a throughput plateau, an
out-of-memory error, the memory budget or the end of the ladder. The
:class:`~lightning_speedups.callbacks.batch_size.ThroughputBatchSizeFinder` callback runs it on a live Trainer, and
:func:`lightning_speedups.tuner.find_batch_size` (one layer up) runs that callback for a search without training.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from lightning_speedups._errors import SpeedupConfigError, check_choice, check_range
from lightning_speedups.functional._batch_size_policy import Search
from lightning_speedups.functional._batch_size_records import BatchSizeSearchResult, BatchSizeTrial
from lightning_speedups.functional._batch_size_state import MemoryMeter, snapshot_training_state

__all__ = [
    "BatchSizeSearchConfig",
    "BatchSizeTrial",
    "BatchSizeSearchResult",
    "search_batch_size",
    "batch_size_ladder",
    "MemoryMeter",
    "snapshot_training_state",
]

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
        min_gain: a doubling must raise samples/s by more than this fraction to count as progress; also the
            tolerance inside which the smallest size is preferred.
        patience: stop after this many doublings in a row without progress (the plateau rule).
        early_plateau: a doubling from the best size so far that still gains, but less than ``min_gain``, ends the
            ladder at once: with a fixed plus per-sample step cost the next doubling gains about half as much again,
            so confirming it would cost the two largest sizes for nothing. A doubling that *loses* samples/s (noise
            from other processes, cache effects) is not explained by that model and counts toward ``patience``.
        refine_steps: bisection steps after the doubling phase (0 = none).
        memory_budget: fraction of device memory (CUDA) or of memory available to the process (CPU) a size may
            use at its peak; sizes predicted or measured above it are not chosen.
        max_trials: hard cap on the number of sizes measured.
        confirm_rounds: when timings are noisy (trials with step times), a stop of the ladder needs this many
            fresh, interleaved rounds of both sizes whose median-ratio interval lies below ``1 + min_gain``
            (still within noise, the ladder goes on), and the final choice re-measures the fastest sizes for at
            least this many rounds (at most three times as many, fewer once the sizes are known to be within
            ``2 * min_gain`` of each other). ``1`` decides from single trials (no guard against noise). When every
            measured size agrees with one fitted step-cost curve, the curve decides without re-measuring (see
            :mod:`lightning_speedups.functional._batch_size_policy`).
        confirm_top: this many of the fastest sizes are re-measured interleaved at the end (>= 2).
        confidence: level of the median-ratio intervals, in [0.5, 1).
        search_time: seconds for the whole search, trials and re-measurements (``None``: no limit). When it runs
            out the ladder stops where it is; when the final re-measurement does not fit, the finder warns that
            timing cannot be trusted and keeps the smallest near-best size.
        confirm_budget: the final re-measurement may take at most this multiple of the time the first-pass trials
            took (``None``: only ``search_time`` bounds it; the climb's confirmations are bounded by
            ``confirm_rounds`` each). Under heavy noise its rounds would otherwise go on to three times
            ``confirm_rounds`` of the largest sizes, several times the ladder's own cost. With simulated +-30%
            jitter per step, 2.0 cut the median search time by up to a third and kept the choice within 10% of
            the best in 96-100 of 100 seeds; when even ``confirm_rounds`` rounds do not fit, the finder warns and
            keeps the smaller size, as for ``search_time``.
    """

    mode: str = "throughput"
    init_val: int = 16
    max_val: int = 4096
    steps_per_trial: int = 3
    warmup_steps: int = 1
    trial_samples: int | None = 256
    trial_time: float | None = 1.0
    min_gain: float = 0.05
    patience: int = 2
    early_plateau: bool = True
    refine_steps: int = 0
    memory_budget: float = 0.9
    max_trials: int = 16
    confirm_rounds: int = 3
    confirm_top: int = 2
    confidence: float = 0.95
    search_time: float | None = None
    confirm_budget: float | None = 2.0

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
            check_range("search_time", self.search_time, 0.0, None, low_inclusive=False,
                        hint="seconds for the whole search, e.g. 30.0, or None for no limit")
        if self.confirm_budget is not None:
            check_range("confirm_budget", self.confirm_budget, 0.0, None, low_inclusive=False,
                        hint="a multiple of the first pass's time, e.g. 1.0, or None for no limit")
        check_range(
            "memory_budget", self.memory_budget, 0.0, 1.0, low_inclusive=False,
            hint="it is a fraction of device (or available system) memory, e.g. 0.9.",
        )


def batch_size_ladder(init_val: int, cap: int, allowed: Callable[[int], bool] | None = None) -> list[int]:
    """``init_val, 2*init_val, ...`` up to ``cap``, ending exactly at ``cap``; only sizes ``allowed`` accepts."""
    sizes: list[int] = []
    b = init_val
    while b < cap:
        sizes.append(b)
        b *= 2
    sizes.append(cap)
    return [s for s in sizes if allowed is None or allowed(s)] or [cap]


def _round(b: int) -> int:
    # multiples of 8 keep tensor-core / vector shapes friendly once sizes are large enough
    return b - b % 8 if b >= 32 else b


def search_batch_size(
    measure: Callable[[int], BatchSizeTrial],
    config: BatchSizeSearchConfig,
    ladder: Sequence[int],
    *,
    memory_budget_bytes: int | None = None,
    memory_baseline: int = 0,
    allowed: Callable[[int], bool] | None = None,
    on_trial: Callable[[BatchSizeTrial], None] | None = None,
    epoch_samples: int | None = None,
) -> BatchSizeSearchResult:
    """Walk ``ladder`` (ascending sizes) calling ``measure`` and choose one size by ``config.mode``.

    Pure policy: every decision depends only on the trials returned, so ranks that agree on their measurements
    agree on every step. Out-of-memory steps back (halving below the first rung if needed, then bisecting when
    ``refine_steps`` > 0). When the trials carry step times, timing noise is guarded against (see
    :mod:`lightning_speedups.functional._batch_size_policy`): a stop needs paired re-measurements that clear the
    noise, and the fastest sizes are re-measured interleaved before the choice. ``measure`` is the injectable
    timing: a test can return trials with seeded noise. ``epoch_samples`` (samples per epoch and rank, for a loader
    that keeps its last partial batch) ranks sizes by the cost of a whole epoch, that partial batch included.

    Returns:
        A :class:`BatchSizeSearchResult` (``search_time_s`` is left for the caller to fill).

    Raises:
        RuntimeError: if even batch size 1 runs out of memory.

    Example::

        >>> cfg = BatchSizeSearchConfig(init_val=8, max_val=256)
        >>> fake = lambda b: BatchSizeTrial(b, samples_per_s=min(b, 64) * 10.0)
        >>> search_batch_size(fake, cfg, batch_size_ladder(8, 256)).chosen
        64
    """
    trials: list[BatchSizeTrial] = []
    remeasured: list[BatchSizeTrial] = []
    measured: dict[int, BatchSizeTrial] = {}

    def run(b: int, extra: bool = False) -> BatchSizeTrial:
        t = measure(b)
        if t.ok and memory_budget_bytes is not None and t.peak_memory > memory_budget_bytes:
            t.status = "over_budget"
        (remeasured if extra else trials).append(t)
        if not extra:
            measured[b] = t
        if on_trial is not None:
            on_trial(t)
        return t

    search = Search(run, config, epoch_samples)

    def predicted(b: int) -> float:
        ok = sorted((t for t in trials if t.ok), key=lambda t: t.batch_size)
        if not ok:
            return 0.0
        last = ok[-1]
        if len(ok) >= 2 and last.batch_size != ok[-2].batch_size:
            per = (last.peak_memory - ok[-2].peak_memory) / (last.batch_size - ok[-2].batch_size)
            return last.peak_memory + max(per, 0.0) * (b - last.batch_size)
        return memory_baseline + (last.peak_memory - memory_baseline) * b / last.batch_size

    stop, failed_at = "end of ladder", None
    best, stalls = None, 0
    previous: int | None = None
    for i, b in enumerate(ladder):
        if len(trials) >= config.max_trials:
            stop = "max_trials"
            break
        if trials and search.time_left() <= 0:
            stop = "search_time"
            break
        if memory_budget_bytes is not None and trials and predicted(b) > memory_budget_bytes:
            stop, failed_at = "memory budget (predicted)", b
            break
        t = search.run(b)
        if not t.ok:
            stop, failed_at = ("out of memory" if t.status == "oom" else "memory budget"), b
            break
        if config.mode == "throughput":
            if best is None:
                best = b
            else:
                verdict = search.judge(best, b, ladder[i + 1:])
                from_best = previous == best
                if verdict == "gain":
                    best, stalls = b, 0
                else:
                    best = b if search.rate(b) > search.rate(best) else best
                if verdict in ("small", "dip"):  # "unclear" (within noise) is never a stall
                    stalls += 1
                    if verdict == "small" and config.early_plateau and from_best:
                        stop = "plateau (gain < min_gain)"
                        break
                    if stalls >= config.patience:
                        stop = "plateau"
                        break
            previous = b
        if i == len(ladder) - 1:
            stop = "max_val" if b == config.max_val else f"cap {b} (dataset size / global batch)"

    # nothing fitted: step back by halving below the first rung
    b = ladder[0]
    while not any(t.ok for t in trials):
        if b <= 1:
            raise RuntimeError("Batch-size search: even batch size 1 runs out of memory (or exceeds the budget).")
        failed_at, b = b, max(1, b // 2)
        search.run(b)

    def good() -> list[int]:
        return sorted(t.batch_size for t in trials if t.ok)

    def point() -> int:
        return good()[-1] if config.mode == "max_fit" else search.point_choice(good())

    for _ in range(config.refine_steps):
        if len(trials) >= config.max_trials or search.time_left() <= 0:
            break
        chosen = point()
        if config.mode == "max_fit":
            if failed_at is None:
                break
            mid = _round((chosen + failed_at) // 2)
        else:
            sizes = sorted(measured)
            idx = sizes.index(chosen)
            lo = measured[sizes[idx - 1]] if idx > 0 else None
            hi = measured[sizes[idx + 1]] if idx + 1 < len(sizes) else None
            side = max((n for n in (lo, hi) if n is not None and n.ok), key=lambda n: search.rate(n.batch_size),
                       default=None)
            if side is None:
                break
            mid = _round((chosen + side.batch_size) // 2)
        if mid in measured or (allowed is not None and not allowed(mid)) or mid <= 0:
            break
        t = search.run(mid)
        if not t.ok:
            failed_at = mid
        elif config.mode == "max_fit" and failed_at is not None and failed_at - mid <= max(1, mid // 16):
            break
    chosen = good()[-1] if config.mode == "max_fit" else search.choose(good())
    return BatchSizeSearchResult(chosen=chosen, mode=config.mode, trials=trials, stop_reason=stop,
                                 memory_budget_bytes=memory_budget_bytes, decisions=search.decisions,
                                 final=search.final, remeasured=remeasured, note=search.note, trusted=search.trusted)


def scale_lr_factor(batch_size: int, base_batch_size: int, rule: str | None) -> float:
    """LR multiplier for a batch-size change (uses ``lightning_speedups.optim.scale_lr`` when it exists)."""
    try:
        from lightning_speedups.optim import scale_lr  # type: ignore[attr-defined]
    except ImportError:
        scale_lr = None
    if scale_lr is not None:
        return float(scale_lr(1.0, batch_size, base_batch_size, rule))
    if rule is None:
        return 1.0
    ratio = batch_size / base_batch_size
    return ratio if rule == "linear" else math.sqrt(ratio)

