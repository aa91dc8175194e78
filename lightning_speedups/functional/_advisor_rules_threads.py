"""The advisor's CPU-thread rule: fewer intra-op threads are faster (the cores are shared, or the ops are too small).

Kept beside :mod:`lightning_speedups.functional._advisor_rules` (same registry, registered after its rules). The
evidence is a measurement on a copy of the model (``fewer_threads_speedup``): forward+backward at torch's thread
count against half of it, interleaved. On a quiet machine fewer threads are slower and the rule stays silent.
"""

from __future__ import annotations

from lightning_speedups.functional._advisor_records import AdvisorThresholds, Finding, Measurements
from lightning_speedups.functional._advisor_rules import _measurement, _r, _severity, _why, advisor_rule

__all__ = ["cpu_threads_contended"]


@advisor_rule
def cpu_threads_contended(m: Measurements, th: AdvisorThresholds) -> Finding | None:
    """Fewer CPU threads measured faster than torch's current count: another process shares the cores, or each op is
    too small to be worth splitting."""
    s, fewer = m.fewer_threads_speedup, m.fewer_threads
    if m.device_type != "cpu" or s is None or fewer is None or s <= 1.05:
        return None
    score = max(0.0, m.compute_share * (1.0 - 1.0 / s))
    return Finding(
        "cpu_threads",
        f"torch uses {m.torch_threads} CPU threads, but {fewer} ran faster: its threads wait on each other (another "
        "process competes for the cores, or the ops are too small to split)",
        _severity(score),
        score,
        {"torch_threads": m.torch_threads, "fewer_threads": fewer, "fewer_threads_speedup": _r(s, 3),
         **_measurement(s)},
        f"`torch.set_num_threads({fewer})` while the other work runs (or stop it); `SpeedAdvisor(apply=True)` sets "
        "it mid-run. Timing-based choices made under this contention (batch size, layout) are noisier too.",
        f"{s:.2f}x faster forward+backward with {fewer} thread(s), measured on a copy of the model" + _why(s),
        measured=True,
    )
