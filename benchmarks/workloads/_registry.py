"""The workload record, its registry and the Trainer settings a runner builds from it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import lightning as L

from lightning_speedups._errors import SpeedupConfigError, check_callable, check_choice, check_int, check_range

__all__ = [
    "KINDS",
    "MODES",
    "SPLITS",
    "BuildFn",
    "Workload",
    "get_workload",
    "list_workloads",
    "register_workload",
    "trainer_kwargs",
]

KINDS = (
    "image_cnn",
    "image_resnet",
    "image_convnext",
    "image_transformer",
    "image_segmentation",
    "image_denoising",
    "image_localization",
    "transformer_lm",
    "transformer_cls",
    "transformer_mlm",
    "recurrent",
    "tabular",
    "signal_cnn",
    "audio_cnn",
    "graph_gnn",
    "recsys_embedding",
)
SPLITS = ("dev", "held_out")
MODES = ("max", "min")

# build(seed, small=False) -> (a plain LightningModule, a LightningDataModule); ``small`` is for smoke tests only
BuildFn = Callable[..., tuple[L.LightningModule, L.LightningDataModule]]


@dataclass(frozen=True)
class Workload:
    """One training task written the way users write it, with the quality it should reach and how long to train.

    Args:
        name: short unique name, e.g. ``"gpt_stdlib"``.
        kind: the family of model, one of :data:`KINDS`.
        split: ``"dev"`` (techniques may be tuned on it) or ``"held_out"`` (only for judging them).
        metric: the name the module logs during validation, e.g. ``"val_acc"``.
        mode: ``"max"`` when higher is better, ``"min"`` when lower is.
        target: the quality a run must reach; calibrated near the plateau of the planned run.
        description: what the task is and what was measured when the target was set.
        build: ``build(seed, small=False)`` returns a fresh ``(model, datamodule)``; ``small=True`` shrinks the
            data for smoke tests (the target does not apply then).
        max_epochs: planned run length in epochs (``None`` when ``max_steps`` sets it).
        max_steps: planned run length in optimizer steps (``-1`` when ``max_epochs`` sets it).
        val_check_interval: how often to validate, as Lightning takes it (a fraction of an epoch or a step count),
            so the time to the target can be read off the validations.
        reference_s: training seconds to the target measured once on the reference machine (see ``description``).

    Example::

        >>> from benchmarks.workloads import get_workload
        >>> w = get_workload("tabular_mlp")
        >>> w.kind, w.mode, w.reached(w.target)
        ('tabular', 'max', True)
    """

    name: str
    kind: str
    split: str
    metric: str
    mode: str
    target: float
    description: str
    build: BuildFn
    max_epochs: int | None = None
    max_steps: int = -1
    val_check_interval: float | int = 1.0
    reference_s: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise SpeedupConfigError(f"`name`={self.name!r} is empty. Allowed values: a non-empty string.")
        check_choice("kind", self.kind, KINDS)
        check_choice("split", self.split, SPLITS)
        check_choice("mode", self.mode, MODES)
        check_range("target", self.target)
        check_callable("build", self.build, "a callable(seed, small=False) -> (LightningModule, LightningDataModule)")
        check_int("max_epochs", self.max_epochs, 1, optional=True)
        check_int("max_steps", self.max_steps, -1)
        if self.max_epochs is None and self.max_steps == -1:
            raise SpeedupConfigError(
                f"`max_steps`=-1 with `max_epochs`=None leaves workload {self.name!r} without a planned length. "
                "Allowed values: a max_epochs >= 1 or a max_steps >= 1."
            )

    def reached(self, value: float) -> bool:
        """Whether ``value`` of :attr:`metric` meets :attr:`target` (``>=`` for ``"max"``, ``<=`` for ``"min"``)."""
        return value >= self.target if self.mode == "max" else value <= self.target


_WORKLOADS: dict[str, Workload] = {}


def register_workload(workload: Workload) -> Workload:
    """Add (or replace) a workload in the registry and return it."""
    _WORKLOADS[workload.name] = workload
    return workload


def list_workloads(split: str | None = None) -> list[str]:
    """Names of the registered workloads in registration order, optionally only those of one ``split``."""
    if split is not None:
        check_choice("split", split, SPLITS)
    return [name for name, w in _WORKLOADS.items() if split is None or w.split == split]


def get_workload(name: str) -> Workload:
    """Look a workload up by name; unknown names raise and list the registered ones."""
    if name not in _WORKLOADS:
        raise SpeedupConfigError(
            f"`workload`={name!r} is not registered. Allowed values: {', '.join(map(repr, _WORKLOADS))}."
        )
    return _WORKLOADS[name]


def trainer_kwargs(workload: Workload, **overrides: Any) -> dict[str, Any]:
    """``L.Trainer`` keyword arguments for the planned run of ``workload``: CPU, fp32, no logger or checkpoints.

    Example::

        >>> from benchmarks.workloads import get_workload
        >>> kw = trainer_kwargs(get_workload("gpt_stdlib"), max_steps=2)
        >>> kw["accelerator"], kw["max_steps"]
        ('cpu', 2)
    """
    kwargs: dict[str, Any] = {
        "accelerator": "cpu",
        "devices": 1,
        "precision": "32-true",
        "max_epochs": workload.max_epochs if workload.max_epochs is not None else -1,
        "max_steps": workload.max_steps,
        "val_check_interval": workload.val_check_interval,
        "num_sanity_val_steps": 0,
        "logger": False,
        "enable_checkpointing": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
    }
    kwargs.update(overrides)
    return kwargs
