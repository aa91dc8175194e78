"""Trainer settings for the hardware at hand (ways 1 and 9): accelerator, devices, strategy, precision.

``trainer_settings(...)`` turns "use my hardware well" into ``lightning.Trainer`` keyword arguments;
``explain_trainer_settings(...)`` returns the same plus the reason for each choice. Bad combinations raise
:class:`~lightning_speedups.SpeedupConfigError` before a Trainer exists.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from functools import lru_cache
from typing import Any

import torch
from lightning.pytorch.utilities import rank_zero_warn

from lightning_speedups._errors import SpeedupConfigError, check_choice
from lightning_speedups._registry import TechniqueInfo, register_technique
from lightning_speedups._settings_vocab import (
    _REMOVED_STRATEGIES,
    ACCELERATORS,
    PRECISIONS,
    STRATEGIES,
    TrainerSettings,
    _check_overrides,
    _normalise_precision,
)
from lightning_speedups.functional.advisor import bf16_autocast_speedup
from lightning_speedups.measure import describe_ratio

__all__ = [
    "TrainerSettings",
    "trainer_settings",
    "explain_trainer_settings",
    "enable_speed_flags",
    "cpu_bf16_speed_ratio",
    "cpu_bf16_is_fast",
    "ACCELERATORS",
    "PRECISIONS",
    "STRATEGIES",
]


# ---------------------------------------------------------------- hardware probes (patched in tests)
def _cuda_device_count() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _cuda_bf16_supported() -> bool:
    return bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())


def _torch_xla_installed() -> bool:
    return importlib.util.find_spec("torch_xla") is not None


def _tpu_device_count() -> int:
    if not _torch_xla_installed():
        return 0
    try:
        from lightning.pytorch.accelerators import XLAAccelerator

        return XLAAccelerator.auto_device_count() if XLAAccelerator.is_available() else 0
    except Exception:  # torch_xla present but no TPU runtime
        return 0


def _mps_available() -> bool:
    return bool(getattr(torch.backends, "mps", None) and torch.backends.mps.is_available())


def _in_jupyter() -> bool:
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None and hasattr(ipython, "get_ipython") else None  # type: ignore[attr-defined]
    return shell is not None and shell.__class__.__name__ == "ZMQInteractiveShell"


def _module_available(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


@lru_cache(maxsize=1)
def cpu_bf16_speed_ratio(repeats: int = 5) -> float:
    """How many times faster a small conv + linear training step is under bf16 autocast than in fp32 on this CPU.

    Measured once per process (about a second). A matmul alone is misleading: on a Xeon with AMX a bf16 matmul was
    20x faster than fp32 while a conv net's training step under bf16 autocast was 2x *slower*; on CPUs without bf16
    units (a 2-core AMD EPYC) bf16 is emulated and ~10x slower. So the probe runs convolutions and a matmul, forward
    and backward, like training does, interleaved through :func:`lightning_speedups.measure.compare` until the
    interval of the median ratio clears 1.3 or 3 s run out. The value is conservative (a
    :class:`~lightning_speedups.measure.MeasuredRatio`: the interval's end nearest 1, 1.0 within noise), so
    ``> 1.3`` means clearly 30% faster; its ``median``, ``interval`` and ``trials`` are the evidence.
    """
    gen = torch.Generator().manual_seed(0)
    nn = torch.nn
    # shaped like a small CNN training step: conv-BN-ReLU blocks, pooling, a linear head
    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1),
        nn.BatchNorm2d(16),
        nn.ReLU(),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.BatchNorm2d(32),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(4),
        nn.Flatten(),
        nn.Linear(512, 256),
        nn.ReLU(),
        nn.Linear(256, 10),
    )
    x = torch.randn(32, 3, 32, 32, generator=gen)

    ratio = bf16_autocast_speedup(model, x, repeats=repeats, budget_s=3.0, min_gain=0.3)  # fwd+bwd on copies
    return 1.0 if ratio is None else ratio  # no measurement: no evidence either way, so not "fast"


def cpu_bf16_is_fast() -> bool:
    """True when a bf16-autocast training step is clearly (the interval's low end) at least 30% faster than fp32."""
    return cpu_bf16_speed_ratio() > 1.3


# ---------------------------------------------------------------- settings
def _resolve_accelerator(accelerator: str, reasons: dict[str, str]) -> str:
    check_choice("accelerator", accelerator, ACCELERATORS)
    n_cuda = _cuda_device_count()
    if accelerator == "auto":
        if n_cuda:
            reasons["accelerator"] = f"{n_cuda} CUDA device(s) found"
            return "cuda"
        if _tpu_device_count():
            reasons["accelerator"] = "torch_xla found a TPU"
            return "tpu"
        if _mps_available():
            reasons["accelerator"] = "Apple MPS available"
            return "mps"
        reasons["accelerator"] = "no CUDA GPU, TPU or MPS device found"
        return "cpu"
    if accelerator in ("cuda", "gpu"):
        if n_cuda:
            reasons["accelerator"] = f"asked for; {n_cuda} CUDA device(s) found"
            return "cuda"
        if accelerator == "gpu" and _mps_available():
            reasons["accelerator"] = "asked for a GPU; Apple MPS is the GPU here"
            return "mps"
        raise SpeedupConfigError(
            f"`accelerator`={accelerator!r} but no CUDA GPU is available (torch.cuda.is_available() is False, "
            f"torch {torch.__version__}). Allowed values here: 'auto', 'cpu'. HINT: install a CUDA build of torch or "
            "use accelerator='auto'."
        )
    if accelerator == "tpu":
        if not _torch_xla_installed():
            raise SpeedupConfigError(
                "`accelerator`='tpu' needs `torch_xla`, which is not installed. HINT: pip install torch_xla "
                "(matching your torch version) on a TPU VM, or use accelerator='auto'."
            )
        if not _tpu_device_count():
            raise SpeedupConfigError("`accelerator`='tpu' but torch_xla finds no TPU device on this machine.")
        reasons["accelerator"] = "asked for; torch_xla found a TPU"
        return "tpu"
    if accelerator == "mps" and not _mps_available():
        raise SpeedupConfigError(
            "`accelerator`='mps' but Apple MPS is not available. Allowed values here: 'auto', 'cpu'."
        )
    reasons["accelerator"] = "asked for"
    return accelerator


def _available_devices(accelerator: str) -> int:
    return {"cuda": _cuda_device_count(), "tpu": _tpu_device_count(), "mps": 1}.get(accelerator, os.cpu_count() or 1)


def _resolve_devices(devices: Any, accelerator: str, reasons: dict[str, str]) -> tuple[Any, int]:
    """Return (devices argument for the Trainer, number of processes on this node)."""
    available = _available_devices(accelerator)
    if devices == "auto":
        if accelerator == "cpu":
            reasons["devices"] = "one process on CPU (torch already uses every core inside one process)"
            return 1, 1
        reasons["devices"] = f"all {available} {accelerator} device(s)"
        return available, available
    if devices == -1 or devices == "-1":
        reasons["devices"] = f"all {available} {accelerator} device(s)"
        return available, available
    if isinstance(devices, (list, tuple)):
        bad = [d for d in devices if not isinstance(d, int) or d < 0 or (accelerator != "cpu" and d >= available)]
        if not devices or bad:
            raise SpeedupConfigError(
                f"`devices`={list(devices)!r} names device indices that do not exist. Allowed values: indices in "
                f"0..{available - 1} ({available} {accelerator} device(s) present)."
            )
        reasons["devices"] = "asked for"
        return list(devices), len(devices)
    if isinstance(devices, str) and devices.isdigit():
        devices = int(devices)
    if not isinstance(devices, int) or isinstance(devices, bool) or devices < 1:
        raise SpeedupConfigError(
            f"`devices`={devices!r} is invalid. Allowed values: 'auto', -1 (all), a positive int, or a list of indices."
        )
    if accelerator != "cpu" and devices > available:
        raise SpeedupConfigError(
            f"`devices`={devices} but only {available} {accelerator} device(s) are present. "
            f"Allowed values: 1..{available}, 'auto' or -1."
        )
    if accelerator == "cpu" and devices > available:
        rank_zero_warn(f"`devices`={devices} CPU processes on {available} cores: they will compete for cores.")
    reasons["devices"] = "asked for"
    return devices, devices


def _resolve_strategy(strategy: Any, accelerator: str, world: int, num_nodes: int, reasons: dict[str, str]) -> Any:
    if not isinstance(strategy, str):  # a Strategy instance: the user knows what they want
        reasons["strategy"] = f"given as {type(strategy).__name__} instance"
        return strategy
    key = strategy.lower()
    if key in ("dp", "dataparallel", "ddp2", "horovod"):
        raise SpeedupConfigError(
            f"`strategy`={strategy!r}: " + _REMOVED_STRATEGIES["dp" if key == "dataparallel" else key]
        )
    from lightning.pytorch.strategies import StrategyRegistry

    allowed = ["auto", *StrategyRegistry.available_strategies()]
    check_choice("strategy", strategy, allowed, hint="for several GPUs or nodes use 'ddp'.")
    if strategy == "auto":
        if world * num_nodes <= 1:
            reasons["strategy"] = "a single device needs no distributed strategy"
            return "auto"
        if accelerator == "tpu":
            reasons["strategy"] = "several TPU cores: XLA's own data parallelism"
            return "xla"
        if _in_jupyter() and num_nodes == 1:
            reasons["strategy"] = "several devices inside Jupyter: DDP launched by forking the notebook kernel"
            return "ddp_notebook"
        reasons["strategy"] = (
            f"{world} device(s) x {num_nodes} node(s): one process per device, gradients all-reduced (DDP)"
        )
        return "ddp"
    if strategy.startswith("deepspeed") and not _module_available("deepspeed"):
        raise SpeedupConfigError(f"`strategy`={strategy!r} needs the `deepspeed` package. HINT: pip install deepspeed")
    if strategy.startswith(("deepspeed", "fsdp")) and accelerator != "cuda":
        raise SpeedupConfigError(
            f"`strategy`={strategy!r} shards a model across CUDA GPUs; accelerator is {accelerator!r}. "
            "Allowed values here: 'auto', 'ddp', 'ddp_spawn'."
        )
    if strategy in ("xla", "single_xla", "xla_debug", "single_tpu") and accelerator != "tpu":
        raise SpeedupConfigError(f"`strategy`={strategy!r} needs accelerator='tpu'; accelerator is {accelerator!r}.")
    if strategy.startswith("ddp_notebook") and num_nodes > 1:
        raise SpeedupConfigError("`strategy`='ddp_notebook' cannot span several nodes. Allowed values: 'ddp'.")
    reasons["strategy"] = "asked for"
    return strategy


def _resolve_precision(precision: str, accelerator: str, reasons: dict[str, str]) -> str:
    if precision == "auto":
        if accelerator == "cuda":
            if _cuda_bf16_supported():
                reasons["precision"] = "this GPU has bf16 units: bf16 autocast, no GradScaler needed"
                return "bf16-mixed"
            reasons["precision"] = "GPU without bf16: fp16 autocast with a GradScaler"
            return "16-mixed"
        if accelerator == "tpu":
            reasons["precision"] = "TPUs compute in bf16 natively"
            return "bf16-mixed"
        if accelerator == "cpu":
            ratio = cpu_bf16_speed_ratio()
            evidence = describe_ratio(ratio)
            evidence = f" ({evidence})" if evidence else ""
            if cpu_bf16_is_fast():
                reasons["precision"] = f"a bf16 training step measured {ratio:.2f}x faster than fp32 here{evidence}"
                return "bf16-mixed"
            reasons["precision"] = f"a bf16 training step {bf16_ratio_words(ratio)} on this CPU{evidence}: keep fp32"
            return "32-true"
        reasons["precision"] = "fp32 is the safe default on this device"
        return "32-true"
    if accelerator == "cpu" and precision in ("16-mixed", "16-true"):
        raise SpeedupConfigError(
            f"`precision`={precision!r} on CPU: fp16 autocast is not supported for training on CPU. "
            "Allowed values on CPU: '32-true', 'bf16-mixed', 'bf16-true', '64-true'. "
            "HINT: use precision='auto' to measure whether bf16 pays off on this CPU."
        )
    if accelerator == "cuda" and precision.startswith("bf16") and not _cuda_bf16_supported():
        raise SpeedupConfigError(
            f"`precision`={precision!r} but this GPU has no bf16 support. Allowed values here: '16-mixed', '32-true'."
        )
    if accelerator == "cpu" and precision.startswith("bf16"):
        ratio = cpu_bf16_speed_ratio()
        if ratio < 1.0:
            rank_zero_warn(
                f"precision={precision!r} on this CPU: a bf16 training step measured {ratio:.2f}x the speed of fp32 "
                "(no bf16 units), so training will be slower, not faster."
            )
        reasons["precision"] = f"asked for (bf16 training step {ratio:.2f}x fp32 speed on this CPU)"
        return precision
    reasons["precision"] = "asked for"
    return precision


def bf16_ratio_words(ratio: float) -> str:
    """What a measured bf16/fp32 step ratio says: ``"measured 0.42x the speed of fp32"``, or, for a conservative
    ratio of exactly 1.0 (the interval holds 1, or too few rounds fit), ``"was not measurably faster than fp32"``
    rather than a "1.00x" that hides the median beside it."""
    if float(ratio) == 1.0:
        return "was not measurably faster than fp32"
    return f"measured {float(ratio):.2f}x the speed of fp32"


def explain_trainer_settings(
    accelerator: str = "auto",
    devices: Any = "auto",
    strategy: Any = "auto",
    precision: Any = "auto",
    num_nodes: int = 1,
    **overrides: Any,
) -> TrainerSettings:
    """Pick Trainer arguments for this machine and say why.

    Args:
        accelerator: "auto" (CUDA, else TPU, else MPS, else CPU) or one of ``ACCELERATORS``.
        devices: "auto", -1, a count, or a list of device indices.
        strategy: "auto" (DDP for several devices or nodes, ``ddp_notebook`` in Jupyter, ``xla`` on TPU) or any
            Lightning strategy name or instance. ``"dp"`` is refused: Lightning 2 removed it.
        precision: "auto" (bf16-mixed on bf16 GPUs, 16-mixed on older GPUs, bf16 on TPU, on CPU fp32 unless a
            micro-measurement shows bf16 is faster) or any Lightning precision string.
        num_nodes: machines taking part; > 1 yields DDP, launched by torchrun or SLURM.
        **overrides: any other ``lightning.Trainer`` arguments, passed through (names are checked).

    Returns:
        TrainerSettings with ``.kwargs`` for ``lightning.Trainer(**kwargs)`` and ``.reasons``.

    Raises:
        SpeedupConfigError: on a removed or unknown strategy, missing hardware or packages, too many devices, an
            unknown precision, fp16 on CPU, or an unknown Trainer argument.
    """
    reasons: dict[str, str] = {}
    if not isinstance(num_nodes, int) or isinstance(num_nodes, bool) or num_nodes < 1:
        raise SpeedupConfigError(f"`num_nodes`={num_nodes!r} is invalid. Allowed values: an integer >= 1.")
    precision = _normalise_precision(precision)
    _check_overrides(overrides)
    acc = _resolve_accelerator(accelerator, reasons)
    devs, world = _resolve_devices(devices, acc, reasons)
    strat = _resolve_strategy(strategy, acc, world, num_nodes, reasons)
    prec = _resolve_precision(precision, acc, reasons)
    kwargs: dict[str, Any] = {"accelerator": acc, "devices": devs, "strategy": strat, "precision": prec}
    if num_nodes > 1:
        kwargs["num_nodes"] = num_nodes
        reasons["num_nodes"] = (
            "launch the same script on every node with torchrun or srun (SLURM); Lightning reads the env"
        )
    kwargs.update(overrides)
    for key in overrides:
        reasons[key] = "passed through"
    return TrainerSettings(kwargs, reasons)


def trainer_settings(
    accelerator: str = "auto",
    devices: Any = "auto",
    strategy: Any = "auto",
    precision: Any = "auto",
    num_nodes: int = 1,
    **overrides: Any,
) -> dict[str, Any]:
    """``lightning.Trainer`` keyword arguments for this machine (see :func:`explain_trainer_settings` for reasons).

    Example::

        >>> import lightning as L
        >>> trainer = L.Trainer(**trainer_settings(accelerator="cpu", precision="32-true", max_epochs=1, logger=False))
        >>> trainer.precision
        '32-true'
    """
    return explain_trainer_settings(accelerator, devices, strategy, precision, num_nodes, **overrides).kwargs


def enable_speed_flags(accelerator: str | None = None) -> dict[str, str]:
    """Set the global speed flags users forget; return ``{flag: what was done and why}``.

    On CUDA: TF32 matmuls (``torch.set_float32_matmul_precision("high")``) and cuDNN autotuning
    (``torch.backends.cudnn.benchmark = True``, best when input shapes do not change). On CPU and other devices these
    flags do nothing, so nothing is changed and the reason is returned.
    """
    acc = accelerator or ("cuda" if _cuda_device_count() else "cpu")
    if acc not in ("cuda", "gpu"):
        return {
            "float32_matmul_precision": f"unchanged: TF32 exists only on NVIDIA GPUs (accelerator={acc!r})",
            "cudnn.benchmark": f"unchanged: cuDNN is used only on NVIDIA GPUs (accelerator={acc!r})",
        }
    torch.set_float32_matmul_precision(
        "high"
    )  # TF32 tensor cores for fp32 matmuls: ~2x on Ampere+, tiny precision cost
    torch.backends.cudnn.benchmark = True  # autotune conv algorithms once per input shape
    return {
        "float32_matmul_precision": "set to 'high': fp32 matmuls use TF32 tensor cores",
        "cudnn.benchmark": "set to True: cuDNN picks the fastest convolution algorithm per input shape",
    }


register_technique(
    TechniqueInfo(
        name="trainer_settings",
        callback=None,
        functional=trainer_settings,
        summary="accelerator/devices/DDP/precision picked for this hardware, with reasons; bench: bf16 vs fp32",
        ways=(1, 9),
        bench="lightning_speedups.benchmarks.precision:run",
    )
)
