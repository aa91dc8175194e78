"""The advisor's report: the measurements' summary and the ranked findings, rendered as text, a dict or JSON.

Kept apart from the rules (:mod:`~lightning_speedups.functional.advisor.rules`) that produce the findings; re-exported
by :mod:`lightning_speedups.functional.advisor`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lightning_speedups.functional.advisor.records import Finding

__all__ = ["AdvisorReport"]


@dataclass
class AdvisorReport:
    """Measurements summary + ranked findings; renders as text, dict or JSON."""

    summary: dict[str, Any]
    findings: list[Finding]
    notes: list[str] = field(default_factory=list)
    applied: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "summary": dict(self.summary),
            "findings": [f.to_dict() for f in self.findings],
            "notes": list(self.notes),
            "applied": list(self.applied),
        }

    def to_json(self, path: str | Path | None = None) -> str:
        """The report as JSON; also written to ``path`` when given."""
        text = json.dumps(self.to_dict(), indent=2, default=str)
        if path is not None:
            Path(path).write_text(text)
        return text

    def to_text(self) -> str:
        s = self.summary
        head = f"{s.get('timed_batches')} timed batches, {s.get('device')}, {s.get('precision')}"
        lines = [f"SpeedAdvisor report ({head})"]
        if s.get("step_s") is not None:
            lines.append(
                f"  step {1e3 * s['step_s']:.1f} ms = compute {1e3 * s['compute_s']:.1f} ms + between steps "
                f"{1e3 * (s.get('data_wait_s') or 0):.1f} ms ({s['data_wait_share']:.0%} waiting for data)"
                + (f" | {s['samples_per_s']:.0f} samples/s, batch {s['batch_size']}" if s.get("samples_per_s") else "")
            )
        if s.get("flops_per_batch"):
            lines.append(
                f"  {s['flops_per_batch'] / 1e9:.3f} GFLOP per batch (fwd+bwd) -> "
                f"{(s.get('achieved_flops') or 0) / 1e9:.1f} GFLOP/s in the step; " + _utilisation_text(s)
            )
        if s.get("pad_fraction") is not None:
            lines.append(f"  padding: {s['pad_fraction']:.0%} of the token positions in the timed batches")
        if s.get("peak_memory_bytes"):
            head = s.get("memory_headroom")
            kind = "GPU allocated" if s.get("memory_kind") == "cuda" else "process RSS"
            lines.append(
                f"  peak memory {s['peak_memory_bytes'] / 2**20:.0f} MiB ({kind})"
                + (f", {head:.0%} headroom" if head is not None else "")
            )
        if not self.findings:
            lines.append("  no findings: nothing obvious to speed up")
        for i, f in enumerate(self.findings, 1):
            ev = ", ".join(f"{k}={v}" for k, v in f.evidence.items() if v is not None)
            lines += [
                f"  {i}. [{f.severity} {f.score:.2f}] {f.title}",
                f"       evidence: {ev}",
                f"       fix: {f.fix}",
                f"       expected: {f.expected}",
            ]
        lines += [f"  note: {n}" for n in self.notes]
        lines += [f"  applied: {a}" for a in self.applied]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.to_text()


def _utilisation_text(s: dict[str, Any]) -> str:
    """``<utilisation>% of the <peak source>`` (an estimated CPU peak says so), or why the peak is unknown."""
    util = s.get("utilisation")
    source = s.get("peak_flops_source") or ""
    if util is None:
        return f"device peak unknown ({source or 'not in the table'})"
    if s.get("peak_flops_estimated"):
        return f"{util:.1%} of the {source or 'estimated peak'}"
    return f"{util:.1%} of the device's {source or 'peak'}"
