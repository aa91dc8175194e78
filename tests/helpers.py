"""Helpers shared by tests (import as ``from tests.helpers import quiet_trainer``)."""

from __future__ import annotations

import importlib.util
import json
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


class RankReport(L.Callback):
    """At the end of training, write ``rank{N}.json`` in ``path``: the parameters' checksum and each of ``fields``
    (a name and a function of the trainer, defined at module level so that ``ddp_spawn`` can pickle it)."""

    def __init__(self, path: Path, **fields: Callable[[L.Trainer], Any]) -> None:
        self.path = path
        self.fields = fields

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        report = {name: field(trainer) for name, field in self.fields.items()}
        report["checksum"] = float(sum(p.detach().double().sum() for p in pl_module.parameters()))
        (self.path / f"rank{trainer.global_rank}.json").write_text(json.dumps(report))

    @staticmethod
    def read(path: Path, ranks: int = 2) -> list[dict[str, Any]]:
        """The reports of ``ranks`` ranks, in rank order."""
        return [json.loads((path / f"rank{rank}.json").read_text()) for rank in range(ranks)]
