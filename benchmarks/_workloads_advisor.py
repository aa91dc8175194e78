"""The workload suite's ``advisor_top`` method: what a user gets by applying the advisor's top finding.

:class:`~lightning_speedups.SpeedAdvisor` watches the start of the workload's planned run (its warm-up and timing
window, then the run is stopped), and the highest-ranked finding whose fix is one callback or one Trainer argument is
applied to a fresh run, as a user would copy it from the report. Findings whose fix is a code change (move the data to
the device, freeze modules) or a measurement first (``"Measure first: ..."``) are skipped, and the row's notes name
them. The advisor's own run is diagnosis, paid once, so it is in the notes and not in the time to target.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import lightning as L
from typing_extensions import override

from benchmarks.workloads import time_to_target
from benchmarks.workloads._registry import Workload
from lightning_speedups.callbacks.advisor import SpeedAdvisor
from lightning_speedups.callbacks.batch_size import ThroughputBatchSizeFinder
from lightning_speedups.callbacks.channels_last import ChannelsLast
from lightning_speedups.callbacks.compile import TorchCompile
from lightning_speedups.callbacks.sequence_batching import SequenceBatching
from lightning_speedups.callbacks.speed_flags import SpeedFlags

__all__ = ["FIXES", "advisor_findings", "fix_for"]

_Fix = Callable[[], tuple[list[L.Callback], dict[str, Any]]]


def _bf16() -> tuple[list[L.Callback], dict[str, Any]]:
    return [], {"precision": "bf16-mixed"}


# finding key -> the fix its text names, as callbacks and Trainer arguments
FIXES: dict[str, _Fix] = {
    "fp32_on_bf16_cpu": _bf16,
    "fp32_on_bf16_gpu": _bf16,
    "low_precision_on_slow_cpu": lambda: ([], {"precision": "32-true"}),
    "tf32_off": lambda: ([SpeedFlags(verbose=False)], {}),
    "channels_last": lambda: ([ChannelsLast()], {}),
    "small_batch": lambda: ([ThroughputBatchSizeFinder()], {}),
    "not_compiled": lambda: ([TorchCompile()], {}),
    "padding": lambda: ([SequenceBatching()], {}),
}


class _StopAfterReport(L.Callback):
    """Ends the fit once the advisor has its report: the rest of the run would only repeat the baseline."""

    def __init__(self, advisor: SpeedAdvisor) -> None:
        self.advisor = advisor

    @override
    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        if self.advisor.report is not None:
            trainer.should_stop = True


def advisor_findings(w: Workload, seed: int, small: bool, no_bf16: bool) -> tuple[list[dict[str, Any]], float]:
    """The advisor's ranked findings (as dicts) on the start of ``w``'s planned run, and the seconds it took."""
    advisor = SpeedAdvisor(verbose=False, probe_compile=True)
    start = time.perf_counter()
    # the run the user runs, validation included (the advisor counts the graphs a compile adds for it), stopped
    time_to_target(w, seed, callbacks=[advisor, _StopAfterReport(advisor)], small=small)
    seconds = time.perf_counter() - start
    findings = [] if advisor.report is None else [f.to_dict() for f in advisor.report.findings]
    if no_bf16:
        findings = [f for f in findings if FIXES.get(f["key"]) is not _bf16]
    return findings, seconds


def fix_for(findings: list[dict[str, Any]]) -> tuple[dict[str, Any] | None, list[str]]:
    """The highest-ranked finding with a fix of callbacks or Trainer arguments, and the keys ranked above it (their
    fixes are code changes). A "measure first" finding (compile not timed) has no fix to apply, and an ``info``
    finding (score 0: measured, no gain here, "skip it") is not one a user would apply: both are skipped too."""
    skipped = []
    for f in findings:
        actionable = f.get("severity") != "info" and float(f.get("score", 1.0)) > 0.0
        if f["key"] in FIXES and actionable and not str(f["fix"]).startswith("Measure first"):
            return f, skipped
        skipped.append(f["key"])
    return None, skipped
