"""The advisor's records: what was measured (:class:`Measurements`, with one :class:`OptimizerMeasurement` per
optimizer), when it matters (:class:`AdvisorThresholds`), and what was found (:class:`Finding`).

Plain dataclasses at the bottom of the advisor: the rules, the probes, the report and the callback all import them
from here, re-exported by :mod:`lightning_speedups.functional.advisor`.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from lightning_speedups._errors import check_int, check_range

__all__ = ["SEVERITIES", "AdvisorThresholds", "Finding", "Measurements", "OptimizerMeasurement"]

SEVERITIES = ("high", "medium", "low", "info")


@dataclass
class AdvisorThresholds:
    """When a measurement becomes a finding.

    Args:
        data_wait: share of step time spent outside the training step (waiting for data) that makes a run data-bound.
        data_wait_note: smaller share still worth a low-severity note when the loader has ``num_workers=0``.
        small_batch: batch sizes below this count as small.
        low_utilisation: achieved / peak FLOP/s below this counts as an under-used device (where the peak is known;
            on CPUs against an estimated peak).
        memory_pressure: peak memory above this fraction of the device's total is flagged.
        optimizer_share: optimizer-step share of compute above which a non-fused optimizer is flagged.
        pad_fraction: share of padding in the training batches' token positions above which padding is flagged.
    """

    data_wait: float = 0.2
    data_wait_note: float = 0.05
    small_batch: int = 64
    low_utilisation: float = 0.3
    memory_pressure: float = 0.9
    optimizer_share: float = 0.05
    pad_fraction: float = 0.2

    def __post_init__(self) -> None:
        for name in (
            "data_wait",
            "data_wait_note",
            "low_utilisation",
            "memory_pressure",
            "optimizer_share",
            "pad_fraction",
        ):
            check_range(name, getattr(self, name), 0.0, 1.0)
        check_range(
            "data_wait_note",
            self.data_wait_note,
            0.0,
            self.data_wait,
            hint=f"`data_wait_note` must not exceed `data_wait`={self.data_wait!r}.",
        )
        check_int("small_batch", self.small_batch, 1)


@dataclass
class OptimizerMeasurement:
    """What the advisor read off one optimizer of the run: its class, fused/foreach flags and a measured fused speedup.

    Not the optimizer registry's record (:class:`lightning_speedups.optim.OptimizerInfo`, which says how to build one).
    """

    name: str
    fused: bool | None = None
    foreach: bool | None = None
    fused_supported: bool = False
    fused_speedup: float | None = None


@dataclass
class Measurements:
    """Everything measured over the advisor's window; lists hold one value per timed batch (seconds).

    ``compute_times`` span ``on_train_batch_start`` -> ``on_train_batch_end`` (forward, backward, optimizer step);
    ``data_waits`` span the previous ``on_train_batch_end`` -> this ``on_train_batch_start`` (fetching and collating
    the batch, moving it to the device, loop overhead). Optional numbers are ``None`` when unknown. ``peak_flops``
    is a datasheet peak on GPUs and an estimate on CPUs (``peak_flops_estimated``); ``peak_flops_source`` says where
    it comes from, or why it is unknown. ``tokens`` / ``padded_tokens`` sum the real and all token positions of the
    timed batches (both 0 when the batches hold no token sequences). ``planned_steps`` is the run's planned training
    batches (``None`` when unbounded or unknown); ``compile_s`` / ``compile_speedup`` / ``compile_eager_s`` are the
    compile probe's compile seconds, eager / compiled step-time ratio and eager step on the copy (``None`` when not
    measured, and ``compile_note`` says why). ``compile_graphs`` names the graphs a compiled run compiles (the
    training step's, the validation forward's, one per further batch shape), each priced at the measured compile.
    """

    device_type: str = "cpu"
    device_name: str = ""
    precision: str = "32-true"
    batch_size: int | None = None
    compute_times: list[float] = field(default_factory=list)
    data_waits: list[float] = field(default_factory=list)
    forward_times: list[float] = field(default_factory=list)
    backward_times: list[float] = field(default_factory=list)
    optimizer_times: list[float] = field(default_factory=list)
    flops_per_batch: int | None = None
    peak_flops: float | None = None
    peak_flops_estimated: bool = False
    peak_flops_source: str = ""
    peak_memory_bytes: int | None = None
    memory_total_bytes: int | None = None
    memory_available_bytes: int | None = None
    memory_kind: str = "cpu_rss"
    cpu_bf16_fast: bool | None = None
    bf16_speedup: float | None = None
    cuda_bf16_supported: bool | None = None
    tf32_off: bool = False
    has_conv: bool = False
    conv_channels_last: bool = False
    channels_last_speedup: float | None = None
    torch_threads: int | None = None
    fewer_threads: int | None = None
    fewer_threads_speedup: float | None = None
    loader_kind: str | None = None
    num_workers: int | None = None
    optimizers: list[OptimizerMeasurement] = field(default_factory=list)
    frozen_updated: list[str] = field(default_factory=list)
    never_grad: list[str] = field(default_factory=list)
    trainable_params: int = 0
    compiled: bool = False
    callbacks: list[str] = field(default_factory=list)
    tokens: int = 0
    padded_tokens: int = 0
    planned_steps: int | None = None
    compile_s: float | None = None
    compile_speedup: float | None = None
    compile_eager_s: float | None = None
    compile_note: str = ""
    compile_graphs: list[str] = field(default_factory=lambda: ["training"])

    # ---- derived numbers -------------------------------------------------------------------------------------
    @staticmethod
    def _mean(values: Sequence[float]) -> float | None:
        return float(statistics.fmean(values)) if values else None

    @property
    def compute_s(self) -> float | None:
        """Mean time inside the training step (s)."""
        return self._mean(self.compute_times)

    @property
    def data_wait_s(self) -> float | None:
        """Mean time between steps (s)."""
        return self._mean(self.data_waits)

    @property
    def step_s(self) -> float | None:
        """Mean wall time per batch = compute + wait (s)."""
        c = self.compute_s
        w = self.data_wait_s
        return None if c is None else c + (w or 0.0)

    @property
    def data_wait_share(self) -> float:
        """Share of wall time per batch spent outside the training step."""
        c = self.compute_s
        w = self.data_wait_s
        if c is None or w is None or c + w <= 0:
            return 0.0
        return w / (c + w)

    @property
    def compute_share(self) -> float:
        return 1.0 - self.data_wait_share

    @property
    def optimizer_share(self) -> float | None:
        """Share of compute spent in the optimizer step."""
        o = self._mean(self.optimizer_times)
        c = self.compute_s
        return None if o is None or not c else min(1.0, o / c)

    @property
    def samples_per_s(self) -> float | None:
        s = self.step_s
        return None if not s or self.batch_size is None else self.batch_size / s

    @property
    def achieved_flops(self) -> float | None:
        c = self.compute_s
        return None if not c or self.flops_per_batch is None else self.flops_per_batch / c

    @property
    def utilisation(self) -> float | None:
        """Achieved / peak FLOP/s in the training step (the peak is an estimate on CPUs); ``None`` when unknown."""
        a = self.achieved_flops
        return None if a is None or not self.peak_flops else a / self.peak_flops

    @property
    def pad_fraction(self) -> float | None:
        """Share of the timed batches' token positions that are padding; ``None`` when they hold no tokens."""
        return 1.0 - self.tokens / self.padded_tokens if self.padded_tokens else None

    @property
    def memory_headroom(self) -> float | None:
        """Free share of device memory (CUDA) or available share of system memory (CPU)."""
        if self.memory_total_bytes:
            if self.memory_available_bytes is not None:
                return self.memory_available_bytes / self.memory_total_bytes
            if self.peak_memory_bytes is not None:
                return max(0.0, 1.0 - self.peak_memory_bytes / self.memory_total_bytes)
        return None

    @property
    def compile_saving_s(self) -> float | None:
        """Seconds a compiled step saves over an eager one, negative when slower, ``None`` when not measured.

        It is the probe's eager step (or, without one, the run's mean compute) times ``1 - 1 / compile_speedup``."""
        s = self.compile_speedup
        eager = self.compile_eager_s or self.compute_s
        if s is None or self.compile_s is None or not eager or s <= 0:
            return None
        return eager * (1.0 - 1.0 / s)

    @property
    def compile_total_s(self) -> float | None:
        """Seconds the run spends compiling, the measured compile once per graph in ``compile_graphs``.

        The probe times the training step's graphs (forward and backward); a forward-only validation graph compiles
        faster, a recompile for a new batch shape (dynamic shapes) slower, so each is priced at the measured one."""
        return None if self.compile_s is None else self.compile_s * max(1, len(self.compile_graphs))

    @property
    def compile_payback_steps(self) -> float | None:
        """Steps after which the run's compile time is paid back, ``compile_total_s / saving per step``.

        It is ``math.inf`` when the compiled step is not faster; ``None`` when compile was not measured."""
        saving = self.compile_saving_s
        total = self.compile_total_s
        if saving is None or total is None:
            return None
        return math.inf if saving <= 0 else total / saving

    @property
    def compile_net_share(self) -> float | None:
        """Share of the planned run's compute that compiling saves, net of the compile, negative when the run slows.

        It is ``(planned x eager - compile_total_s - planned x compiled) / (planned x eager)`` with the run's mean
        compute as the eager step; ``None`` when compile was not measured or the run length is unknown."""
        saving = self.compile_saving_s
        n = self.planned_steps
        c = self.compute_s
        total = self.compile_total_s
        if saving is None or total is None or not n or not c:
            return None
        return min(1.0, (n * saving - total) / (n * c))

    def summary(self) -> dict[str, Any]:
        """The headline numbers as a flat dict (used by the report and the loggers)."""
        return {
            "device": self.device_name or self.device_type,
            "precision": self.precision,
            "batch_size": self.batch_size,
            "timed_batches": len(self.compute_times),
            "step_s": self.step_s,
            "compute_s": self.compute_s,
            "data_wait_s": self.data_wait_s,
            "data_wait_share": self.data_wait_share,
            "optimizer_share": self.optimizer_share,
            "samples_per_s": self.samples_per_s,
            "flops_per_batch": self.flops_per_batch,
            "achieved_flops": self.achieved_flops,
            "peak_flops": self.peak_flops,
            "peak_flops_estimated": self.peak_flops_estimated,
            "peak_flops_source": self.peak_flops_source,
            "utilisation": self.utilisation,
            "peak_memory_bytes": self.peak_memory_bytes,
            "memory_total_bytes": self.memory_total_bytes,
            "memory_headroom": self.memory_headroom,
            "memory_kind": self.memory_kind,
            "pad_fraction": self.pad_fraction,
            "planned_steps": self.planned_steps,
            "compile_s": self.compile_s,
            "compile_graphs": list(self.compile_graphs),
            "compile_speedup": None if self.compile_speedup is None else float(self.compile_speedup),
            "compile_payback_steps": _finite(self.compile_payback_steps),
        }


def _finite(x: float | None) -> float | None:
    """``x``, or ``None`` for an infinite number (JSON has none)."""
    return x if x is None or math.isfinite(x) else None


@dataclass(kw_only=True)
class Finding:
    """One diagnosis: what is slow, the numbers that show it, and this library's fix (built by keyword).

    ``score`` is the estimated share of step time the fix saves (0..1; ranking key); ``measured`` says whether the
    expected effect comes from a micro-measurement on this machine (True) or from a rule of thumb (False). A ``fix``
    that starts with ``"Measure first:"`` names a measurement to run before changing anything (the effect on this run
    is unknown, or a gain per step may not be a gain in time to accuracy).
    """

    key: str
    title: str
    severity: str
    score: float
    evidence: dict[str, Any]
    fix: str
    expected: str
    measured: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
