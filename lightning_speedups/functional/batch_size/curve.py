"""A fitted step-cost curve for the batch-size search: per-sample time ``p(b) = alpha / b + gamma + delta * b``.

A training step costs a fixed part (kernel launches, Python, the optimizer step: ``alpha``), a part per sample
(``gamma``) and, once a batch outgrows the caches, a part that grows with the batch (``delta * b``). Per sample that
is the curve above: falling, flat, then rising again. Fitted by weighted least squares (relative errors, weights by
the number of timed steps) to every measured size at once, it pools the evidence of all sizes, so a decision near
the plateau does not rest on the one or two noisy trials of the two sizes it compares.

The fit is only used when it explains the measurements: its residuals must be consistent with the measured
per-step noise (chi-square per degree of freedom at most :data:`MAX_CHI2_PER_DOF`, at least two degrees of freedom),
and it keeps the fixed per-step cost (``CurveFit.decides``).
Bursty noise (other processes slowing whole trials) shows up as residuals far above the within-trial noise, and a
curve the model does not describe (a cache cliff) the same way; both leave the decision to the paired
re-measurements of :mod:`lightning_speedups.functional.batch_size.policy`.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

__all__ = [
    "CurveFit",
    "MAX_CHI2_PER_DOF",
    "epoch_factor",
    "fit_curve",
    "interpolate_per_sample",
    "next_doubling_gain",
]

MAX_CHI2_PER_DOF = 3.0  # a chi-square with 2 degrees of freedom exceeds 2 x 3.0 with probability e^-3 (5%)


def _basis(b: float) -> tuple[float, float, float]:
    return (1.0 / b, 1.0, float(b))


def _solve(a: list[list[float]], y: list[float]) -> list[float] | None:
    """Gaussian elimination with partial pivoting; ``None`` when singular."""
    n = len(y)
    m = [row[:] + [y[i]] for i, row in enumerate(a)]
    for col in range(n):
        piv = max(range(col, n), key=lambda r: abs(m[r][col]))
        if abs(m[piv][col]) < 1e-300:
            return None
        m[col], m[piv] = m[piv], m[col]
        for r in range(n):
            if r != col:
                f = m[r][col] / m[col][col]
                m[r] = [x - f * z for x, z in zip(m[r], m[col])]
    return [m[i][n] / m[i][i] for i in range(n)]


def _inverse(a: list[list[float]]) -> list[list[float]] | None:
    n = len(a)
    cols = [_solve(a, [1.0 if i == j else 0.0 for i in range(n)]) for j in range(n)]
    if any(c is None for c in cols):
        return None
    return [[cols[j][i] for j in range(n)] for i in range(n)]  # type: ignore[index]


@dataclass
class CurveFit:
    """The fitted curve, its covariance and whether it explains the data (``consistent``)."""

    coef: tuple[float, float, float]  # alpha, gamma, delta (0 where the constraint >= 0 dropped a term)
    active: tuple[int, ...]  # which terms were fitted
    cov: list[list[float]]  # covariance of the active terms, scaled by the larger noise estimate
    chi2_per_dof: float
    dof: int
    consistent: bool

    @property
    def decides(self) -> bool:
        """The fit may decide a verdict or the final choice: it explains the data (``consistent``) and keeps the
        fixed per-step cost ``alpha``. Every training step has one; a fit that dropped it is the noise talking (under
        heavy noise a per-sample constant fits anything), and its ratios between sizes are 1 with no error at all."""
        return self.consistent and 0 in self.active

    def per_sample(self, b: float) -> float:
        """Predicted seconds per sample at batch size ``b``."""
        return sum(c * x for c, x in zip(self.coef, _basis(b)))

    def log_ratio(self, a: float, b: float) -> tuple[float, float]:
        """``log(p(a) / p(b))`` (> 0: ``b`` is faster per sample) and its standard error."""
        pa = self.per_sample(a)
        pb = self.per_sample(b)
        xa = _basis(a)
        xb = _basis(b)
        g = [xa[k] / pa - xb[k] / pb for k in self.active]
        var = sum(g[i] * self.cov[i][j] * g[j] for i in range(len(g)) for j in range(len(g)))
        return math.log(pa / pb), math.sqrt(max(var, 0.0))


def fit_curve(samples: Mapping[int, Sequence[float]], step_noise: float | None) -> CurveFit | None:
    """Fit the curve to ``{batch size: per-sample step times}``; ``None`` with fewer than 4 sizes or no noise estimate.

    ``step_noise`` is the pooled within-trial standard deviation of log step times. Each size contributes its median
    per-sample time with relative variance ``step_noise**2 / steps`` (x pi/2 from three steps on: a median). Terms
    whose fitted coefficient would be negative are dropped (every subset with the constant term is tried; the lowest
    weighted residual wins).
    """
    sizes = sorted(b for b, xs in samples.items() if xs)
    if step_noise is None or step_noise <= 0 or len(sizes) < 4:
        return None
    y = {b: float(statistics.median(samples[b])) for b in sizes}
    # relative errors: var(y) ~ (noise * y)^2 / steps for a mean of up to 2 steps, pi/2 times that for a median
    w = {b: len(samples[b]) / (y[b] ** 2 * (1.0 if len(samples[b]) <= 2 else math.pi / 2)) for b in sizes}
    best: tuple[float, tuple[int, ...], list[float], list[list[float]]] | None = None
    for k in (3, 2, 1):
        for active in itertools.combinations(range(3), k):
            if 1 not in active:
                continue  # the per-sample cost is always there
            xtwx = [[sum(w[b] * _basis(b)[i] * _basis(b)[j] for b in sizes) for j in active] for i in active]
            xtwy = [sum(w[b] * _basis(b)[i] * y[b] for b in sizes) for i in active]
            theta = _solve(xtwx, xtwy)
            if theta is None or min(theta) < 0:
                continue
            sse = sum(w[b] * (y[b] - sum(t * _basis(b)[i] for t, i in zip(theta, active))) ** 2 for b in sizes)
            if best is None or sse < best[0] - 1e-15:
                best = (sse, active, theta, xtwx)
    if best is None:
        return None
    sse, active, theta, xtwx = best
    dof = len(sizes) - len(active)
    chi2 = sse / step_noise**2 / max(dof, 1)
    inv = _inverse(xtwx)
    if inv is None:
        return None
    scale = max(step_noise**2, sse / max(dof, 1))  # the larger of the two noise estimates
    coef = [0.0, 0.0, 0.0]
    for t, i in zip(theta, active):
        coef[i] = t
    return CurveFit(
        coef=(coef[0], coef[1], coef[2]),
        active=active,
        cov=[[scale * v for v in row] for row in inv],
        chi2_per_dof=chi2,
        dof=dof,
        consistent=dof >= 2 and chi2 <= MAX_CHI2_PER_DOF,
    )


def interpolate_per_sample(per_sample: Mapping[int, float], b: int) -> float:
    """Per-sample time at size ``b`` from measured ones, linear in ``1 / b`` between the two measured neighbours
    (exact for ``alpha / b + gamma``); below the smallest size, extrapolated from the two smallest (never cheaper than
    the smallest); above the largest, the largest's. ``nan`` without measurements."""
    sizes = sorted(s for s, p in per_sample.items() if math.isfinite(p) and p > 0)
    if not sizes:
        return math.nan
    if b in sizes:
        return per_sample[b]
    if b >= sizes[-1] or len(sizes) == 1:  # above the largest, or one size only: its value
        return per_sample[sizes[-1]]
    lo, hi = (sizes[0], sizes[1]) if b < sizes[0] else next((x, y) for x, y in zip(sizes, sizes[1:]) if x <= b <= y)
    w = (1.0 / b - 1.0 / hi) / (1.0 / lo - 1.0 / hi)
    value = per_sample[hi] + w * (per_sample[lo] - per_sample[hi])
    return max(value, per_sample[sizes[0]]) if b < sizes[0] else value


def epoch_factor(epoch_samples: int | None, b: int, per_sample: Callable[[int], float]) -> float:
    """Per-sample cost of a whole epoch at batch ``b`` over that of full batches: without ``drop_last`` an epoch of
    ``n`` samples ends with a partial batch of ``n % b`` samples, which runs at its own, higher per-sample cost
    ``per_sample(n % b)``. 1.0 when the epoch length is unknown or divisible by ``b``. A size whose full steps are
    as fast as a larger one's can still lose per epoch (see docs/evidence.md, section 'Batch-size finder').
    """
    n = epoch_samples
    if not n or b >= n or n % b == 0:
        return 1.0
    r = n % b
    full = per_sample(b)
    part = per_sample(r)
    if not (math.isfinite(full) and math.isfinite(part)) or full <= 0:
        return 1.0
    return ((n - r) * full + r * part) / (n * full)


def next_doubling_gain(gain: float) -> float:
    """The samples/s ratio of the next doubling predicted from this doubling's ``gain`` by the fixed plus per-sample
    step cost (``alpha / b + gamma`` per sample; ``delta = 0``, the most gain the model allows).

    A doubling from ``b`` gains ``(u + 1) / (u / 2 + 1)`` with ``u = alpha / (b * gamma)``, and ``u`` halves with every
    doubling, so each gain is a bit more than half the one before. A gain of 2 or more (samples/s doubled or better)
    is more than a fixed per-step cost can explain: ``inf``. No gain (``gain <= 1``): 1.0.

    Example::

        >>> round(next_doubling_gain(1.09), 3), next_doubling_gain(0.95), next_doubling_gain(2.5)
        (1.047, 1.0, inf)
    """
    if gain >= 2.0:
        return math.inf
    if gain <= 1.0:
        return 1.0
    u = 2.0 * (gain - 1.0) / (2.0 - gain)
    return (u / 2.0 + 1.0) / (u / 4.0 + 1.0)
