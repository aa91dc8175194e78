"""Speed advisor, pure part: turn measured training-step numbers into a ranked list of findings with fixes.

Nothing here touches a Trainer. :func:`diagnose` reads a :class:`Measurements` record (filled by the ``SpeedAdvisor``
callback, or by hand / with mocked timings in tests), runs the ordered rules and returns :class:`Finding` objects
ranked by ``score`` = the estimated share of step time the fix would save (Amdahl-style, 0..1).

The parts, from the bottom:

- :mod:`~lightning_speedups.functional.advisor.records`: what was measured, the thresholds, the findings;
- :mod:`~lightning_speedups.functional.advisor.scoring`: how a rule grades and words what it found;
- :mod:`~lightning_speedups.functional.advisor.rules`: one small function per finding, registered in :data:`RULES`;
- :mod:`~lightning_speedups.functional.advisor.probes`: micro-measurements on copies that give a finding a measured
  expected effect (bf16, channels_last, fused optimizer step, fewer CPU threads);
- :mod:`~lightning_speedups.functional.advisor.report`: the report, as text, dict or JSON.
"""

from __future__ import annotations

from lightning_speedups.functional.advisor.probes import (
    bf16_autocast_speedup,
    channels_last_speedup,
    fewer_threads_speedup,
    fused_optimizer_speedup,
)
from lightning_speedups.functional.advisor.records import (
    SEVERITIES,
    AdvisorThresholds,
    Finding,
    Measurements,
    OptimizerMeasurement,
)
from lightning_speedups.functional.advisor.report import AdvisorReport
from lightning_speedups.functional.advisor.rules import RULES, Rule, advisor_rule
from lightning_speedups.measure import MeasuredRatio  # noqa: F401  (importable here before the split)

# the name this record had before it was told apart from the optimizer registry's `optim.OptimizerInfo`
OptimizerInfo = OptimizerMeasurement

__all__ = [
    "AdvisorReport",
    "AdvisorThresholds",
    "Finding",
    "Measurements",
    "OptimizerMeasurement",
    "RULES",
    "Rule",
    "advisor_rule",
    "bf16_autocast_speedup",
    "channels_last_speedup",
    "diagnose",
    "fewer_threads_speedup",
    "fused_optimizer_speedup",
]


def diagnose(m: Measurements, thresholds: AdvisorThresholds | None = None) -> list[Finding]:
    """Rank what slows this training run down, from measurements alone.

    Args:
        m: the window's measurements.
        thresholds: when a number becomes a finding (defaults: :class:`AdvisorThresholds`).

    Returns:
        Findings sorted by ``score`` (highest first); a tie keeps the order of :data:`RULES`.

    Example::

        >>> m = Measurements(batch_size=32, compute_times=[0.01] * 5, data_waits=[0.03] * 5,
        ...                  loader_kind="DataLoader", num_workers=0)
        >>> [f.key for f in diagnose(m)][:1]
        ['data_bound']
    """
    th = thresholds or AdvisorThresholds()
    out: list[Finding] = []
    for rule in RULES:
        found = rule(m, th)
        if found is not None:
            out.extend(found if isinstance(found, list) else [found])
    out.sort(key=lambda f: (-f.score, SEVERITIES.index(f.severity)))
    return out
