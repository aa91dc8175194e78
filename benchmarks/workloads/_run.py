"""Train one workload once and read off when it first reached its target (writes nothing)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import lightning as L
from typing_extensions import override

from benchmarks.workloads._registry import Workload, trainer_kwargs
from lightning_speedups._errors import check_bool, check_int

__all__ = ["TargetClock", "time_to_target"]


class TargetClock(L.Callback):
    """Records, at each validation, the training seconds so far, the step and the workload's metric.

    The clock starts at ``on_train_start`` (after the data module's ``setup`` and the loaders are built) and pauses
    while validation runs: validation is the measuring instrument, not training. Process CPU time is kept alongside.
    """

    def __init__(self, workload: Workload, stop_at_target: bool = False) -> None:
        self.workload = workload
        self.stop_at_target = stop_at_target
        self.curve: list[tuple[float, int, float]] = []  # (train seconds, global step, metric)
        self.cpu_curve: list[float] = []  # process CPU seconds of training at each point of ``curve``
        self.train_s = self.cpu_s = 0.0
        self._t0 = self._c0 = 0.0
        self.wall_start = self.wall_s = 0.0

    @override
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._t0 = self.wall_start = time.perf_counter()
        self._c0 = time.process_time()

    @override
    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.sanity_checking:
            self.train_s += time.perf_counter() - self._t0
            self.cpu_s += time.process_time() - self._c0

    @override
    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        value = trainer.callback_metrics.get(self.workload.metric)
        if value is not None:
            self.curve.append((self.train_s, trainer.global_step, float(value)))
            self.cpu_curve.append(self.cpu_s)
            if self.stop_at_target and self.workload.reached(float(value)):
                trainer.should_stop = True
        self._t0 = time.perf_counter()
        self._c0 = time.process_time()

    @override
    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        now = time.perf_counter()
        self.train_s += now - self._t0  # the steps after the last validation
        self.cpu_s += time.process_time() - self._c0
        self.wall_s = now - self.wall_start


def time_to_target(
    workload: Workload,
    seed: int = 0,
    callbacks: Sequence[L.Callback] = (),
    trainer_overrides: dict[str, Any] | None = None,
    small: bool = False,
    stop_at_target: bool = False,
) -> dict[str, Any]:
    """Train ``workload`` once (built with ``seed``) and report when its metric first reached the target.

    Args:
        workload: the task to train.
        seed: passed to ``workload.build`` and ``L.seed_everything``.
        callbacks: extra callbacks (the technique under test); fresh instances per call.
        trainer_overrides: ``L.Trainer`` arguments that replace the planned ones (:func:`trainer_kwargs`).
        small: build the workload's smoke-test size (the target does not apply then).
        stop_at_target: end the run at the first validation that reaches the target (time only, no final quality).

    Returns:
        ``name``, ``seed``, ``metric``, ``mode``, ``target``; ``time_to_target_s`` and ``steps_to_target`` (``None``
        when the target was not reached); ``best`` and ``final`` metric values (``None`` without a validation);
        ``steps`` (optimizer steps run), ``train_s`` (training seconds, validation excluded), ``wall_s`` (seconds
        from the first step to the end, validation included), ``curve``, a list of ``(train_s, step, value)``, and
        the same in process CPU seconds (``cpu_time_to_target_s``, ``cpu_s``): steadier than wall time on a machine
        shared with other jobs (all threads count, so it is about ``threads x`` the wall time on an idle machine).

    Example::

        >>> from dataclasses import replace
        >>> from benchmarks.workloads import get_workload
        >>> w = replace(get_workload("tabular_mlp"), target=2.0)  # accuracy never reaches 2
        >>> out = time_to_target(w, trainer_overrides={"max_steps": 3, "val_check_interval": 3}, small=True)
        >>> out["time_to_target_s"] is None, out["steps"]
        (True, 3)
    """
    check_int("seed", seed, 0)
    check_bool("small", small)
    check_bool("stop_at_target", stop_at_target)
    L.seed_everything(seed, workers=True, verbose=False)
    model, data = workload.build(seed, small=small)
    clock = TargetClock(workload, stop_at_target)
    trainer = L.Trainer(**trainer_kwargs(workload, **(trainer_overrides or {})), callbacks=[*callbacks, clock])
    trainer.fit(model, datamodule=data)
    hit = next(((t, step, c) for (t, step, v), c in zip(clock.curve, clock.cpu_curve) if workload.reached(v)), None)
    values = [v for _, _, v in clock.curve]
    best = (max(values) if workload.mode == "max" else min(values)) if values else None
    return {
        "name": workload.name,
        "seed": seed,
        "metric": workload.metric,
        "mode": workload.mode,
        "target": workload.target,
        "time_to_target_s": hit[0] if hit else None,
        "steps_to_target": hit[1] if hit else None,
        "cpu_time_to_target_s": hit[2] if hit else None,
        "best": best,
        "final": values[-1] if values else None,
        "steps": trainer.global_step,
        "train_s": clock.train_s,
        "wall_s": clock.wall_s,
        "cpu_s": clock.cpu_s,
        "curve": clock.curve,
    }
