"""Helpers shared by tests (import as ``from tests.helpers import quiet_trainer``)."""

from __future__ import annotations

import importlib.util
import random
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import lightning as L


def quiet_trainer(**kwargs: Any) -> L.Trainer:
    """A CPU Trainer with no logger, progress bar, model summary, sanity check or checkpointing unless asked for."""
    defaults: dict[str, Any] = dict(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        num_sanity_val_steps=0,
    )
    defaults.update(kwargs)
    return L.Trainer(**defaults)


def load_benchmark_script(name: str) -> ModuleType:
    """Import ``benchmarks/<name>.py`` (a script outside the package) as a module, as a test would run it."""
    path = Path(__file__).resolve().parents[1] / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def simulated_trials(seed: int, step_time: Callable[[int], float], jitter: float, outlier_every: int, cfg: Any):
    """A seeded ``measure(b)`` for ``search_batch_size`` and its simulated clock: no training.

    It runs a trial the way ``run_trial`` does (timed steps until ``cfg.trial_done``), each step costing
    ``step_time(b) * (1 +- jitter)``, times 3 one step in ``outlier_every``.
    """
    from lightning_speedups.functional.batch_size import BatchSizeTrial

    rng = random.Random(seed)
    now = [0.0]

    def measure(b: int) -> BatchSizeTrial:
        start = now[0]
        times = []
        seen = 0
        while not cfg.trial_done(len(times), seen, sum(times)):
            dt = step_time(b) * (1.0 + rng.uniform(-jitter, jitter))
            dt *= 3.0 if rng.random() < 1.0 / outlier_every else 1.0
            now[0] += dt
            times.append(dt)
            seen += b
        return BatchSizeTrial(b, max(b / t for t in times), 0, "ok", times, now[0] - start)

    return measure, lambda: now[0]
