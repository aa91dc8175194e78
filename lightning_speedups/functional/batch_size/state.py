"""What the batch-size search measures and puts back: peak memory per trial, and a bitwise training-state snapshot.

Plain PyTorch (torchmetrics states included); the framework internals it needs (RNG states, metric accumulators)
come from :mod:`lightning_speedups._compat`. Re-exported by :mod:`lightning_speedups.functional.batch_size`.
"""

from __future__ import annotations

import copy
import gc
import os
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from lightning_speedups._compat import collect_rng_states, metric_state, restore_metric_state, restore_rng_states
from lightning_speedups.functional.batch_size.cgroup import cgroup_memory_room

__all__ = ["MemoryMeter", "snapshot_training_state"]


# --------------------------------------------------------------------------------------------------- memory
class MemoryMeter:
    """Peak memory of one trial: CUDA ``max_memory_reserved`` on a GPU, peak RSS of the process on CPU.

    On Linux the kernel's own high-water mark (``VmHWM``) is reset through ``/proc/self/clear_refs``; elsewhere a
    background thread samples ``psutil`` RSS every 2 ms.
    """

    def __init__(self, device: torch.device, local_world_size: int = 1) -> None:
        self.device = device
        self.local_world_size = max(1, local_world_size)
        self._hwm = self._can_reset_hwm() if device.type != "cuda" else False
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._peak = 0

    @staticmethod
    def _can_reset_hwm() -> bool:
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            return MemoryMeter._read_status("VmHWM") > 0
        except OSError:
            return False

    @staticmethod
    def _read_status(key: str) -> int:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
        return 0

    def current(self) -> int:
        """Memory held now (bytes)."""
        if self.device.type == "cuda":
            return int(torch.cuda.memory_reserved(self.device))
        import psutil

        return int(psutil.Process(os.getpid()).memory_info().rss)

    def capacity(self) -> int:
        """Bytes this process may use: total device memory, or on CPU what it holds plus its share of the rest (the
        machine's available memory, or less where a cgroup's memory limit leaves less: containers, pods, Slurm)."""
        if self.device.type == "cuda":
            return int(torch.cuda.mem_get_info(self.device)[1])
        import psutil

        free = int(psutil.virtual_memory().available)
        room = cgroup_memory_room()
        return self.current() + (free if room is None else min(free, room)) // self.local_world_size

    def start(self) -> None:
        if self.device.type == "cuda":
            gc.collect()  # on CPU freed Python objects do not lower RSS: skip the collection there
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(self.device)
        elif self._hwm:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
        else:
            self._peak = self.current()
            self._stop.clear()
            self._thread = threading.Thread(target=self._poll, daemon=True)
            self._thread.start()

    def _poll(self) -> None:
        while not self._stop.wait(0.002):
            self._peak = max(self._peak, self.current())

    def stop(self) -> int:
        """Peak bytes since ``start()``."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            return int(torch.cuda.max_memory_reserved(self.device))
        if self._hwm:
            return self._read_status("VmHWM")
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        return max(self._peak, self.current())


# ---------------------------------------------------------------------------------------------- snapshots
def _to_cpu(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: _to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_cpu(v) for v in obj)
    return copy.deepcopy(obj)


def _metric_modules(model: nn.Module) -> list[nn.Module]:
    try:
        from torchmetrics import Metric
    except ImportError:  # pragma: no cover - torchmetrics ships with lightning
        return []
    return [m for m in model.modules() if isinstance(m, Metric)]


@contextmanager
def snapshot_training_state(
    model: nn.Module,
    optimizers: Sequence[torch.optim.Optimizer] = (),
    schedulers: Sequence[Any] = (),
    extra: Sequence[Any] = (),
) -> Iterator[None]:
    """Put parameters, buffers, gradients, optimizer/scheduler state, metric states, module modes and RNG back.

    Everything is copied to CPU memory (no files, no extra device memory) and restored bitwise on exit, also when
    the body raises. ``extra`` takes more objects with ``state_dict``/``load_state_dict`` (e.g. a ``GradScaler``).
    """
    tensors = {f"p.{n}": p for n, p in model.named_parameters()} | {f"b.{n}": b for n, b in model.named_buffers()}
    saved = {k: _to_cpu(v) for k, v in tensors.items()}
    grads = {n: (None if p.grad is None else _to_cpu(p.grad)) for n, p in model.named_parameters()}
    modes = {n: m.training for n, m in model.named_modules()}
    opt_states = [_to_cpu(o.state_dict()) for o in optimizers]
    sched_states = [_to_cpu(s.state_dict()) for s in schedulers]
    extra_states = [_to_cpu(e.state_dict()) for e in extra]
    metric_states = []
    for m in _metric_modules(model):
        states, count, computed = metric_state(m)
        metric_states.append((m, {a: _to_cpu(v) for a, v in states.items()}, count, computed))
    rng = collect_rng_states(include_cuda=torch.cuda.is_available() and torch.cuda.is_initialized())
    try:
        yield
    finally:
        with torch.no_grad():
            for k, v in tensors.items():
                v.copy_(saved[k])
            for n, p in model.named_parameters():
                g = grads[n]
                p.grad = None if g is None else g.to(p.device)
        for n, m in model.named_modules():
            if n in modes:
                m.training = modes[n]
        for o, s in zip(optimizers, opt_states):
            o.load_state_dict(s)
        for sch, s in zip(schedulers, sched_states):
            sch.load_state_dict(s)
        for e, s in zip(extra, extra_states):
            e.load_state_dict(s)
        for m, states, count, computed in metric_states:
            live = metric_state(m)[0]  # the saved copies go back to each state's current device
            devices = {a: v.device for a, v in live.items() if isinstance(v, torch.Tensor)}
            moved = {a: v.to(devices[a]) if torch.is_tensor(v) and a in devices else v for a, v in states.items()}
            restore_metric_state(m, moved, count, computed)
        restore_rng_states(rng)
