"""What every benchmark shares: the :class:`BenchRow` record and the :class:`TimeToTarget` recorder.

The timing helpers live in :mod:`lightning_speedups.measure` (re-exported here for older imports).
"""

from __future__ import annotations

import contextlib
import logging
import time
import warnings
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import lightning as L
from lightning.fabric.utilities.warnings import PossibleUserWarning

from lightning_speedups.measure import interleaved_timings, machine_info, make_train_step, median, speed_ratio

__all__ = [
    "BenchRow",
    "TimeToTarget",
    "TrainClock",
    "interleaved_timings",
    "machine_info",
    "make_train_step",
    "median",
    "quiet_lightning",
    "speed_ratio",
]


# what the bench's own runs would print between its rows: Lightning's banners ("GPU available", the litlogger tip,
# "Loading `train_dataloader`"), the info lines of this package's callbacks (they log through Lightning's logger), and
# torch's one-time notes while inductor or torchao load
_QUIET_LOGGERS = {
    "lightning.pytorch": logging.WARNING,
    "lightning.fabric": logging.WARNING,
    "torch.utils._pytree": logging.ERROR,
    "torch.utils.cpp_extension": logging.ERROR,
}
# deprecations of Lightning and torch that a bench run cannot act on (messages as regular expressions)
_KNOWN_WARNINGS = (
    r"`isinstance\(treespec, LeafSpec\)` is deprecated",  # Lightning's _pytree on newer torch
    r"torch\.quantize_per_tensor, torch\.quantize_per_channel and other quantized tensor creation",  # eager int8
)


@contextlib.contextmanager
def quiet_lightning() -> Iterator[None]:
    """Inside: Lightning's banners and info lines silenced, its known deprecation warnings and its hints about the
    setup (``PossibleUserWarning``) filtered; the loggers' levels and the warning filters are restored after, so a
    user's own Trainer runs print as before.

    The bench runs every section inside it; a section run on its own (``python -m
    lightning_speedups.benchmarks.<x>``) does too.

    Example::

        >>> import lightning as L
        >>> with quiet_lightning():
        ...     trainer = L.Trainer(logger=False, enable_progress_bar=False)  # no "GPU available: ..." line
    """
    loggers = {name: logging.getLogger(name) for name in _QUIET_LOGGERS}
    levels = {name: logger.level for name, logger in loggers.items()}
    for name, logger in loggers.items():
        logger.setLevel(max(_QUIET_LOGGERS[name], logger.getEffectiveLevel()))
    try:
        with warnings.catch_warnings():
            for message in _KNOWN_WARNINGS:
                warnings.filterwarnings("ignore", message=message)
            # Lightning's hints about the user's own setup (few dataloader workers, a short epoch): the bench's runs
            # are small on purpose
            warnings.filterwarnings("ignore", category=PossibleUserWarning)
            yield
    finally:
        for name, logger in loggers.items():
            logger.setLevel(levels[name])


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


class TimeToTarget(L.Callback):
    """Records ``(seconds since fit start, val_acc)`` per validation, and when ``val_acc`` first reaches ``target``.

    Args:
        target: the validation accuracy to time.
        stop: end the run once the target is reached (time-to-accuracy only); ``False`` keeps training to the end of
            the budget so the final accuracy can be reported too.
    """

    def __init__(self, target: float, stop: bool = True) -> None:
        self.target = target
        self.stop = stop
        self.curve: list[tuple[float, float]] = []
        self.reached_at: float | None = None
        self.start = 0.0
        self.extra_s = 0.0  # seconds a caller counted before the fit (a recipe's probe, autotune's trials)

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


class TrainClock(TimeToTarget):
    """:class:`TimeToTarget` on training time: the clock is paused while validation runs.

    Also keeps the process CPU time to the target (``cpu_reached_at``): on a machine shared with other jobs, wall
    time includes waiting for a core, CPU time does not (with one torch thread the two agree on an idle machine).
    """

    _val_t0 = _val_c0 = 0.0

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_fit_start(trainer, pl_module)
        self.cpu_start = time.process_time()
        self.cpu_reached_at: float | None = None

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._val_t0 = time.perf_counter()
        self._val_c0 = time.process_time()

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.start += time.perf_counter() - self._val_t0  # validation so far is not training time
        self.cpu_start += time.process_time() - self._val_c0
        before = self.reached_at
        super().on_validation_epoch_end(trainer, pl_module)
        if before is None and self.reached_at is not None:
            self.cpu_reached_at = time.process_time() - self.cpu_start
        self._val_t0 = time.perf_counter()
        self._val_c0 = time.process_time()

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.start += time.perf_counter() - self._val_t0
        self.cpu_start += time.process_time() - self._val_c0
