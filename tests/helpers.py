"""Helpers shared by tests (import as ``from tests.helpers import quiet_trainer``)."""

from __future__ import annotations

import importlib.util
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
