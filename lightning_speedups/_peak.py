"""Peak FLOP/s of the device: the denominator of utilisation (achieved / peak FLOP/s).

CPUs have no datasheet table, so :func:`estimate_cpu_peak_flops` estimates one from first principles: FLOP per cycle
per core (from the vector ISA: lanes x 2 for a fused multiply-add x FMA units) x cores x clock. It is an upper bound
that only large dense matmuls approach, and it is labelled as an estimate wherever it is printed. GPUs use Lightning's
datasheet table (``lightning.fabric.utilities.throughput.get_available_flops``), with a few dense per-GPU entries of
our own where Lightning's is missing or counts differently (:data:`GPU_PEAKS`: H200, H100 NVL). Hardware that neither
knows gets ``flops=None`` and the reason, never a guess.

Example::

    >>> est = estimate_cpu_peak_flops(torch.float32, cores=2, ghz=2.5, flags="sse avx avx2 fma", vendor="AuthenticAMD")
    >>> est.flops / 1e9, est.isa, est.flop_per_cycle_per_core
    (160.0, 'AVX2+FMA', 32.0)
    >>> est.describe()
    'estimated CPU peak 160 GFLOP/s fp32 (AVX2+FMA, 32 FLOP/cycle/core x 2 cores x 2.5 GHz; an estimate)'
"""

from __future__ import annotations

import platform
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from lightning_speedups._errors import SpeedupConfigError, check_choice, check_int, check_range

__all__ = [
    "CPU_ISA_RULES",
    "GPU_PEAKS",
    "IsaRule",
    "NO_BF16_UNITS",
    "PeakEstimate",
    "cpu_bf16_units",
    "device_peak_flops",
    "estimate_cpu_peak_flops",
]

# module-level so tests can point them at fixture files
_CPUINFO = Path("/proc/cpuinfo")
_CPUFREQ_MAX = Path("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq")  # kHz
_SVE_VECTOR_LENGTH = Path("/proc/sys/abi/sve_default_vector_length")  # bytes

_DTYPES: dict[object, str] = {
    torch.float32: "fp32",
    "fp32": "fp32",
    "float32": "fp32",
    torch.bfloat16: "bf16",
    "bf16": "bf16",
    "bfloat16": "bf16",
    torch.float16: "fp16",
    "fp16": "fp16",
    "float16": "fp16",
    torch.float64: "fp64",
    "fp64": "fp64",
    "float64": "fp64",
}
_TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "fp64": torch.float64}


@dataclass(frozen=True)
class PeakEstimate:
    """A device's peak FLOP/s for one dtype, where it came from, and whether it is an estimate.

    Attributes:
        flops: peak FLOP/s; ``None`` when unknown (then ``reason`` says why).
        dtype: ``"fp32"``, ``"tf32"`` (fp32 matmuls on tensor cores), ``"bf16"``, ``"fp16"`` or ``"fp64"``.
        device: ``"cpu"``, ``"cuda"``, ...
        isa: the CPU vector ISA the estimate rests on (``"AVX-512"``, ``"AMX-BF16"``, ``"NEON"``, ...).
        flop_per_cycle_per_core, cores, ghz: the three factors of a CPU estimate.
        source: where the number comes from (``"ISA x cores x clock"``, a datasheet table).
        estimate: ``True`` for the CPU estimate, ``False`` for a datasheet peak.
        reason: why ``flops`` is ``None``, or a caveat of the estimate (no bf16 units, AMX as an upper bound).
    """

    flops: float | None
    dtype: str
    device: str = "cpu"
    isa: str | None = None
    flop_per_cycle_per_core: float | None = None
    cores: int | None = None
    ghz: float | None = None
    source: str = ""
    estimate: bool = True
    reason: str = ""

    @property
    def known(self) -> bool:
        return self.flops is not None

    @property
    def flops_text(self) -> str:
        """The peak as ``"333 GFLOP/s fp32"`` / ``"989 TFLOP/s bf16"`` (``"unknown"`` when not known)."""
        if self.flops is None:
            return "unknown"
        unit, scale = ("TFLOP/s", 1e12) if self.flops >= 1e12 else ("GFLOP/s", 1e9)
        return f"{self.flops / scale:.3g} {unit} {self.dtype}"

    @property
    def basis(self) -> str:
        """What the number rests on, for a report's parentheses."""
        if self.flops is None:
            return self.reason
        if self.estimate:
            parts = [
                f"{self.isa}, {self.flop_per_cycle_per_core:g} FLOP/cycle/core x {self.cores} "
                f"core{'s' if self.cores != 1 else ''} x {self.ghz:.3g} GHz"
            ]
            return "; ".join(parts + ([self.reason] if self.reason else []) + ["an estimate"])
        return self.source + (f"; {self.reason}" if self.reason else "")

    def describe(self) -> str:
        """One line: ``estimated CPU peak 160 GFLOP/s fp32 (AVX2+FMA, 32 FLOP/cycle/core x 2 cores x 2.5 GHz; ...)``."""
        if self.flops is None:
            return f"peak {self.dtype} FLOP/s unknown: {self.reason}"
        kind = ("estimated CPU peak" if self.device == "cpu" else "estimated peak") if self.estimate else "peak"
        return f"{kind} {self.flops_text} ({self.basis})"


# ---- CPUs ----------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class IsaRule:
    """One vector ISA: the CPU flags it needs and its fp32 FLOP per cycle per core (the first matching rule wins).

    ``scalable`` rules (SVE) scale ``fp32`` from a 128-bit vector to the machine's vector length when it is known.
    """

    name: str
    flags: frozenset[str]
    fp32: float
    why: str
    vendor: str | None = None
    scalable: bool = False


#: fp32 FLOP/cycle/core per vector ISA, most capable first; a new ISA is a new entry.
CPU_ISA_RULES: tuple[IsaRule, ...] = (
    IsaRule(
        "AVX-512 (AMD, 2x256-bit)",
        frozenset({"avx512f"}),
        32.0,
        "Zen 4 runs 512-bit ops as two 256-bit halves: 2 FMA units x 8 lanes x 2",
        vendor="AuthenticAMD",
    ),
    IsaRule(
        "AVX-512",
        frozenset({"avx512f"}),
        64.0,
        "2 FMA units x 16 lanes x 2 (parts with one 512-bit FMA unit reach half)",
    ),
    IsaRule("AVX2+FMA", frozenset({"avx2", "fma"}), 32.0, "2 FMA units x 8 lanes x 2"),
    IsaRule("AVX", frozenset({"avx"}), 16.0, "an add and a multiply unit x 8 lanes"),
    IsaRule("SSE", frozenset({"sse"}), 8.0, "an add and a multiply unit x 4 lanes"),
    IsaRule("SVE", frozenset({"sve"}), 16.0, "2 FMA pipes x (vector bits / 32) lanes x 2", scalable=True),
    IsaRule("NEON", frozenset({"asimd"}), 16.0, "2 FMA pipes x 4 lanes x 2"),
)

# low-precision units: (flag, ISA label, absolute FLOP/cycle/core or None, factor over fp32, caveat)
_LOW_PRECISION: dict[str, tuple[tuple[str, str, float | None, float, str], ...]] = {
    # Intel AMX: a 16x32 by 32x16 tile multiply per cycle = 1024 FLOP/cycle/core; reached only by large matmuls
    "bf16": (
        ("amx_bf16", "AMX-BF16", 1024.0, 1.0, "AMX tile matmuls only: an upper bound"),
        ("avx512_bf16", "AVX512-BF16", None, 2.0, "bf16 dot products at 2x the fp32 rate"),
    ),
    "fp16": (
        ("amx_fp16", "AMX-FP16", 1024.0, 1.0, "AMX tile matmuls only: an upper bound"),
        ("avx512_fp16", "AVX512-FP16", None, 2.0, "fp16 vectors at 2x the fp32 lanes"),
    ),
}
_NO_UNITS = {"bf16": "no bf16 units: counted at the fp32 rate", "fp16": "no fp16 units: counted at the fp32 rate"}


_BF16_UNIT_FLAGS = (("amx_bf16", "AMX-BF16"), ("avx512_bf16", "AVX512-BF16"), ("bf16", "ARM BF16"))
#: why bf16 is not tried where :func:`cpu_bf16_units` finds none (autotune's blocker and PrecisionTrial say it alike)
NO_BF16_UNITS = (
    "this CPU has no bf16 units (no amx_bf16, avx512_bf16 or ARM bf16 flag): bf16 is emulated there, about 10x "
    "slower than fp32"
)


def cpu_bf16_units(flags: str | Iterable[str] | None = None) -> str | None:
    """The label of this CPU's bf16 units (``"AMX-BF16"``, ``"AVX512-BF16"``, ``"ARM BF16"``), or ``None`` where it
    has none and bf16 is emulated in fp32 (about 10x slower than fp32 on a 2-core AMD EPYC without them).

    Example::

        >>> cpu_bf16_units("avx2 fma avx512f avx512_bf16"), cpu_bf16_units("avx2 fma")
        ('AVX512-BF16', None)
    """
    if flags is None:
        info = _read_cpuinfo()
        have = info.flags if info is not None else _capability_flags()
    else:
        have = _flag_set(flags)
    return next((label for flag, label in _BF16_UNIT_FLAGS if flag in have), None)


@dataclass(frozen=True)
class _CpuInfo:
    flags: frozenset[str]
    vendor: str
    mhz: float | None


def _read_cpuinfo(path: Path | None = None) -> _CpuInfo | None:
    """Flags (x86 ``flags`` / ARM ``Features``), vendor and the highest ``cpu MHz`` of ``/proc/cpuinfo``."""
    try:
        text = (path or _CPUINFO).read_text()
    except OSError:
        return None
    flags: frozenset[str] = frozenset()
    vendor = ""
    mhz = None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip().lower()
        value = value.strip()
        if key in ("flags", "features") and not flags:
            flags = frozenset(value.lower().split())
        elif key == "vendor_id" and not vendor:
            vendor = value
        elif key == "cpu mhz":
            try:
                mhz = max(mhz or 0.0, float(value))
            except ValueError:
                pass
    return _CpuInfo(flags, vendor, mhz or None)


def _capability_flags() -> frozenset[str]:
    """Off Linux: the flags implied by torch's CPU capability (NEON is part of every 64-bit ARM CPU)."""
    cap = torch.backends.cpu.get_cpu_capability().upper()
    if cap.startswith("AVX512"):
        return frozenset({"avx512f", "avx2", "fma", "avx", "sse"})
    if cap.startswith("AVX2"):
        return frozenset({"avx2", "fma", "avx", "sse"})
    if platform.machine().lower() in ("arm64", "aarch64"):
        return frozenset({"asimd"})
    return frozenset()


def _read_float(path: Path) -> float | None:
    try:
        return float(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _machine_ghz(info: _CpuInfo | None) -> float | None:
    """The highest clock the machine reports: cpufreq's maximum, else ``cpu MHz`` in ``/proc/cpuinfo``."""
    khz = _read_float(_CPUFREQ_MAX)
    if khz:
        return khz / 1e6
    return info.mhz / 1e3 if info and info.mhz else None


def _machine_cores() -> int:
    """The threads torch computes with, at most one per physical core (SMT siblings share the FMA units)."""
    import psutil

    physical = psutil.cpu_count(logical=False)
    threads = torch.get_num_threads()
    return min(threads, physical) if physical else threads


def _dtype_name(dtype: torch.dtype | str) -> str:
    if isinstance(dtype, (torch.dtype, str)) and dtype in _DTYPES:
        return _DTYPES[dtype]
    return check_choice("dtype", dtype, list(_DTYPES))  # raises, listing every accepted spelling


def _flag_set(flags: str | Iterable[str]) -> frozenset[str]:
    if isinstance(flags, str):
        return frozenset(flags.lower().split())
    items = list(flags)
    if not all(isinstance(f, str) for f in items):
        raise SpeedupConfigError(
            f"`flags`={flags!r} is not supported. Allowed values: a string of CPU flags (as /proc/cpuinfo writes "
            "them: 'avx2 fma') or an iterable of flag strings."
        )
    return frozenset(f.lower() for f in items)


def estimate_cpu_peak_flops(
    dtype: torch.dtype | str = torch.float32,
    cores: int | None = None,
    ghz: float | None = None,
    flags: str | Iterable[str] | None = None,
    *,
    vendor: str | None = None,
    vector_bits: int | None = None,
) -> PeakEstimate:
    """Estimate this CPU's peak FLOP/s: FLOP per cycle per core (vector ISA) x cores x clock.

    fp32 FLOP/cycle/core (:data:`CPU_ISA_RULES`): AVX-512 64 (2 FMA units; AMD Zen 4 runs it as 2x256-bit: 32),
    AVX2+FMA 32, AVX 16, SSE 8, NEON 16, SVE 16 per 128 bits of vector. fp64 is half the fp32 rate. bf16: AMX
    (``amx_bf16``) 1024 per core, an upper bound only tile matmuls approach; ``avx512_bf16`` 2x the fp32 rate;
    otherwise the fp32 rate (no bf16 units, said in ``reason``). fp16 likewise with ``amx_fp16`` / ``avx512_fp16``.
    The result is an upper bound and labelled as an estimate.

    Args:
        dtype: the dtype the matmuls run in (``torch.float32``, ``torch.bfloat16``, ``torch.float16``,
            ``torch.float64`` or ``"fp32"``, ``"bf16"``, ...).
        cores: cores computing; default the threads torch uses (``torch.get_num_threads()``), at most one per
            physical core.
        ghz: clock in GHz; default cpufreq's ``cpuinfo_max_freq``, else the highest ``cpu MHz`` in ``/proc/cpuinfo``.
        flags: CPU flags (``"avx2 fma"`` or an iterable); default ``/proc/cpuinfo``, else off Linux the flags implied
            by ``torch.backends.cpu.get_cpu_capability()``.
        vendor: ``vendor_id`` (``"AuthenticAMD"``, ``"GenuineIntel"``); default ``/proc/cpuinfo``.
        vector_bits: SVE vector length in bits; default ``/proc/sys/abi/sve_default_vector_length``.

    Returns:
        A :class:`PeakEstimate`; its ``flops`` is ``None`` with the ``reason`` when the ISA or the clock is unknown.

    Raises:
        SpeedupConfigError: for an unsupported ``dtype``, ``cores`` < 1, ``ghz`` outside (0, 20] or bad ``flags``.

    Example::

        >>> flags = "avx avx2 fma avx512f avx512_bf16"
        >>> est = estimate_cpu_peak_flops("bf16", cores=2, ghz=2.0, flags=flags, vendor="GenuineIntel")
        >>> est.isa, est.flop_per_cycle_per_core, est.flops / 1e9
        ('AVX512-BF16', 128.0, 512.0)
        >>> estimate_cpu_peak_flops(cores=2, ghz=2.0, flags="").flops is None
        True
    """
    name = _dtype_name(dtype)
    check_int("cores", cores, 1, optional=True)
    if ghz is not None:
        check_range("ghz", ghz, 0.0, 20.0, low_inclusive=False, hint="`ghz` is in GHz (2.45), not MHz (2450).")
    check_int("vector_bits", vector_bits, 128, 2048, optional=True)
    info = _read_cpuinfo() if flags is None or vendor is None or ghz is None else None
    flag_set = _flag_set(flags) if flags is not None else info.flags if info else _capability_flags()
    vendor = vendor if vendor is not None else info.vendor if info else ""
    cores = cores if cores is not None else _machine_cores()
    ghz = ghz if ghz is not None else _machine_ghz(info)
    unknown = PeakEstimate(None, name, cores=cores, ghz=ghz, source="ISA x cores x clock")
    rule = next((r for r in CPU_ISA_RULES if r.flags <= flag_set and r.vendor in (None, vendor)), None)
    if rule is None:
        return replace(
            unknown, reason="no known vector ISA in the CPU flags (AVX-512, AVX2, AVX, SSE, SVE, NEON); pass `flags=`"
        )
    fp32 = rule.fp32
    isa = rule.name
    caveat = ""
    if rule.scalable:
        bits = vector_bits or _sve_bits()
        fp32 = fp32 * bits / 128 if bits else fp32
        isa, caveat = (f"SVE {bits}-bit", "") if bits else ("SVE", "vector length unknown: counted at 128 bits")
    per_core = fp32 / 2 if name == "fp64" else fp32
    if name in _LOW_PRECISION:
        unit = next((u for u in _LOW_PRECISION[name] if u[0] in flag_set), None)
        if unit is None:
            caveat = "; ".join(c for c in (caveat, _NO_UNITS[name]) if c)
        else:
            _, isa, absolute, factor, note = unit
            per_core = absolute if absolute is not None else fp32 * factor
            caveat = note if absolute is not None else caveat
    if ghz is None:
        return replace(
            unknown,
            isa=isa,
            flop_per_cycle_per_core=per_core,
            reason="clock unknown (no cpufreq and no `cpu MHz` in /proc/cpuinfo); pass `ghz=`",
        )
    flops = per_core * cores * ghz * 1e9
    return PeakEstimate(flops, name, "cpu", isa, per_core, cores, ghz, "ISA x cores x clock", True, caveat)


def _sve_bits() -> int | None:
    nbytes = _read_float(_SVE_VECTOR_LENGTH)
    return int(nbytes * 8) if nbytes else None


# ---- GPUs ----------------------------------------------------------------------------------------------------------
#: Dense (no 2:4 sparsity) per-GPU peaks, for chips Lightning's table misses or counts differently. NVIDIA's datasheets
#: quote the tensor-core numbers "with sparsity": halved here. H200 SXM (and GH200) is the GH100 die at H100 SXM clocks:
#: FP64 34, FP32 67, TF32 989*, BF16/FP16 1,979* TFLOPS (* sparse), so Lightning's H100 SXM values; Lightning's own
#: H200 entries quote the sparse numbers under names ("sxm1") that ``torch.cuda.get_device_name`` never returns.
#: H200 NVL and H100 NVL, one GPU: FP64 30, FP32 60, TF32 835*, BF16/FP16 1,671* TFLOPS (Lightning's "h100 nvl" is
#: the two-GPU NVL pair of the first H100 datasheet).
GPU_PEAKS: dict[str, dict[str, float]] = {
    "h200 sxm": {"fp64": 33.5e12, "fp32": 66.9e12, "tf32": 494.7e12, "bf16": 989.4e12, "fp16": 989.4e12},
    "h200 nvl": {"fp64": 30e12, "fp32": 60e12, "tf32": 417.5e12, "bf16": 835.5e12, "fp16": 835.5e12},
    "h100 nvl": {"fp64": 30e12, "fp32": 60e12, "tf32": 417.5e12, "bf16": 835.5e12, "fp16": 835.5e12},
}
# (words that must all be in the lower-cased device name, GPU_PEAKS key); first match wins; every entry is Hopper
_GPU_NAMES: tuple[tuple[tuple[str, ...], str], ...] = (
    (("h200", "nvl"), "h200 nvl"),
    (("h200",), "h200 sxm"),  # "NVIDIA H200", "NVIDIA GH200 480GB"
    (("h100", "nvl"), "h100 nvl"),
)


def _gpu_peak(device: torch.device, name: str) -> PeakEstimate:
    device_name = torch.cuda.get_device_name(device)
    chip = next((key for words, key in _GPU_NAMES if all(w in device_name.lower() for w in words)), None)
    if chip is not None:
        # fp32 matmuls run on the tensor cores (TF32) unless the precision is "highest", as Lightning counts them
        dtype = "tf32" if name == "fp32" and torch.get_float32_matmul_precision() != "highest" else name
        flops = GPU_PEAKS[chip].get(dtype)
        source = f"{device_name}: NVIDIA datasheet, dense"
        if flops is None:
            return PeakEstimate(
                None,
                dtype,
                device.type,
                source=source,
                estimate=False,
                reason=f"no {dtype} peak for {device_name} in GPU_PEAKS",
            )
        return PeakEstimate(flops, dtype, device.type, source=source, estimate=False)
    return _lightning_peak(device, name, device_name)


def _lightning_peak(device: torch.device, name: str, device_name: str) -> PeakEstimate:
    from lightning.fabric.utilities import throughput

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        peak = throughput.get_available_flops(device, _TORCH_DTYPES[name])
    dtype = name
    if name == "fp32" and device.type == "cuda" and torch.get_float32_matmul_precision() != "highest":
        dtype = "tf32" if torch.cuda.get_device_capability(device) >= (8, 0) else name
    source = f"{device_name}: Lightning's get_available_flops table"
    if not peak:
        why = str(caught[-1].message) if caught else f"{device_name} is not in Lightning's table"
        return PeakEstimate(None, dtype, device.type, source=source, estimate=False, reason=why)
    return PeakEstimate(float(peak), dtype, device.type, source=source, estimate=False)


def device_peak_flops(device: torch.device | str, dtype: torch.dtype | str = torch.float32) -> PeakEstimate:
    """The peak FLOP/s of ``device`` for ``dtype``: the CPU estimate, or a GPU's datasheet peak.

    CPUs: :func:`estimate_cpu_peak_flops` on this machine. CUDA: :data:`GPU_PEAKS` (H200, H100 NVL), else Lightning's
    ``get_available_flops`` (H100 SXM / PCIe, A100, L4, ...; fp32 counts as TF32 unless the float32 matmul precision
    is ``"highest"``). Other devices: Lightning's table (TPUs), else unknown.

    Args:
        device: a ``torch.device`` or its name.
        dtype: the dtype the matmuls run in.

    Returns:
        A :class:`PeakEstimate` (``flops=None`` and the reason when the device is in no table).

    Example::

        >>> device_peak_flops("cpu", torch.float32).device
        'cpu'
        >>> device_peak_flops("mps", torch.float32).reason
        'no peak FLOP/s table for mps devices'
    """
    device = torch.device(device)
    name = _dtype_name(dtype)
    if device.type == "cpu":
        return estimate_cpu_peak_flops(name)
    if device.type == "cuda":
        return _gpu_peak(device, name)
    if device.type == "xla":
        return _lightning_peak(device, name, "TPU")
    why = f"no peak FLOP/s table for {device.type} devices"
    return PeakEstimate(None, name, device.type, estimate=False, reason=why)
