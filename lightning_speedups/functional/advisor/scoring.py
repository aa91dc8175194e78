"""How the advisor's rules grade and word what they found: severity from score, evidence numbers, measured ratios.

Shared by every rule in :mod:`~lightning_speedups.functional.advisor.rules`, so a finding reads the same whichever
rule made it.
"""

from __future__ import annotations

from lightning_speedups.measure import describe_ratio, ratio_evidence

__all__ = ["measurement_evidence", "ratio_note", "rounded", "severity_for", "to_ms"]


def severity_for(score: float) -> str:
    """``"high"`` from a quarter of the step, ``"medium"`` from 8%, ``"low"`` above 0, else ``"info"``."""
    return "high" if score >= 0.25 else "medium" if score >= 0.08 else "low" if score > 0.0 else "info"


def measurement_evidence(ratio: float | None) -> dict:
    """``{"measurement": median ratio, interval, rounds}`` of a measured ratio (nothing for a plain number)."""
    ev = ratio_evidence(ratio)
    return {"measurement": ev} if ev else {}


def ratio_note(ratio: float | None) -> str:
    """`` (median ..., interval ... over N rounds)`` to append to an expected effect; ``""`` for a plain number."""
    text = describe_ratio(ratio)
    return f" ({text})" if text else ""


def rounded(x: float | None, nd: int = 4) -> float | None:
    """``x`` rounded to ``nd`` digits for the evidence dict (``None`` stays ``None``)."""
    return None if x is None else round(float(x), nd)


def to_ms(x: float | None) -> float | None:
    """Seconds as milliseconds, rounded to the microsecond (``None`` stays ``None``)."""
    return None if x is None else round(1e3 * x, 3)
