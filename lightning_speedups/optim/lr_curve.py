"""Reading a learning rate off an LR range-test curve: the rules, and the result record the finder returns.

Pure python on two lists (no Trainer): ``lr_finder.py`` runs the test through Lightning and hands the curve here;
``plots.py`` draws an :class:`LRFinderResult` without importing this module (it only reads its fields).

Rules (all return a learning rate inside the searched range):

- ``steep``: the steepest descent of the loss per decade of lr (Lightning's ``_LRFinder.suggestion`` on log(lr)).
- ``valley``: the longest stretch where the loss keeps falling; a point two thirds of the way down it (fastai's
  default, robust to a noisy start).
- ``minimum``: a tenth of the learning rate at the loss minimum (the classic rule of thumb).
- ``slide``: walk a window back from the divergence until the slope of log(loss) at both ends agrees (within 0.05
  per e-fold of lr), take its left end (after fastai's ``slide``; slopes smoothed over a few points).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from lightning_speedups._compat import lr_finder_suggestion
from lightning_speedups._errors import SpeedupRuntimeError, check_choice

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["LR_RULES", "LRFinderResult", "range_test_stop", "suggest_from_curve"]


def _finite(lrs: Sequence[float], losses: Sequence[float]) -> tuple[list[float], list[float]]:
    pairs = [(float(a), float(b)) for a, b in zip(lrs, losses) if math.isfinite(a) and math.isfinite(b) and a > 0]
    if len(pairs) < 3:
        raise SpeedupRuntimeError(
            f"The LR range test produced {len(pairs)} usable points; the rules need at least 3. "
            "HINT: raise `num_training_steps`, or lower `min_lr` if the loss diverged at once."
        )
    return [p[0] for p in pairs], [p[1] for p in pairs]


def _steep(lrs: list[float], losses: list[float]) -> float:
    # Lightning's rule, fed log(lr): the slope per decade, as fastai does. Against linear lr the tiny spacing at
    # the start of an exponential sweep turns noise into the "steepest" point.
    skip_begin = min(10, len(lrs) // 5)  # Lightning skips 10 points; fewer on short tests
    log_lr = lr_finder_suggestion([math.log(x) for x in lrs], losses, skip_begin=skip_begin, skip_end=1)
    return lrs[0] if log_lr is None else math.exp(log_lr)


def _valley(lrs: list[float], losses: list[float]) -> float:
    # longest strictly decreasing subsequence of the loss, O(n^2) dynamic programming (n is ~100)
    n = len(losses)
    length = [1] * n
    start = list(range(n))
    best_end = 0
    for i in range(1, n):
        for j in range(i):
            if losses[i] < losses[j] and length[j] + 1 > length[i]:
                length[i] = length[j] + 1
                start[i] = start[j]
        if length[i] > length[best_end]:
            best_end = i
    lo = start[best_end]
    hi = best_end
    return lrs[lo + (hi - lo) * 2 // 3]


def _minimum(lrs: list[float], losses: list[float]) -> float:
    i = min(range(len(losses)), key=losses.__getitem__)
    return max(lrs[0], lrs[i] / 10)


def _slide(lrs: list[float], losses: list[float], window: int = 15, threshold: float = 0.05) -> float:
    # slope of log(loss) per e-fold of lr, over +-h points so single noisy steps do not dominate
    log_loss = [math.log(max(x, 1e-12)) for x in losses]
    log_lr = [math.log(x) for x in lrs]
    n = len(lrs)
    h = max(1, n // 20)
    slope = []
    for i in range(n):
        a = max(0, i - h)
        b = min(n - 1, i + h)
        slope.append((log_loss[b] - log_loss[a]) / ((log_lr[b] - log_lr[a]) or 1e-12))
    window = min(window, max(1, n // 4))
    right = n - 1
    left = n - 1 - window
    chosen = lrs[max(left, 0)]
    # slide left from the divergence until the slopes at both ends of the window agree: its left end is on the
    # straight part of the descent
    while left >= 0 and abs(slope[right] - slope[left]) > threshold:
        chosen = lrs[left]
        right = right - 1
        left = left - 1
    return chosen


LR_RULES: dict[str, Callable[[list[float], list[float]], float]] = {
    "steep": _steep,
    "valley": _valley,
    "minimum": _minimum,
    "slide": _slide,
}


def suggest_from_curve(lrs: Sequence[float], losses: Sequence[float], rule: str = "valley") -> float:
    """Read a learning rate off an LR range-test curve with one of :data:`LR_RULES`.

    Non-finite points are dropped; the result always lies within ``[lrs[0], lrs[-1]]``.

    Example::

        >>> lrs = [10 ** (-6 + k / 10) for k in range(61)]
        >>> losses = [2.3 - 0.02 * k if k < 45 else 1.4 + 0.3 * (k - 45) for k in range(61)]
        >>> round(math.log10(suggest_from_curve(lrs, losses, "valley")), 1)
        -3.0
    """
    check_choice("rule", rule, LR_RULES)
    lr_list, loss_list = _finite(lrs, losses)
    lr = LR_RULES[rule](lr_list, loss_list)
    return float(min(max(lr, lr_list[0]), lr_list[-1]))


def range_test_stop(losses: Sequence[float], planned_steps: int, early_stop_threshold: float | None) -> str | None:
    """Why a range test with ``len(losses)`` of ``planned_steps`` points stopped early (``None``: it did not).

    ``losses`` are the smoothed losses the test compared (Lightning's): it stops once one exceeds
    ``early_stop_threshold`` x the best before it. A shorter curve without that is a fit loop that ended first.
    """
    if len(losses) >= planned_steps:
        return None
    finite = [float(x) for x in losses[:-1] if math.isfinite(x)]
    if early_stop_threshold is not None and finite and losses and losses[-1] > early_stop_threshold * min(finite):
        return (
            f"the loss diverged: {float(losses[-1]):.4g} exceeded `early_stop_threshold`={early_stop_threshold:g}"
            f" x the best loss {min(finite):.4g}"
        )
    return "the fit loop ended before the planned steps (the training data or a Trainer limit ran out)"


@dataclass
class LRFinderResult:
    """The range test's curve, every rule's suggestion, the chosen learning rate, and how much of the range was run.

    ``planned_steps`` is the test's ``num_training_steps``; ``steps_run`` the points it recorded; ``lr_covered`` the
    lowest and highest learning rate tried; ``stop_reason`` says why it stopped before ``planned_steps`` (``None``: it
    covered the whole range), and the suggestion then comes from the part it covered.
    """

    lrs: list[float]
    losses: list[float]
    rule: str
    lr: float
    suggestions: dict[str, float] = field(default_factory=dict)
    planned_steps: int | None = None
    steps_run: int = 0
    lr_covered: tuple[float, float] = (math.nan, math.nan)
    stop_reason: str | None = None

    @classmethod
    def from_curve(
        cls,
        lrs: Sequence[float],
        losses: Sequence[float],
        rule: str,
        planned_steps: int | None = None,
        stop_reason: str | None = None,
    ) -> LRFinderResult:
        """Evaluate every rule on the curve and pick ``rule``'s suggestion (``planned_steps``, ``stop_reason``: how
        much of the test ran and why it stopped early, see :func:`range_test_stop`)."""
        suggestions = {name: suggest_from_curve(lrs, losses, name) for name in LR_RULES}
        tried = [float(x) for x in lrs]
        return cls(
            tried,
            [float(x) for x in losses],
            rule,
            suggestions[rule],
            suggestions,
            planned_steps,
            len(tried),
            (min(tried), max(tried)) if tried else (math.nan, math.nan),
            stop_reason,
        )

    @property
    def stopped_early(self) -> bool:
        """Whether the test ran fewer steps than planned (see ``stop_reason``)."""
        return self.stop_reason is not None

    def coverage_text(self) -> str:
        """One line: the steps run of those planned, the learning rates covered, and why it stopped early."""
        planned = "?" if self.planned_steps is None else str(self.planned_steps)
        text = (
            f"the LR range test ran {self.steps_run} of {planned} steps, covering lr {self.lr_covered[0]:.3g} to "
            f"{self.lr_covered[1]:.3g}"
        )
        return text + (f": stopped early, {self.stop_reason}" if self.stop_reason else "")

    def plot(self, path: str | os.PathLike[str] | None = None, ax: Any = None) -> Figure:
        """Loss against lr (log scale) with each rule's suggestion marked; saves a PNG when ``path`` is given."""
        from lightning_speedups.optim.plots import plot_lr_finder

        return plot_lr_finder(self, path=path, ax=ax)
