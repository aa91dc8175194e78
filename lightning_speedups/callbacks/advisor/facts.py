"""What ``SpeedAdvisor`` reads off the live run at the end of its window: device and memory, loader, optimizers,
model layout, and the probes' measured effects on copies (kept apart from the callback's hooks and timing).

Each ``fill_*`` / ``measure_effects`` writes into the window's
:class:`~lightning_speedups.functional.advisor.Measurements`; the functional advisor turns them into findings.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable
from typing import Any

import lightning as L
import torch
from lightning.pytorch.utilities.model_helpers import is_overridden
from torch import nn

from lightning_speedups._errors import SpeedupConfigError
from lightning_speedups._peak import device_peak_flops
from lightning_speedups.callbacks.compile import TorchCompile
from lightning_speedups.functional import advisor as F
from lightning_speedups.functional.advisor import Finding, Measurements, OptimizerMeasurement, probes
from lightning_speedups.functional.advisor.rules import compile_may_pay_back
from lightning_speedups.functional.batch_size.cgroup import cgroup_memory
from lightning_speedups.measure import cpu_model, training_step_loss

__all__ = [
    "checksum",
    "compile_graphs",
    "compile_note",
    "fill_device_facts",
    "fill_loader_facts",
    "fill_peak_flops",
    "first_float_tensor",
    "measure_compile",
    "measure_effects",
    "memory_format_ok",
    "optimizer_measurements",
    "planned_steps",
    "process_rss",
    "train_dtype",
]


def memory_format_ok(module: nn.Module) -> tuple[bool, bool]:
    """(has a 2-D conv, every 2-D conv weight already channels_last)."""
    convs = [m for m in module.modules() if isinstance(m, nn.Conv2d)]
    if not convs:
        return False, False
    cl = all(m.weight.is_contiguous(memory_format=torch.channels_last) and not m.weight.is_contiguous() for m in convs)
    return True, cl


def checksum(p: torch.Tensor) -> tuple[float, float]:
    """Sum and sum of squares of a tensor (in float64): a cheap fingerprint to see whether it changed."""
    d = p.detach().double()
    return float(d.sum()), float((d * d).sum())


def first_float_tensor(batch: Any) -> torch.Tensor | None:
    """The batch's input tensor for the model-copy measurements: the first floating-point tensor in it."""
    if isinstance(batch, torch.Tensor):
        return batch if batch.is_floating_point() else None
    if isinstance(batch, dict):
        batch = list(batch.values())
    if isinstance(batch, (list, tuple)):
        for b in batch:
            if isinstance(b, torch.Tensor) and b.is_floating_point():
                return b
    return None


def process_rss() -> int:
    """Resident memory of this process in bytes (0 when psutil is unavailable)."""
    try:
        import psutil

        return int(psutil.Process().memory_info().rss)
    except Exception:  # noqa: BLE001
        return 0


def train_dtype(precision: str) -> torch.dtype:
    """The dtype the matmuls of a run in this Lightning ``precision`` run in (``"bf16-mixed"`` -> bfloat16)."""
    if "bf16" in precision:
        return torch.bfloat16
    if "16" in precision:
        return torch.float16
    return torch.float64 if "64" in precision else torch.float32


def fill_peak_flops(m: Measurements, device: torch.device, notes: list[str]) -> None:
    """The device's peak FLOP/s for the run's dtype: a datasheet peak on GPUs, an estimate on CPUs (said so)."""
    est = device_peak_flops(device, train_dtype(m.precision))
    m.peak_flops = est.flops
    m.peak_flops_estimated = est.estimate and est.known
    m.peak_flops_source = est.describe() if est.known else est.reason
    if not est.known:
        notes.append(f"device peak FLOP/s unknown ({est.reason}), so utilisation is not computed")
    elif m.peak_flops_estimated:
        notes.append(
            "utilisation on a CPU is against an estimated peak (ISA x cores x clock): an upper bound that only large "
            "matmuls approach, so compare runs with it rather than read it as a grade"
        )


def fill_device_facts(m: Measurements, device: torch.device, cuda: bool, rss_peak: int, notes: list[str]) -> None:
    """Device name, peak memory and headroom, bf16 / TF32 capability and the device's peak FLOP/s."""
    fill_peak_flops(m, device, notes)
    if cuda:
        m.device_name = torch.cuda.get_device_name(device)
        m.memory_kind = "cuda"
        m.peak_memory_bytes = int(torch.cuda.max_memory_allocated(device))
        free, total = torch.cuda.mem_get_info(device)
        m.memory_total_bytes = int(total)
        m.memory_available_bytes = int(free)
        m.cuda_bf16_supported = bool(torch.cuda.is_bf16_supported())
        m.tf32_off = torch.cuda.get_device_capability(device) >= (8, 0) and (
            torch.get_float32_matmul_precision() == "highest"
        )
        return
    m.device_name = cpu_model() if device.type == "cpu" else device.type
    m.memory_kind = "cpu_rss"
    m.peak_memory_bytes = rss_peak or None
    try:
        import psutil

        vm = psutil.virtual_memory()
        m.memory_total_bytes = int(vm.total)
        m.memory_available_bytes = int(vm.available)
    except Exception:  # noqa: BLE001
        return
    group = cgroup_memory()  # a container's, a pod's or a Slurm job's memory limit, where tighter than the host's
    if group is not None:
        m.memory_total_bytes = min(m.memory_total_bytes, group[0])
        m.memory_available_bytes = min(m.memory_available_bytes, group[1])


def fill_loader_facts(m: Measurements, loader: Any) -> None:
    """Which loader feeds training (the first one of several) and its ``num_workers``."""
    if isinstance(loader, dict):  # several train loaders (CombinedLoader): judge the first
        loader = next(iter(loader.values()), None)
    elif isinstance(loader, (list, tuple)):
        loader = loader[0] if loader else None
    if loader is not None:
        m.loader_kind = "DataLoader" if isinstance(loader, torch.utils.data.DataLoader) else type(loader).__name__
        m.num_workers = getattr(loader, "num_workers", None)


def optimizer_measurements(optimizers: Iterable[torch.optim.Optimizer]) -> list[OptimizerMeasurement]:
    """Class name and fused / foreach flags of each optimizer."""
    return [
        OptimizerMeasurement(
            name=type(o).__name__,
            fused=o.defaults.get("fused"),
            foreach=o.defaults.get("foreach"),
            fused_supported="fused" in o.defaults,
        )
        for o in optimizers
    ]


def _small(module: nn.Module) -> bool:
    """Model copies only while they are cheap: at most ~100M parameters."""
    return sum(p.numel() for p in module.parameters()) <= 100_000_000


def planned_steps(trainer: L.Trainer) -> int | None:
    """Training batches the run plans (``max_steps``, else ``max_epochs`` x batches per epoch, times gradient
    accumulation); ``None`` when unbounded or unknown (an iterable loader without ``max_steps``)."""
    try:
        n = float(trainer.estimated_stepping_batches)
        accumulate = max(1, int(trainer.accumulate_grad_batches))
    except Exception:  # noqa: BLE001 - e.g. accumulation that changes between epochs
        return None
    return int(n) * accumulate if math.isfinite(n) and n > 0 else None


def compile_graphs(trainer: L.Trainer, module: L.LightningModule) -> list[str]:
    """The graphs ``TorchCompile()`` would compile in this run: the training step's; the validation forward's when
    the run validates (eval mode is a new graph); one more when the training loader ends an epoch the run reaches on
    a smaller batch (a new shape: a recompile). A validation batch of another size is compiled with that graph."""
    graphs = ["training"]
    try:
        validates = trainer.limit_val_batches != 0 and is_overridden("validation_step", module)
        partial = _ends_smaller(trainer.train_dataloader)
        planned = planned_steps(trainer)
        per_epoch = _loader_len(trainer.train_dataloader)
        reaches_end = planned is None or not per_epoch or planned >= per_epoch
    except Exception:  # noqa: BLE001 - an unusual loader or trainer: count the training graph only
        return graphs
    if partial and reaches_end:
        graphs.append("last smaller training batch")
    if validates:
        graphs.append("validation")
    return graphs


def _loader_len(loader: Any) -> int | None:
    try:
        return len(loader)
    except TypeError:
        return None


def _ends_smaller(loader: Any) -> bool:
    """Whether a plain DataLoader ends its epoch on a smaller batch (``False`` for anything else)."""
    batch_size = getattr(loader, "batch_size", None)
    dataset = getattr(loader, "dataset", None)
    if not isinstance(batch_size, int) or dataset is None or getattr(loader, "drop_last", False):
        return False
    try:
        return len(dataset) % batch_size != 0
    except TypeError:
        return False


def _compile_skip_reason(module: nn.Module, batch: Any) -> str:
    if batch is None:
        return "no training batch kept to time"
    if not _small(module):
        return "model over 100M parameters: not copied to measure"
    if isinstance(module, L.LightningModule) and not module.automatic_optimization:
        return "manual optimization: its training_step cannot run outside the Trainer"
    return ""


def measure_compile(m: Measurements, module: nn.Module, batch: Any) -> None:
    """Time the compile and a compiled vs eager training step on copies (what ``TorchCompile()`` would compile),
    only when ``not_compiled`` could fire; fills ``m.compile_*``, or ``m.compile_note`` with why not."""
    if not compile_may_pay_back(m):
        return
    m.compile_note = _compile_skip_reason(module, batch)
    if m.compile_note:
        return
    lightning = isinstance(module, L.LightningModule)
    try:  # the modules `TorchCompile()` itself would compile
        attrs = TorchCompile().targets(module) if lightning else None
    except SpeedupConfigError:
        m.compile_note = "TorchCompile finds no module to compile here (pass it `compile_attr`)"
        return
    except Exception as err:  # noqa: BLE001 - the probe must never break the user's fit
        m.compile_note = f"probe failed: {type(err).__name__}: {err}"[:300]
        return
    dtype = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}.get(m.precision)  # the run's autocast
    loss = functools.partial(training_step_loss, quiet=True) if lightning else None  # the copy has no Trainer
    probe = probes.compile_speedup(module, batch, loss=loss, attrs=attrs, autocast_dtype=dtype)
    m.compile_s = probe.compile_s
    m.compile_speedup = probe.speedup
    m.compile_eager_s = probe.eager_step_s
    m.compile_note = f"probe failed: {probe.error}" if probe.error else ""


def compile_note(m: Measurements, findings: Iterable[Finding]) -> str | None:
    """Why a measured compile is not among the findings (not faster, or not paid back in the planned run)."""
    payback = m.compile_payback_steps
    s = m.compile_speedup
    if payback is None or s is None or any(f.key == "not_compiled" for f in findings):
        return None
    head = (
        f"torch.compile measured on a copy: {m.compile_s:.1f} s to compile, compiled step {float(s):.2f}x; the run "
        f"would compile {len(m.compile_graphs)} graph(s) ({', '.join(m.compile_graphs)})"
    )
    if not math.isfinite(payback):
        return f"{head}, not faster: compiling would only add its compile time, so it is not suggested"
    return (
        f"{head}; it pays back after {math.ceil(payback)} steps, more than the {m.planned_steps} planned, so it "
        "is not suggested (it would slow this run down)"
    )


def measure_effects(
    m: Measurements, module: nn.Module, optimizers: Iterable[torch.optim.Optimizer], example: torch.Tensor | None
) -> None:
    """Time bf16 (CPU), channels_last and fused optimizer steps on copies, so findings carry a measured effect."""
    x = example
    small = _small(module)
    if m.device_type == "cpu":
        if x is not None and small:
            m.bf16_speedup = F.bf16_autocast_speedup(module, x)
        threads = torch.get_num_threads()
        if x is not None and small and threads >= 2:
            m.torch_threads = threads
            m.fewer_threads = max(1, threads // 2)
            m.fewer_threads_speedup = F.fewer_threads_speedup(module, x, m.fewer_threads)
    if m.has_conv and not m.conv_channels_last and x is not None and x.dim() == 4 and small:
        m.channels_last_speedup = F.channels_last_speedup(module, x)
    for info, opt in zip(m.optimizers, optimizers):
        if info.fused_supported and not info.fused and small:
            info.fused_speedup = F.fused_optimizer_speedup(opt)
