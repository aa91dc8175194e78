"""Measurement helpers shared by every benchmark: interleaved timing, medians, ratios, machine description."""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import lightning as L
import torch

__all__ = [
    "BenchRow",
    "TimeToTarget",
    "interleaved_timings",
    "machine_info",
    "make_train_step",
    "median",
    "speed_ratio",
]


@dataclass
class BenchRow:
    """One line of a benchmark table: a candidate measured against its baseline in the same run.

    ``ratio`` is always "times faster" (> 1 means the candidate is faster; for latency or time-to-accuracy it is
    baseline_time / candidate_time). Accuracies are in [0, 1]; ``None`` when not measured.
    """

    technique: str
    variant: str
    metric: str
    baseline: float
    candidate: float
    ratio: float
    unit: str = ""
    accuracy_baseline: float | None = None
    accuracy_candidate: float | None = None
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def accuracy_delta(self) -> float | None:
        if self.accuracy_baseline is None or self.accuracy_candidate is None:
            return None
        return self.accuracy_candidate - self.accuracy_baseline

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["accuracy_delta"] = self.accuracy_delta
        return d


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def interleaved_timings(
    candidates: dict[str, Callable[[], Any]], repeats: int = 5, warmup: int = 1
) -> dict[str, list[float]]:
    """Time each callable ``repeats`` times, interleaved A B C A B C ..., after ``warmup`` untimed rounds.

    Interleaving spreads machine noise (other processes, thermal state) evenly over the candidates.
    """
    for _ in range(warmup):
        for fn in candidates.values():
            fn()
    times: dict[str, list[float]] = {name: [] for name in candidates}
    for _ in range(repeats):
        for name, fn in candidates.items():
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            start = time.perf_counter()
            fn()
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            times[name].append(time.perf_counter() - start)
    return times


def speed_ratio(baseline_times: Sequence[float], candidate_times: Sequence[float]) -> float:
    """``median(baseline) / median(candidate)``: how many times faster the candidate is."""
    return median(baseline_times) / max(median(candidate_times), 1e-12)


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info() -> dict[str, Any]:
    """CPU model, threads, torch version and device, printed above every benchmark table."""
    info: dict[str, Any] = {
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "device": "cpu",
    }
    if torch.cuda.is_available():
        info["device"] = torch.cuda.get_device_name(0)
        info["cuda_capability"] = ".".join(map(str, torch.cuda.get_device_capability(0)))
    return info


def make_train_step(
    model: torch.nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    optimizer: torch.optim.Optimizer | None = None,
    autocast_dtype: torch.dtype | None = None,
) -> Callable[[], float]:
    """A closure doing one forward/backward/optimizer step of ``model`` on ``(x, y)``; returns the loss.

    ``autocast_dtype=torch.bfloat16`` runs the forward under autocast on ``x``'s device, as ``precision="bf16-mixed"``.
    """
    optimizer = optimizer or torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    loss_fn = torch.nn.CrossEntropyLoss()
    model.train()

    def step() -> float:
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(x.device.type, dtype=autocast_dtype or torch.float32, enabled=autocast_dtype is not None):
            loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        return float(loss.detach())

    return step


class TimeToTarget(L.Callback):
    """Records ``(seconds since fit start, val_acc)`` per validation, and when ``val_acc`` first reaches ``target``.

    Args:
        target: the validation accuracy to time.
        stop: end the run once the target is reached (time-to-accuracy only); ``False`` keeps training to the end of
            the budget so the final accuracy can be reported too.
    """

    def __init__(self, target: float, stop: bool = True) -> None:
        self.target, self.stop = target, stop
        self.curve: list[tuple[float, float]] = []
        self.reached_at: float | None = None
        self.start = 0.0

    @property
    def accs(self) -> list[float]:
        return [acc for _, acc in self.curve]

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.start = time.perf_counter()

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        acc = float(trainer.callback_metrics.get("val_acc", 0.0))
        self.curve.append((time.perf_counter() - self.start, acc))
        if acc >= self.target and self.reached_at is None:
            self.reached_at = self.curve[-1][0]
            trainer.should_stop = self.stop
