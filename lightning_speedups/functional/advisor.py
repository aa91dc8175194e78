"""Speed advisor, pure part: turn measured training-step numbers into a ranked list of findings with fixes.

Nothing here touches a Trainer: :func:`diagnose` reads a :class:`Measurements` record (filled by the
``SpeedAdvisor`` callback, or by hand / with mocked timings in tests) and returns :class:`Finding` objects ranked by
``score`` = the estimated share of step time the fix would save (Amdahl-style, 0..1). The cheap micro-measurements
the callback uses to put numbers on "expected effect" (bf16 vs fp32 matmul, channels_last, fused optimizer step)
live here too and work on plain modules and tensors.
"""

from __future__ import annotations

import contextlib
import functools
import json
import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lightning_speedups._errors import SpeedupConfigError, check_range
from lightning_speedups.measure import interleaved_ratio, model_copy

__all__ = [
    "AdvisorReport",
    "AdvisorThresholds",
    "Finding",
    "Measurements",
    "OptimizerInfo",
    "bf16_autocast_speedup",
    "channels_last_speedup",
    "diagnose",
    "fused_optimizer_speedup",
]

SEVERITIES = ("high", "medium", "low", "info")


@dataclass
class AdvisorThresholds:
    """When a measurement becomes a finding.

    Args:
        data_wait: share of step time spent outside the training step (waiting for data) that makes a run data-bound.
        data_wait_note: smaller share still worth a low-severity note when the loader has ``num_workers=0``.
        small_batch: batch sizes below this count as small.
        low_utilisation: achieved / peak FLOP/s below this counts as an under-used device (where the peak is known).
        memory_pressure: peak memory above this fraction of the device's total is flagged.
        optimizer_share: optimizer-step share of compute above which a non-fused optimizer is flagged.
    """

    data_wait: float = 0.2
    data_wait_note: float = 0.05
    small_batch: int = 64
    low_utilisation: float = 0.3
    memory_pressure: float = 0.9
    optimizer_share: float = 0.05

    def __post_init__(self) -> None:
        for name in ("data_wait", "data_wait_note", "low_utilisation", "memory_pressure", "optimizer_share"):
            check_range(name, getattr(self, name), 0.0, 1.0)
        if self.data_wait_note > self.data_wait:
            raise SpeedupConfigError(
                f"`data_wait_note`={self.data_wait_note!r} must not exceed `data_wait`={self.data_wait!r}."
            )
        if not isinstance(self.small_batch, int) or self.small_batch < 1:
            raise SpeedupConfigError(f"`small_batch`={self.small_batch!r} must be a positive integer.")


@dataclass
class OptimizerInfo:
    """What the advisor knows about one optimizer: its class, fused/foreach flags and a measured fused speedup."""

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
    the batch, moving it to the device, loop overhead). Optional numbers are ``None`` when unknown.
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
    loader_kind: str | None = None
    num_workers: int | None = None
    optimizers: list[OptimizerInfo] = field(default_factory=list)
    frozen_updated: list[str] = field(default_factory=list)
    never_grad: list[str] = field(default_factory=list)
    trainable_params: int = 0
    compiled: bool = False
    callbacks: list[str] = field(default_factory=list)

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
        c, w = self.compute_s, self.data_wait_s
        return None if c is None else c + (w or 0.0)

    @property
    def data_wait_share(self) -> float:
        """Share of wall time per batch spent outside the training step."""
        c, w = self.compute_s, self.data_wait_s
        if c is None or w is None or c + w <= 0:
            return 0.0
        return w / (c + w)

    @property
    def compute_share(self) -> float:
        return 1.0 - self.data_wait_share

    @property
    def optimizer_share(self) -> float | None:
        """Share of compute spent in the optimizer step."""
        o, c = self._mean(self.optimizer_times), self.compute_s
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
        """Achieved / peak FLOP/s in the training step; ``None`` when the device's peak is unknown (CPUs)."""
        a = self.achieved_flops
        return None if a is None or not self.peak_flops else a / self.peak_flops

    @property
    def memory_headroom(self) -> float | None:
        """Free share of device memory (CUDA) or available share of system memory (CPU)."""
        if self.memory_total_bytes:
            if self.memory_available_bytes is not None:
                return self.memory_available_bytes / self.memory_total_bytes
            if self.peak_memory_bytes is not None:
                return max(0.0, 1.0 - self.peak_memory_bytes / self.memory_total_bytes)
        return None

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
            "utilisation": self.utilisation,
            "peak_memory_bytes": self.peak_memory_bytes,
            "memory_total_bytes": self.memory_total_bytes,
            "memory_headroom": self.memory_headroom,
            "memory_kind": self.memory_kind,
        }


@dataclass
class Finding:
    """One diagnosis: what is slow, the numbers that show it, and this library's fix.

    ``score`` is the estimated share of step time the fix saves (0..1; ranking key); ``measured`` says whether the
    expected effect comes from a micro-measurement on this machine (True) or from a rule of thumb (False).
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


def _severity(score: float) -> str:
    return "high" if score >= 0.25 else "medium" if score >= 0.08 else "low" if score > 0.0 else "info"


def _r(x: float | None, nd: int = 4) -> float | None:
    return None if x is None else round(float(x), nd)


def _ms(x: float | None) -> float | None:
    return None if x is None else round(1e3 * x, 3)


def _has_callback(m: Measurements, name: str) -> bool:
    return name in m.callbacks


def diagnose(m: Measurements, thresholds: AdvisorThresholds | None = None) -> list[Finding]:
    """Rank what slows this training run down, from measurements alone.

    Args:
        m: the window's measurements.
        thresholds: when a number becomes a finding (defaults: :class:`AdvisorThresholds`).

    Returns:
        Findings sorted by ``score`` (highest first).

    Example::

        >>> m = Measurements(batch_size=32, compute_times=[0.01] * 5, data_waits=[0.03] * 5,
        ...                  loader_kind="DataLoader", num_workers=0)
        >>> [f.key for f in diagnose(m)][:1]
        ['data_bound']
    """
    th = thresholds or AdvisorThresholds()
    out: list[Finding] = []
    compute_share, wait_share = m.compute_share, m.data_wait_share
    plain_loader = m.loader_kind in ("DataLoader", None)  # unknown loader: give the DataLoader advice

    # data loading
    if m.compute_times and wait_share >= th.data_wait:
        if plain_loader:
            fix = (
                "Keep the decoded dataset on the device with `DeviceDataLoader` (augment whole batches with "
                "`BatchAugment`) when it fits in memory; otherwise "
                + (f"raise the DataLoader's `num_workers` (now {m.num_workers})" if m.num_workers else
                   "give the DataLoader `num_workers` > 0")
                + " with `persistent_workers=True`" + (" and `pin_memory=True`." if m.device_type == "cuda" else ".")
            )
        else:
            fix = (
                "Time is spent between steps outside the loader's control: log less often "
                "(`Trainer(log_every_n_steps=...)`) and check callbacks' per-batch hooks; with a DataLoader use "
                "`DeviceDataLoader` or more `num_workers`."
            )
        out.append(
            Finding(
                "data_bound",
                f"Data-bound: {wait_share:.0%} of each step waits for the next batch",
                _severity(wait_share),
                wait_share,
                {
                    "data_wait_ms": _ms(m.data_wait_s),
                    "compute_ms": _ms(m.compute_s),
                    "data_wait_share": _r(wait_share),
                    "loader": m.loader_kind,
                    "num_workers": m.num_workers,
                },
                fix,
                f"up to {1 / max(1e-9, 1 - wait_share):.1f}x samples/s once loading is hidden or removed "
                "(Amdahl bound from the measured wait share)",
            )
        )
    elif plain_loader and m.num_workers == 0 and wait_share >= th.data_wait_note:
        out.append(
            Finding(
                "num_workers_zero",
                f"DataLoader with num_workers=0: {wait_share:.0%} of each step loads data in the main process",
                "low",
                wait_share,
                {"data_wait_ms": _ms(m.data_wait_s), "data_wait_share": _r(wait_share), "num_workers": 0},
                "`DeviceDataLoader` for in-memory data, or DataLoader `num_workers` > 0 "
                "with `persistent_workers=True`.",
                f"up to {1 / max(1e-9, 1 - wait_share):.2f}x samples/s (Amdahl bound)",
            )
        )

    # precision vs hardware
    low_prec = "bf16" in m.precision or m.precision.startswith("16")
    s_bf16 = m.bf16_speedup  # fp32 time / bf16 time of this model's step (> 1: bf16 faster)
    slow_cpu = (s_bf16 is not None and s_bf16 < 0.9) or (s_bf16 is None and m.cpu_bf16_fast is False)
    if m.device_type == "cpu" and low_prec and slow_cpu:
        slow = 1.0 / s_bf16 if s_bf16 else None
        frac = (1.0 - 1.0 / slow) if slow else 0.5
        score = compute_share * frac
        out.append(
            Finding(
                "low_precision_on_slow_cpu",
                f"Precision {m.precision} on a CPU without fast bf16/fp16 units",
                "high" if score >= 0.08 else _severity(score),
                score,
                {
                    "precision": m.precision,
                    "bf16_step_slowdown": _r(slow, 2),
                    "compute_ms": _ms(m.compute_s),
                },
                '`trainer_settings(precision="auto")` (picks 32-true on this CPU) or `Trainer(precision="32-true")`.',
                f"about {slow:.1f}x faster compute (fp32 vs bf16 training step measured on this CPU)"
                if slow
                else "fp32 is typically several times faster on CPUs without bf16 units (not measured)",
                measured=slow is not None,
            )
        )
    elif "32" in m.precision and m.device_type == "cuda" and m.cuda_bf16_supported:
        score = compute_share * 0.4
        out.append(
            Finding(
                "fp32_on_bf16_gpu",
                f"fp32 training on a GPU with bf16 tensor cores ({m.device_name})",
                _severity(score),
                score,
                {"precision": m.precision, "utilisation": _r(m.utilisation)},
                '`trainer_settings(precision="auto")` (bf16-mixed here) or `Trainer(precision="bf16-mixed")`.',
                "typically 1.5-3x faster compute and half the activation memory (rule of thumb, not measured)",
            )
        )
    elif "32" in m.precision and m.device_type == "cpu" and m.bf16_speedup:
        score = max(0.0, compute_share * (1.0 - 1.0 / m.bf16_speedup))
        if m.bf16_speedup > 1.3:  # the margin `trainer_settings` uses too: above noise, worth the accuracy check
            out.append(
                Finding(
                    "fp32_on_bf16_cpu",
                    f"fp32 training although bf16 autocast ran {m.bf16_speedup:.2f}x faster on this CPU",
                    _severity(score),
                    score,
                    {"precision": m.precision, "bf16_step_speedup": _r(m.bf16_speedup, 2)},
                    '`Trainer(precision="bf16-mixed")` (or `trainer_settings(precision="auto")`); check the accuracy.',
                    f"{m.bf16_speedup:.2f}x faster forward+backward under bf16 autocast, measured on this CPU",
                    measured=True,
                )
            )
    if m.tf32_off and "32" in m.precision and not _has_callback(m, "SpeedFlags"):
        score = compute_share * 0.3
        out.append(
            Finding(
                "tf32_off",
                "fp32 matmuls run at 'highest' precision on an Ampere+ GPU (TF32 off)",
                _severity(score),
                score,
                {"float32_matmul_precision": "highest"},
                "`SpeedFlags()` callback or `enable_speed_flags()` "
                "(sets `torch.set_float32_matmul_precision(\"high\")`).",
                "typically up to 2-3x faster fp32 matmuls (rule of thumb, not measured)",
            )
        )

    # memory layout
    if m.has_conv and not m.conv_channels_last and not _has_callback(m, "ChannelsLast"):
        s = m.channels_last_speedup
        if s is not None:
            score = max(0.0, compute_share * (1.0 - 1.0 / s))
            expected = f"{s:.2f}x faster forward+backward measured on a copy of the model" + (
                "" if s > 1.02 else " (no gain on this machine: skip it)"
            )
        else:
            score = compute_share * (0.15 if m.device_type == "cuda" else 0.02)
            expected = "typically 1.1-1.3x on GPUs with tensor cores (not measured)"
        out.append(
            Finding(
                "channels_last",
                "Convolution model in the default NCHW memory layout",
                _severity(score) if s is None or s > 1.02 else "info",
                score if s is None or s > 1.02 else 0.0,
                {"channels_last_speedup": _r(s, 3)},
                "`ChannelsLast()` callback (model and 4-D inputs to torch.channels_last).",
                expected,
                measured=s is not None,
            )
        )

    # optimizer
    opt_share = m.optimizer_share
    for opt in m.optimizers:
        if not opt.fused_supported or opt.fused:
            continue
        s = opt.fused_speedup
        share = opt_share if opt_share is not None else 0.0
        if s is not None:
            score = max(0.0, compute_share * share * (1.0 - 1.0 / s))
        else:
            score = compute_share * share * (0.3 if opt.foreach or m.device_type == "cuda" else 0.5)
        if share < th.optimizer_share and (s is None or s <= 1.05):
            continue
        no_gain = s is not None and s <= 1.05  # measured: fused is not faster here, say so and rank it last
        out.append(
            Finding(
                "optimizer_not_fused",
                f"{opt.name} runs without fused=True ({share:.0%} of compute is the optimizer step)",
                "info" if no_gain else _severity(score),
                0.0 if no_gain else score,
                {"optimizer": opt.name, "optimizer_share": _r(opt_share), "foreach": opt.foreach,
                 "fused_step_speedup": _r(s, 2)},
                "`OptimizerConfig(implementation=\"fused\")` with `SpeedupMixin` (\"auto\" fuses on accelerators "
                "only; on CPU ask for it when measured faster) or `torch.optim.<Opt>(..., fused=True)`.",
                f"{s:.2f}x faster optimizer step measured on copies of the parameters"
                + (" (no gain on this machine: skip it)" if no_gain else "")
                if s is not None
                else "fused kernels: one launch per step instead of one per tensor (not measured)",
                measured=s is not None,
            )
        )

    # parameters
    if m.frozen_updated:
        out.append(
            Finding(
                "frozen_but_updated",
                f"{len(m.frozen_updated)} parameter(s) with requires_grad=False still changed during the window",
                "high",
                0.3,
                {"count": len(m.frozen_updated), "examples": m.frozen_updated[:5]},
                "`FineTuneFreezing` (freezes properly: requires_grad=False, grad=None, BatchNorm in eval), or "
                "`optimizer.zero_grad(set_to_none=True)` so stale grads and momentum stop moving frozen weights.",
                "frozen weights stay frozen (a correctness fix; saves their optimizer work)",
            )
        )
    if m.never_grad:
        frac = len(m.never_grad) / max(1, m.trainable_params)
        score = min(0.2, 0.05 + 0.1 * frac)
        out.append(
            Finding(
                "unused_trainable_params",
                f"{len(m.never_grad)} trainable parameter(s) never received a gradient in the window",
                _severity(score),
                score,
                {"count": len(m.never_grad), "share_of_trainable": _r(frac), "examples": m.never_grad[:5]},
                "Freeze them (`FineTuneFreezing`, or requires_grad_(False)) or remove the unused modules; under DDP "
                "this also avoids `find_unused_parameters=True`.",
                "less optimizer and all-reduce work (not measured)",
            )
        )

    # utilisation, batch size, memory
    util, head = m.utilisation, m.memory_headroom
    under_used = util is not None and util < th.low_utilisation
    if (
        m.batch_size is not None
        and m.batch_size < th.small_batch
        and (under_used or (util is None and m.device_type == "cpu"))
        and (head is None or head > 0.3)
        and not _has_callback(m, "ThroughputBatchSizeFinder")
    ):
        score = compute_share * (0.2 if under_used else 0.1)
        title = (
            f"Small batch ({m.batch_size}) on an under-used device ({util:.1%} of peak FLOP/s)"
            if util is not None
            else f"Small batch ({m.batch_size}): per-step overhead may dominate (CPU peak FLOP/s unknown)"
        )
        out.append(
            Finding(
                "small_batch",
                title,
                _severity(score),
                score,
                {"batch_size": m.batch_size, "utilisation": _r(util), "memory_headroom": _r(head),
                 "compute_ms": _ms(m.compute_s)},
                "`ThroughputBatchSizeFinder()` (measures samples/s per batch size; scales the LR with "
                "`scale_lr=\"linear\"`).",
                "more samples/s per step overhead; the finder measures the real gain (not measured here)",
            )
        )
    if m.peak_memory_bytes and m.memory_total_bytes and m.memory_kind == "cuda":
        used = m.peak_memory_bytes / m.memory_total_bytes
        if used >= th.memory_pressure:
            out.append(
                Finding(
                    "memory_pressure",
                    f"Peak memory at {used:.0%} of the device",
                    "low",
                    0.03,
                    {"peak_memory_bytes": m.peak_memory_bytes, "memory_total_bytes": m.memory_total_bytes},
                    '`trainer_settings(precision="auto")` (bf16 halves activations) or a smaller batch.',
                    "room for a larger batch or model; avoids allocator retries (not measured)",
                )
            )
    if not m.compiled and not _has_callback(m, "TorchCompile") and m.compute_times and compute_share >= 0.5:
        score = compute_share * (0.1 if m.device_type == "cuda" else 0.03)
        out.append(
            Finding(
                "not_compiled",
                "Model runs eagerly (not compiled)",
                _severity(score),
                score,
                {"compute_share": _r(compute_share)},
                "`TorchCompile()` callback (compile time is paid once at the start).",
                "often 1.1-1.5x on GPUs, less on CPUs (rule of thumb; measure with `lightning-speedups bench`)",
            )
        )
    out.sort(key=lambda f: (-f.score, SEVERITIES.index(f.severity)))
    return out


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
            util = s.get("utilisation")
            lines.append(
                f"  {s['flops_per_batch'] / 1e9:.3f} GFLOP per batch (fwd+bwd) -> "
                f"{(s.get('achieved_flops') or 0) / 1e9:.1f} GFLOP/s in the step; "
                + (f"{util:.1%} of the device's peak" if util is not None else "device peak unknown (not in the table)")
            )
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


# ---- cheap micro-measurements ------------------------------------------------------------------------------------
_Candidate = Callable[[nn.Module, torch.Tensor], tuple[nn.Module, torch.Tensor, Any]]


def _copy_ratio(module: nn.Module, example: torch.Tensor, candidate: _Candidate, repeats: int) -> float | None:
    """Forward+backward time of a copy of ``module`` / of a candidate copy (> 1: candidate faster); None on failure."""
    try:
        base = model_copy(module, train=True)
        cand, xc, ctx = candidate(model_copy(module, train=True), example.detach())
    except Exception:  # noqa: BLE001 - measurement is best effort
        return None
    x = example.detach()

    def run(model: nn.Module, inp: torch.Tensor, context: Any) -> Callable[[], None]:
        def f() -> None:
            with context():
                out = model(inp)
            out = out[0] if isinstance(out, (tuple, list)) else out
            out.float().sum().backward()
            model.zero_grad(set_to_none=True)

        return f

    try:
        return interleaved_ratio(run(base, x, contextlib.nullcontext), run(cand, xc, ctx), repeats, sync=x.is_cuda)
    except Exception:  # noqa: BLE001
        return None


def channels_last_speedup(module: nn.Module, example: torch.Tensor, repeats: int = 3) -> float | None:
    """Forward+backward time NCHW / channels_last on deep copies of ``module`` (> 1: channels_last faster).

    The copies keep the real model, its grads and its optimizer untouched. Returns ``None`` for non-image inputs or
    when the copy or the forward fails (e.g. a model that cannot be deep-copied).
    """
    if example.dim() != 4:
        return None

    def cand(model: nn.Module, x: torch.Tensor) -> tuple[nn.Module, torch.Tensor, Any]:
        return model.to(memory_format=torch.channels_last), x.contiguous(memory_format=torch.channels_last), (
            contextlib.nullcontext
        )

    return _copy_ratio(module, example, cand, repeats)


def bf16_autocast_speedup(module: nn.Module, example: torch.Tensor, repeats: int = 3) -> float | None:
    """Forward+backward time fp32 / bf16 autocast on deep copies of ``module`` with this batch (> 1: bf16 faster).

    Measures the user's own model: on a Xeon with AMX a bf16 matmul is ~20x faster than fp32 while a small conv net's
    step under bf16 autocast can be slower, and CPUs without bf16 units emulate it (~10x slower).
    """
    if not example.is_floating_point():
        return None
    device_type = example.device.type

    def cand(model: nn.Module, x: torch.Tensor) -> tuple[nn.Module, torch.Tensor, Any]:
        return model, x, functools.partial(torch.autocast, device_type, dtype=torch.bfloat16)

    return _copy_ratio(module, example, cand, repeats)


def fused_optimizer_speedup(optimizer: torch.optim.Optimizer, repeats: int = 5) -> float | None:
    """Step time of ``optimizer``'s settings / the same with ``fused=True``, on cloned parameters with random grads.

    Only parameters that currently have a grad are cloned. Returns ``None`` when the class has no fused kernel for
    these tensors (construction or step raises).
    """
    params = [p for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
    if not params or "fused" not in optimizer.defaults:
        return None
    defaults = {k: v for k, v in optimizer.defaults.items() if k not in ("fused", "foreach", "differentiable")}

    def make(**flags: Any) -> torch.optim.Optimizer:
        clones = [p.detach().clone().requires_grad_(True) for p in params]
        for c, p in zip(clones, params):
            c.grad = torch.randn_like(p)
        return type(optimizer)(clones, **defaults, **flags)

    try:
        plain = make(**{k: optimizer.defaults[k] for k in ("foreach",) if k in optimizer.defaults})
        fused = make(fused=True)
        return interleaved_ratio(plain.step, fused.step, repeats, sync=params[0].is_cuda)
    except Exception:  # noqa: BLE001 - no fused kernel for this class/device/dtype
        return None
