"""The plan cache: measured plans and verdicts as plain JSON on disk, keyed by machine and model signature, written
atomically. autotune keeps its plans here and the recipes their layout and precision check."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lightning_speedups.measure.machine import machine_info

__all__ = ["PlanCache", "default_cache_dir", "plan_key"]

FORMAT_VERSION = 1


def default_cache_dir() -> Path:
    """``$LIGHTNING_SPEEDUPS_CACHE`` or ``~/.cache/lightning_speedups``."""
    env = os.environ.get("LIGHTNING_SPEEDUPS_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "lightning_speedups"


def plan_key(model: nn.Module, batch_shapes: list[list[int]], extra: dict[str, Any]) -> str:
    """A stable key: the machine (CPU/GPU, threads, torch), the model's class and parameter shapes, the batch shapes
    and the tuning options. Another machine, model or option set gets its own entry."""
    machine = machine_info()
    signature = {
        "machine": {k: machine.get(k) for k in ("cpu", "cpu_count", "torch_threads", "torch", "device")},
        "model": f"{type(model).__module__}.{type(model).__qualname__}",
        "params": [[n, list(p.shape), p.requires_grad] for n, p in model.named_parameters()],
        "batch": batch_shapes,
        "extra": extra,
    }
    return hashlib.sha256(json.dumps(signature, sort_keys=True, default=str).encode()).hexdigest()[:24]


class PlanCache:
    """``{key: plan}`` in one JSON file. A corrupt file, or one from another torch version, is ignored with a warning
    (the plan is re-measured); writes go to a temporary file that is renamed over the old one, so two runs at once
    never leave a half-written file."""

    def __init__(self, directory: str | os.PathLike[str] | None = None) -> None:
        self.path = Path(directory or default_cache_dir()) / "autotune.json"

    def _read(self) -> dict[str, Any]:
        if not self.path.exists():
            return {}
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError) as err:
            warnings.warn(
                f"autotune: ignoring the unreadable plan cache {self.path} ({err}); re-measuring.", stacklevel=3
            )
            return {}
        if not isinstance(data, dict) or data.get("format") != FORMAT_VERSION:
            warnings.warn(
                f"autotune: ignoring the plan cache {self.path} (unknown format); re-measuring.", stacklevel=3
            )
            return {}
        if data.get("torch") != str(torch.__version__):
            warnings.warn(
                f"autotune: ignoring the plan cache {self.path}, written with torch {data.get('torch')} (this is "
                f"{torch.__version__}); re-measuring.",
                stacklevel=3,
            )
            return {}
        plans = data.get("plans")
        return plans if isinstance(plans, dict) else {}

    def get(self, key: str) -> dict[str, Any] | None:
        plan = self._read().get(key)
        return plan if isinstance(plan, dict) else None

    def put(self, key: str, plan: dict[str, Any]) -> None:
        plans = self._read()
        plans[key] = plan
        payload = {"format": FORMAT_VERSION, "torch": str(torch.__version__), "plans": plans}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".autotune-", suffix=".json", dir=self.path.parent)
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(payload, f, indent=1, sort_keys=True)
            os.replace(tmp, self.path)  # atomic on POSIX: readers see the old file or the new one
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
