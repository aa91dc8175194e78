"""Peak FLOP/s: the CPU estimate from injected ISA flags, clock and cores; the GPU tables through mocks."""

from __future__ import annotations

import warnings

import pytest
import torch

from lightning_speedups import _peak, measure
from lightning_speedups._errors import SpeedupConfigError
from lightning_speedups._peak import GPU_PEAKS, PeakEstimate, device_peak_flops, estimate_cpu_peak_flops

AVX2 = "fpu sse sse2 avx fma avx2 f16c"
AVX512 = AVX2 + " avx512f avx512dq avx512bw avx512vl"
SPR = AVX512 + " avx512_bf16 avx512_fp16 amx_tile amx_bf16 amx_int8"
ZEN4 = AVX512 + " avx512_bf16"


def test_peak_cpu_avx2_amd_epyc():
    est = estimate_cpu_peak_flops(torch.float32, cores=2, ghz=2.45, flags=AVX2, vendor="AuthenticAMD")
    assert est.flops == pytest.approx(2 * 2.45e9 * 32) and est.flops == pytest.approx(156.8e9)
    assert (est.isa, est.flop_per_cycle_per_core, est.cores, est.ghz) == ("AVX2+FMA", 32.0, 2, 2.45)
    assert est.estimate and est.known and est.device == "cpu" and est.dtype == "fp32"
    assert est.describe() == (
        "estimated CPU peak 157 GFLOP/s fp32 (AVX2+FMA, 32 FLOP/cycle/core x 2 cores x 2.45 GHz; an estimate)"
    )
    # the demo step measured 69 GFLOP/s on 2 such cores: 44% of the estimate
    assert 69e9 / est.flops == pytest.approx(0.44, abs=0.005)
    with pytest.raises(AttributeError):
        est.flops = 1.0  # type: ignore[misc]  # frozen


def test_peak_cpu_isa_rules():
    intel = estimate_cpu_peak_flops(cores=2, ghz=1.8, flags=AVX512, vendor="GenuineIntel")
    assert intel.isa == "AVX-512" and intel.flop_per_cycle_per_core == 64 and intel.flops == pytest.approx(230.4e9)
    assert "estimated CPU peak 230 GFLOP/s fp32 (AVX-512, 64 FLOP/cycle/core x 2 cores x 1.8 GHz" in intel.describe()
    zen4 = estimate_cpu_peak_flops(cores=4, ghz=3.0, flags=ZEN4, vendor="AuthenticAMD")
    assert zen4.flop_per_cycle_per_core == 32 and "AMD, 2x256-bit" in zen4.isa  # AVX-512 as two 256-bit halves
    assert estimate_cpu_peak_flops(cores=1, ghz=2.0, flags="sse sse2 avx", vendor="").flop_per_cycle_per_core == 16
    assert estimate_cpu_peak_flops(cores=1, ghz=2.0, flags=["sse", "sse2"], vendor="").flop_per_cycle_per_core == 8
    neon = estimate_cpu_peak_flops(cores=4, ghz=3.0, flags="fp asimd evtstrm aes crc32", vendor="")
    assert (neon.isa, neon.flop_per_cycle_per_core, neon.flops) == ("NEON", 16.0, pytest.approx(192e9))
    sve = estimate_cpu_peak_flops(cores=1, ghz=2.6, flags="fp asimd sve", vendor="", vector_bits=256)
    assert (sve.isa, sve.flop_per_cycle_per_core) == ("SVE 256-bit", 32.0)
    sve_unknown = estimate_cpu_peak_flops(cores=1, ghz=2.6, flags="fp asimd sve", vendor="")
    assert sve_unknown.flop_per_cycle_per_core == 16 and "vector length unknown" in sve_unknown.describe()
    fp64 = estimate_cpu_peak_flops(torch.float64, cores=2, ghz=2.0, flags=AVX512, vendor="GenuineIntel")
    assert fp64.flop_per_cycle_per_core == 32 and fp64.dtype == "fp64"


def test_peak_cpu_bf16_and_fp16_units():
    amx = estimate_cpu_peak_flops(torch.bfloat16, cores=2, ghz=2.0, flags=SPR, vendor="GenuineIntel")
    assert (amx.isa, amx.flop_per_cycle_per_core, amx.dtype) == ("AMX-BF16", 1024.0, "bf16")
    assert amx.flops == pytest.approx(4096e9) and "an upper bound" in amx.describe()
    assert amx.describe().startswith("estimated CPU peak 4.1 TFLOP/s bf16")
    zen4 = estimate_cpu_peak_flops("bf16", cores=2, ghz=2.0, flags=ZEN4, vendor="AuthenticAMD")
    assert (zen4.isa, zen4.flop_per_cycle_per_core) == ("AVX512-BF16", 64.0)  # 2x the fp32 rate
    none = estimate_cpu_peak_flops("bfloat16", cores=2, ghz=2.45, flags=AVX2, vendor="AuthenticAMD")
    assert none.flop_per_cycle_per_core == 32 and none.flops == pytest.approx(156.8e9)
    assert "no bf16 units: counted at the fp32 rate" in none.describe() and none.isa == "AVX2+FMA"
    fp16 = estimate_cpu_peak_flops(torch.float16, cores=1, ghz=2.0, flags=SPR.replace(" amx_bf16", ""), vendor="")
    assert (fp16.isa, fp16.flop_per_cycle_per_core) == ("AVX512-FP16", 128.0)
    assert "no fp16 units" in estimate_cpu_peak_flops("fp16", cores=1, ghz=2.0, flags=AVX2, vendor="").reason


def test_peak_cpu_unknown_gives_none_and_the_reason(monkeypatch, tmp_path):
    est = estimate_cpu_peak_flops(cores=2, ghz=2.0, flags="ppc altivec", vendor="")
    assert est.flops is None and not est.known and "no known vector ISA" in est.reason
    assert est.describe().startswith("peak fp32 FLOP/s unknown: no known vector ISA")
    # no clock anywhere: never a guess
    monkeypatch.setattr(_peak, "_CPUINFO", tmp_path / "missing")
    monkeypatch.setattr(_peak, "_CPUFREQ_MAX", tmp_path / "missing")
    clockless = estimate_cpu_peak_flops(cores=2, flags=AVX2, vendor="")
    assert clockless.flops is None and "clock unknown" in clockless.reason and "`ghz=`" in clockless.reason
    assert clockless.isa == "AVX2+FMA" and clockless.flop_per_cycle_per_core == 32


def test_peak_cpu_reads_the_machine(monkeypatch, tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(
        "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 7B13\ncpu MHz\t\t: 2450.000\n"
        f"flags\t\t: {AVX2}\n\nprocessor\t: 1\nvendor_id\t: AuthenticAMD\ncpu MHz\t\t: 2449.000\nflags\t\t: {AVX2}\n"
    )
    monkeypatch.setattr(_peak, "_CPUINFO", cpuinfo)
    monkeypatch.setattr(_peak, "_CPUFREQ_MAX", tmp_path / "missing")
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    est = estimate_cpu_peak_flops()
    assert (est.isa, est.ghz, est.flops) == ("AVX2+FMA", 2.45, pytest.approx(156.8e9))
    assert est.cores == min(2, __import__("psutil").cpu_count(logical=False) or 2)
    freq = tmp_path / "max_freq"
    freq.write_text("3500000\n")  # kHz: cpufreq's maximum wins over the current `cpu MHz`
    monkeypatch.setattr(_peak, "_CPUFREQ_MAX", freq)
    assert estimate_cpu_peak_flops(cores=1).ghz == pytest.approx(3.5)
    # ARM: `Features`, no vendor_id, no cpu MHz; the SVE vector length from /proc/sys/abi
    cpuinfo.write_text("processor\t: 0\nFeatures\t: fp asimd evtstrm sve\nCPU implementer\t: 0x41\n")
    vl = tmp_path / "sve_vl"
    vl.write_text("32\n")  # bytes
    monkeypatch.setattr(_peak, "_SVE_VECTOR_LENGTH", vl)
    arm = estimate_cpu_peak_flops(cores=1)
    assert (arm.isa, arm.flop_per_cycle_per_core, arm.ghz) == ("SVE 256-bit", 32.0, 3.5)
    # off Linux: torch's CPU capability
    monkeypatch.setattr(_peak, "_CPUINFO", tmp_path / "missing")
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    assert estimate_cpu_peak_flops(cores=1, ghz=2.0).isa == "AVX2+FMA"
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
    assert estimate_cpu_peak_flops(cores=1, ghz=2.0, vendor="GenuineIntel").isa == "AVX-512"


def test_peak_misconfiguration():
    with pytest.raises(SpeedupConfigError, match=r"`dtype`=torch.int8 is not supported. Allowed values: torch.float32"):
        estimate_cpu_peak_flops(torch.int8)
    with pytest.raises(SpeedupConfigError, match=r"`dtype`='tf32' is not supported. Allowed values: .*'bf16'"):
        device_peak_flops("cpu", "tf32")
    with pytest.raises(SpeedupConfigError, match="`cores`=0 is out of range. Allowed values: an integer >= 1 or None"):
        estimate_cpu_peak_flops(cores=0, ghz=2.0, flags=AVX2)
    with pytest.raises(SpeedupConfigError, match="`cores`=-2 is out of range"):
        estimate_cpu_peak_flops(cores=-2, ghz=2.0, flags=AVX2)
    with pytest.raises(SpeedupConfigError, match=r"`ghz`=0 is out of range. Allowed values: a number in \(0.0, 20.0\]"):
        estimate_cpu_peak_flops(cores=1, ghz=0, flags=AVX2)
    with pytest.raises(SpeedupConfigError, match=r"`ghz`=2450 is out of range.*HINT: `ghz` is in GHz \(2.45\)"):
        estimate_cpu_peak_flops(cores=1, ghz=2450, flags=AVX2)
    with pytest.raises(SpeedupConfigError, match=r"`flags`=\[1, 2\] is not supported. Allowed values: a string"):
        estimate_cpu_peak_flops(cores=1, ghz=2.0, flags=[1, 2])  # type: ignore[list-item]
    with pytest.raises(SpeedupConfigError, match="`vector_bits`=64 is out of range"):
        estimate_cpu_peak_flops(cores=1, ghz=2.0, flags="asimd sve", vector_bits=64)


# ---- GPUs ----------------------------------------------------------------------------------------------------------
def _fake_gpu(monkeypatch, name: str, capability: tuple[int, int] = (9, 0)) -> None:
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)


@pytest.mark.parametrize(
    ("name", "dtype", "precision", "flops", "label"),
    [
        ("NVIDIA H200", torch.bfloat16, "highest", 989.4e12, "bf16"),
        ("NVIDIA H200", torch.float32, "highest", 66.9e12, "fp32"),
        ("NVIDIA H200", torch.float32, "high", 494.7e12, "tf32"),
        ("NVIDIA GH200 480GB", torch.bfloat16, "highest", 989.4e12, "bf16"),
        ("NVIDIA H200 NVL", torch.bfloat16, "highest", 835.5e12, "bf16"),
        ("NVIDIA H100 NVL", torch.float16, "highest", 835.5e12, "fp16"),
    ],
)
def test_peak_gpu_table_of_our_own(monkeypatch, name, dtype, precision, flops, label):
    _fake_gpu(monkeypatch, name)
    monkeypatch.setattr(torch, "get_float32_matmul_precision", lambda: precision)
    from lightning.fabric.utilities import throughput

    monkeypatch.setattr(throughput, "get_available_flops", lambda *a: pytest.fail("our table answers first"))
    est = device_peak_flops(torch.device("cuda", 0), dtype)
    assert (est.flops, est.dtype, est.device, est.estimate) == (flops, label, "cuda", False)
    assert "NVIDIA datasheet, dense" in est.describe() and "estimate" not in est.describe()


def test_peak_gpu_h100_sxm_through_lightning(monkeypatch):
    """H100 SXM / PCIe and older chips: Lightning's get_available_flops (mocked; the real one on the real name)."""
    from lightning.fabric.utilities import throughput

    _fake_gpu(monkeypatch, "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(torch, "get_float32_matmul_precision", lambda: "highest")
    # the real table first: Lightning knows the H100 SXM (989 TFLOP/s dense bf16)
    assert device_peak_flops("cuda", torch.bfloat16).flops == pytest.approx(989.4e12)
    calls = []
    monkeypatch.setattr(throughput, "get_available_flops", lambda d, t: calls.append((d.type, t)) or 312e12)
    est = device_peak_flops("cuda", "bf16")
    assert calls == [("cuda", torch.bfloat16)] and est.flops == 312e12 and not est.estimate
    assert est.describe() == "peak 312 TFLOP/s bf16 (NVIDIA H100 80GB HBM3: Lightning's get_available_flops table)"
    monkeypatch.setattr(torch, "get_float32_matmul_precision", lambda: "high")
    assert device_peak_flops("cuda", torch.float32).dtype == "tf32"  # Ampere+: fp32 matmuls on tensor cores


def test_peak_gpu_unknown_gives_none_and_the_reason(monkeypatch):
    from lightning.fabric.utilities import throughput

    def unknown(device, dtype):
        warnings.warn("FLOPs not found for 'Mystery GPU'", stacklevel=1)
        return None

    _fake_gpu(monkeypatch, "Mystery GPU", (7, 5))
    monkeypatch.setattr(throughput, "get_available_flops", unknown)
    est = device_peak_flops("cuda", torch.float32)
    assert est.flops is None and est.reason == "FLOPs not found for 'Mystery GPU'" and not est.estimate
    assert device_peak_flops("mps").reason == "no peak FLOP/s table for mps devices"
    assert all(set(v) == {"fp64", "fp32", "tf32", "bf16", "fp16"} for v in GPU_PEAKS.values())


def test_peak_exported_and_on_this_machine():
    assert {"PeakEstimate", "device_peak_flops", "estimate_cpu_peak_flops"} <= set(measure.__all__)
    est = measure.device_peak_flops("cpu")
    assert isinstance(est, PeakEstimate) and est.device == "cpu"
    assert est.flops is None or (est.flops > 0 and "an estimate" in est.describe())


def test_peak_in_the_advisor_bench_note():
    from lightning_speedups.benchmarks.advise import _utilisation_note

    summary = {"achieved_flops": 69e9, "peak_flops": 156.8e9, "utilisation": 69 / 156.8, "peak_flops_estimated": True}
    assert _utilisation_note(summary) == "baseline step 69.0 GFLOP/s = 44.0% of an estimated peak of 157 GFLOP/s"
    gpu = {"achieved_flops": 400e12, "peak_flops": 989.4e12, "utilisation": 400 / 989.4, "peak_flops_estimated": False}
    assert _utilisation_note(gpu).endswith("= 40.4% of the device's peak of 989 TFLOP/s")
    assert _utilisation_note({"achieved_flops": 1e9, "utilisation": None}).endswith("device peak unknown")
    assert _utilisation_note({}) == "FLOPs not counted"
