"""The batch-size search in three named steps: climb the ladder, step back when nothing fits, refine.

:func:`search_batch_size` walks a ladder of batch sizes, asks a ``measure(batch_size)`` callable for one
:class:`~lightning_speedups.functional.batch_size.records.BatchSizeTrial` per size, and stops on a throughput plateau,
an out-of-memory error, the memory budget or the end of the ladder (:func:`_climb`). When not even the first size
fits it halves below it (:func:`_step_back`), then bisects ``refine_steps`` times (:func:`_refine`). What the steps
share (the trials, the climb's best size, why the ladder stopped) is one :class:`_Walk`; the verdicts under timing
noise and the final choice are :class:`~lightning_speedups.functional.batch_size.policy.Search`'s.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from lightning_speedups.functional.batch_size.config import BatchSizeSearchConfig
from lightning_speedups.functional.batch_size.curve import next_doubling_gain
from lightning_speedups.functional.batch_size.policy import Search
from lightning_speedups.functional.batch_size.records import BatchSizeSearchResult, BatchSizeTrial

__all__ = ["NoBatchSizeFits", "batch_size_ladder", "scale_lr_factor", "search_batch_size"]


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


class NoBatchSizeFits(RuntimeError):
    """Not even batch size 1 fitted: ``trials`` holds what was measured, ``memory_budget_bytes`` the budget.

    :attr:`over_budget_only` tells the two cases apart: every size *ran* and only the memory budget ruled it out (the
    model's own training state takes most of the memory: the caller can keep the size it had), or a size ran out of
    memory (the model cannot train here at all).
    """

    def __init__(self, trials: list[BatchSizeTrial], memory_budget_bytes: int | None, memory_budget: float) -> None:
        self.trials = list(trials)
        self.memory_budget_bytes = memory_budget_bytes
        message = "Batch-size search: even batch size 1 runs out of memory."
        if self.over_budget_only and memory_budget_bytes is not None:
            smallest = min(self.trials, key=lambda t: t.batch_size)
            message = (
                f"Batch-size search: even batch size 1 exceeds the memory budget: every size ran, but batch "
                f"{smallest.batch_size} peaked at {smallest.peak_memory / 2**30:.2f} GiB against a budget of "
                f"{memory_budget_bytes / 2**30:.2f} GiB (`memory_budget`={memory_budget})."
            )
        super().__init__(message)

    @property
    def over_budget_only(self) -> bool:
        """Whether every size ran and only the memory budget ruled it out (no size ran out of memory)."""
        return bool(self.trials) and all(t.status == "over_budget" for t in self.trials)


@dataclass
class _Walk:
    """What one search has measured and decided so far; each step of :func:`search_batch_size` reads and updates it."""

    measure: Callable[[int], BatchSizeTrial]
    config: BatchSizeSearchConfig
    memory_budget_bytes: int | None = None
    memory_baseline: int = 0
    on_trial: Callable[[BatchSizeTrial], None] | None = None
    epoch_samples: int | None = None
    trials: list[BatchSizeTrial] = field(default_factory=list)  # the table: ladder, step back and refine, in order
    remeasured: list[BatchSizeTrial] = field(default_factory=list)  # the noise rules' extra rounds
    measured: dict[int, BatchSizeTrial] = field(default_factory=dict)  # the table's last trial per size
    stop: str = "end of ladder"
    failed_at: int | None = None  # the last size that ran out of memory or over the budget
    best: int | None = None  # the climb's fastest size so far
    stalls: int = 0  # doublings in a row without progress
    rise: float | None = None  # per doubling, the samples/s gain of the verdict that made `best` (None: none yet)
    previous: int | None = None  # the size the climb measured before the current one
    search: Search = field(init=False)

    def __post_init__(self) -> None:
        self.search = Search(self.run, self.config, self.epoch_samples)

    def run(self, b: int, extra: bool = False) -> BatchSizeTrial:
        """Measure ``b`` (``extra``: a re-measurement, kept out of the table); a peak over the budget marks it."""
        t = self.measure(b)
        if t.ok and self.memory_budget_bytes is not None and t.peak_memory > self.memory_budget_bytes:
            t.status = "over_budget"
        (self.remeasured if extra else self.trials).append(t)
        if not extra:
            self.measured[b] = t
        if self.on_trial is not None:
            self.on_trial(t)
        return t

    def predicted_peak(self, b: int) -> float:
        """Peak bytes at ``b``, extrapolated from the two largest sizes that fitted (or from one and the baseline)."""
        ok = sorted((t for t in self.trials if t.ok), key=lambda t: t.batch_size)
        if not ok:
            return 0.0
        last = ok[-1]
        if len(ok) >= 2 and last.batch_size != ok[-2].batch_size:
            per = (last.peak_memory - ok[-2].peak_memory) / (last.batch_size - ok[-2].batch_size)
            return last.peak_memory + max(per, 0.0) * (b - last.batch_size)
        return self.memory_baseline + (last.peak_memory - self.memory_baseline) * b / last.batch_size

    def good(self) -> list[int]:
        """The sizes of the table that fitted, ascending."""
        return sorted(t.batch_size for t in self.trials if t.ok)


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
    :mod:`lightning_speedups.functional.batch_size.policy`): a stop needs paired re-measurements that clear the
    noise, and the fastest sizes are re-measured interleaved before the choice. ``measure`` is the injectable
    timing: a test can return trials with seeded noise. ``epoch_samples`` (samples per epoch and rank, for a loader
    that keeps its last partial batch) ranks sizes by the cost of a whole epoch, that partial batch included.

    Returns:
        A :class:`BatchSizeSearchResult` (``search_time_s`` is left for the caller to fill).

    Raises:
        ~lightning_speedups.functional.batch_size.NoBatchSizeFits: (a ``RuntimeError``) if even batch size 1 runs
            out of memory or over the budget.

    Example::

        >>> cfg = BatchSizeSearchConfig(init_val=8, max_val=256)
        >>> fake = lambda b: BatchSizeTrial(b, samples_per_s=min(b, 64) * 10.0)
        >>> search_batch_size(fake, cfg, batch_size_ladder(8, 256)).chosen
        64
    """
    walk = _Walk(measure, config, memory_budget_bytes, memory_baseline, on_trial, epoch_samples)
    _climb(walk, ladder)
    _step_back(walk, ladder[0])
    _refine(walk, allowed)
    search = walk.search
    chosen = walk.good()[-1] if config.mode == "max_fit" else search.choose(walk.good())
    return BatchSizeSearchResult(
        chosen=chosen,
        mode=config.mode,
        trials=walk.trials,
        stop_reason=walk.stop,
        memory_budget_bytes=memory_budget_bytes,
        decisions=search.decisions,
        final=search.final,
        remeasured=walk.remeasured,
        note=search.note,
        trusted=search.trusted,
    )


def _climb(walk: _Walk, ladder: Sequence[int]) -> None:
    """Measure the ladder's sizes in order until a stop rule fires; ``walk.stop`` says which."""
    for i, b in enumerate(ladder):
        if _stop_before(walk, b):
            return
        t = walk.search.run(b)
        if not t.ok:
            walk.stop = "out of memory" if t.status == "oom" else "memory budget"
            walk.failed_at = b
            return
        if walk.config.mode == "throughput" and _plateau(walk, b, ladder[i + 1 :]):
            return
        if i == len(ladder) - 1:
            walk.stop = "max_val" if b == walk.config.max_val else f"cap {b} (dataset size / global batch)"


def _stop_before(walk: _Walk, b: int) -> bool:
    """Whether the climb stops before measuring ``b``: the trial cap, ``search_time`` or the predicted peak memory."""
    if len(walk.trials) >= walk.config.max_trials:
        walk.stop = "max_trials"
    elif walk.trials and walk.search.time_left() <= 0:
        walk.stop = "search_time"
    elif walk.memory_budget_bytes is not None and walk.trials and walk.predicted_peak(b) > walk.memory_budget_bytes:
        walk.stop = "memory budget (predicted)"
        walk.failed_at = b
    else:
        return False
    return True


def _plateau(walk: _Walk, b: int, rest: Sequence[int]) -> bool:
    """The throughput rule after ``b`` fitted: whether samples/s stopped rising (``rest``: the sizes still ahead).

    A small gain from the best size ends the ladder at once only where the step-cost model explains it
    (:func:`_explained`); any other flat stretch or dip ends it after ``patience`` doublings without progress.
    """
    if walk.best is None:
        walk.best = walk.previous = b
        return False
    search = walk.search
    best = walk.best
    verdict = search.judge(best, b, rest)
    from_best = walk.previous == best
    if verdict == "gain":
        ratio = search.rate(b) / max(search.rate(best), 1e-12)
        walk.rise = ratio ** (1.0 / max(math.log2(b / best), 1e-12))
        walk.best = b
        walk.stalls = 0
    elif search.rate(b) > search.rate(best):
        walk.best = b
    if verdict in ("small", "dip"):  # "unclear" (within noise) is never a stall
        walk.stalls += 1
        if verdict == "small" and walk.config.early_plateau and from_best and _explained(walk):
            walk.stop = "plateau (gain < min_gain)"
            return True
        if walk.stalls >= walk.config.patience:
            walk.stop = "plateau"
            return True
    walk.previous = b
    return False


def _explained(walk: _Walk) -> bool:
    """Whether the fixed plus per-sample step cost explains a small gain from the best size: the doubling that
    reached the best size gained little enough that the model's next gain (:func:`~.curve.next_doubling_gain`) stays
    within twice ``min_gain``. Then every further doubling gains less again, and the ladder may end at once.

    Not explained: a flat stretch with no gain before it (flat from the first size), or after a gain the model would
    have continued (a rise that stops dead): larger sizes may still be faster there (a CPU that reaches faster
    kernels at larger batches), so the ladder goes on for ``patience`` doublings.
    """
    return walk.rise is not None and next_doubling_gain(walk.rise) <= 1.0 + 2.0 * walk.config.min_gain


def _step_back(walk: _Walk, first: int) -> None:
    """When no size fitted, halve below the ladder's ``first`` size until one does."""
    b = first
    while not any(t.ok for t in walk.trials):
        if b <= 1:
            raise NoBatchSizeFits(walk.trials, walk.memory_budget_bytes, walk.config.memory_budget)
        walk.failed_at = b
        b = max(1, b // 2)
        walk.search.run(b)


def _refine(walk: _Walk, allowed: Callable[[int], bool] | None) -> None:
    """Bisect up to ``refine_steps`` times between the current choice and :func:`_refine_target`'s size."""
    cfg = walk.config
    for _ in range(cfg.refine_steps):
        if len(walk.trials) >= cfg.max_trials or walk.search.time_left() <= 0:
            return
        mid = _refine_target(walk)
        if mid is None or mid in walk.measured or (allowed is not None and not allowed(mid)) or mid <= 0:
            return
        t = walk.search.run(mid)
        if not t.ok:
            walk.failed_at = mid
        elif cfg.mode == "max_fit" and walk.failed_at is not None and walk.failed_at - mid <= max(1, mid // 16):
            return


def _refine_target(walk: _Walk) -> int | None:
    """The next size to measure: halfway to the size that failed (``max_fit``), else halfway to the faster measured
    neighbour of the current choice; ``None`` when there is none."""
    good = walk.good()
    if walk.config.mode == "max_fit":
        return None if walk.failed_at is None else _round((good[-1] + walk.failed_at) // 2)
    chosen = walk.search.point_choice(good)
    sizes = sorted(walk.measured)
    idx = sizes.index(chosen)
    neighbours = [walk.measured[sizes[j]] for j in (idx - 1, idx + 1) if 0 <= j < len(sizes)]
    side = max((n for n in neighbours if n.ok), key=lambda n: walk.search.rate(n.batch_size), default=None)
    return None if side is None else _round((chosen + side.batch_size) // 2)


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
