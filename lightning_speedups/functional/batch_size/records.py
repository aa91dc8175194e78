"""The batch-size search's records: one measured size (:class:`BatchSizeTrial`) and the search's outcome
(:class:`BatchSizeSearchResult`). Plain dataclasses, re-exported by :mod:`lightning_speedups.functional.batch_size`.

On token sequences a trial also carries real (non-pad) tokens: the search then ranks sizes by tokens/s, since with
dynamic padding a larger batch pads to a longer sample and samples/s no longer measures the work done. The functions
at the bottom read a trial the way the noise rules of :mod:`lightning_speedups.functional.batch_size.policy` do.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["BatchSizeSearchResult", "BatchSizeTrial", "per_sample_time", "trial_cost", "unit_step_times"]


@dataclass
class BatchSizeTrial:
    """One measured batch size: samples/s (of its fastest timed step), peak memory in bytes, and what happened.

    ``step_times`` are the timed steps (seconds) the noise-aware rules decide on; ``elapsed_s`` is the whole trial's
    wall time (loader, warm-up and steps), what the time budgets count. On token sequences ``tokens_per_s`` (real,
    non-pad tokens/s of the fastest timed step) and ``step_tokens`` (real tokens of each timed step) are set too,
    and the search ranks by tokens (:attr:`rate`, :attr:`unit`).
    """

    batch_size: int
    samples_per_s: float = 0.0
    peak_memory: int = 0
    status: str = "ok"  # "ok" | "oom" | "over_budget"
    step_times: list[float] = field(default_factory=list)
    elapsed_s: float = 0.0
    tokens_per_s: float | None = None
    step_tokens: list[int] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def unit(self) -> str:
        """``"tokens"`` when the trial counted real tokens, else ``"samples"``."""
        return "samples" if self.tokens_per_s is None else "tokens"

    @property
    def rate(self) -> float:
        """The rate the search ranks, tokens/s on token sequences, else samples/s."""
        return self.samples_per_s if self.tokens_per_s is None else self.tokens_per_s


@dataclass
class BatchSizeSearchResult:
    """What the search chose and why: ``chosen``, the ``trials`` table, ``stop_reason`` and the time it took.

    The evidence: ``decisions`` (each noisy stop-or-go verdict of the ladder: sizes, median ratio, interval, rounds),
    ``final`` (the interleaved re-measurement of the fastest sizes: median samples/s, spread, ratios with intervals,
    rounds, whether they separated), ``remeasured`` (those extra trials), a ``note`` and ``trusted`` (``False``
    when too few rounds fitted, so the smaller size was kept with a warning). On token sequences (:attr:`unit` is
    ``"tokens"``) the rates of ``final`` and of the table are real (non-pad) tokens/s. What the learning rates got
    for the chosen size: ``lr_factor`` (of the first optimizer) and ``lr_note`` (each optimizer's rule and factor),
    filled by the callback that applies the choice.
    """

    chosen: int
    mode: str
    trials: list[BatchSizeTrial]
    stop_reason: str
    search_time_s: float = 0.0
    base_batch_size: int | None = None
    memory_budget_bytes: int | None = None
    lr_factor: float = 1.0
    lr_note: str = ""
    config_lr: float | None = None
    accumulate_grad_batches: int | None = None
    epoch: int = 0
    decisions: list[dict[str, Any]] = field(default_factory=list)
    final: dict[str, Any] = field(default_factory=dict)
    remeasured: list[BatchSizeTrial] = field(default_factory=list)
    note: str = ""
    trusted: bool = True

    def trial(self, batch_size: int) -> BatchSizeTrial | None:
        """The (last) trial of one batch size, if it was measured."""
        found = [t for t in self.trials if t.batch_size == batch_size]
        return found[-1] if found else None

    @property
    def unit(self) -> str:
        """What the rates count, ``"tokens"`` (real, non-pad) on token sequences, else ``"samples"``."""
        return "tokens" if any(t.unit == "tokens" for t in self.trials) else "samples"

    def table(self) -> str:
        """The trial table as aligned text, chosen size marked with ``*``."""
        unit = f"{self.unit}/s"
        lines = [f"{'batch':>7} {unit:>11} {'peak MiB':>9}  status", "-" * 38]
        for t in sorted(self.trials, key=lambda t: t.batch_size):
            mark = "*" if t.batch_size == self.chosen else " "
            lines.append(f"{t.batch_size:>6}{mark} {t.rate:>11.1f} {t.peak_memory / 2**20:>9.1f}  {t.status}")
        lines.append(f"chosen {self.chosen} ({self.mode}); stopped: {self.stop_reason}; {self.search_time_s:.2f} s")
        if self.lr_note:
            lines.append(self.lr_note)
        if self.unit == "tokens":
            lines.append("measured in real (non-pad) tokens/s: the batches hold token sequences")
        if self.final:
            medians = ", ".join(f"{b}: {r:.1f}" for b, r in self.final["median_samples_per_s"].items())
            if self.final.get("by") == "curve fit":
                lines.append(
                    f"no re-measurement: the fitted step-cost curve ranked the sizes (predicted {unit} {medians})"
                )
            else:
                lines.append(
                    f"re-measured {self.final['rounds']} interleaved rounds (median {unit} {medians}; "
                    f"{'separated' if self.final['separated'] else 'within noise'})"
                )
        if self.note:
            lines.append(self.note)
        return "\n".join(lines)

    def as_dict(self) -> dict[str, Any]:
        """Plain python (checkpoint-safe, ``weights_only=True`` loadable)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BatchSizeSearchResult:
        data = dict(data)
        data["trials"] = [BatchSizeTrial(**t) for t in data.get("trials", [])]
        data["remeasured"] = [BatchSizeTrial(**t) for t in data.get("remeasured", [])]
        return cls(**data)


def unit_step_times(trial: BatchSizeTrial) -> list[float]:
    """Each timed step's seconds per real token (when the trial counted ``step_tokens``), else per sample."""
    tokens = getattr(trial, "step_tokens", None)
    if tokens and len(tokens) == len(trial.step_times):
        return [x / max(n, 1) for x, n in zip(trial.step_times, tokens)]
    return [x / trial.batch_size for x in trial.step_times]


def per_sample_time(trial: BatchSizeTrial) -> float:
    """Seconds per sample of one trial: the median timed step / the batch size (``1 / samples_per_s`` without steps).
    On token sequences (``step_tokens``) seconds per real token instead: the median of each step's time / tokens.

    The median, not the fastest step: sizes get different numbers of steps (large ones often one), and the fastest of
    three steps is faster than one step by noise alone, which biased the old rule toward small sizes.
    """
    if not trial.ok:
        return math.inf
    if trial.step_times and getattr(trial, "step_tokens", None):
        return float(statistics.median(unit_step_times(trial)))
    if trial.step_times:
        return float(statistics.median(trial.step_times)) / trial.batch_size
    rate = getattr(trial, "rate", trial.samples_per_s)
    return 1.0 / rate if rate > 0 else math.inf


def trial_cost(trial: BatchSizeTrial) -> float:
    """Wall seconds a trial took (its ``elapsed_s``, else the sum of its steps): what ``search_time`` counts."""
    return float(trial.elapsed_s or sum(trial.step_times))
