"""One table of test fixtures for the registered techniques: how to build each callback for a two-batch fit.

:data:`EXAMPLES` maps a technique's registry name to the constructor kwargs that make its callback train for two
batches on a demo task, and that task: ``"digits"`` (images, :class:`~lightning_speedups.demo.DigitsDataModule`) or
``"text"`` (token sequences, :class:`~lightning_speedups.demo.StdlibCodeDataModule`). The registry walk
(``tests/test_registry.py``) and the zoo (``tests/zoo/techniques.py``) build callbacks from it, and
``tests/test_registry.py`` fails when a technique registered with a callback has no entry here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["EXAMPLES", "Example"]


@dataclass(frozen=True)
class Example:
    """How the tests build one technique's callback: its constructor ``kwargs`` and the demo ``task`` it trains on."""

    kwargs: dict[str, Any] = field(default_factory=dict)
    task: str = "digits"


EXAMPLES: dict[str, Example] = {
    "speed_flags": Example({"verbose": False}),
    "fast_schedule": Example({"peak_factor": 3.0}),
    "batch_size_finder": Example(
        {"init_val": 16, "max_val": 32, "steps_per_trial": 1, "warmup_steps": 0, "progress_bar": False}
    ),
    "label_smoothing": Example({"smoothing": 0.1}),
    "pruning": Example({"amount": 0.5, "start_epoch": 0}),
    "token_throughput": Example({"window_size": 2}),
    "lr_finder": Example({"num_training_steps": 8, "max_lr": 0.1}),
    "channels_last": Example(),
    # a race that fits a fit of a few steps: two arms, no cool-down, one scored batch
    "optimizer_race": Example(
        {"arms": ["own", "own_lr_x3"], "max_cost": 1.0, "min_steps": 2, "cooldown_fraction": 0.0, "eval_batches": 1}
    ),
    "finetune": Example({"unfreeze_at_epoch": 1}),
    "muon": Example({"lr": 1e-3, "conv": "muon"}),
    "channels_last_trial": Example(),
    "sequence_batching": Example({"strategy": "length_grouped"}, task="text"),
    "qat": Example({"start_epoch": 0}),
    "float8": Example({"min_features": 16}),
    "schedule_free": Example({"bn_batches": 2}),
    "ema": Example({"decay": 0.99}),
    "advisor": Example({"warmup_steps": 1, "window_steps": 1, "measure_effects": False, "verbose": False}),
    "progressive_resizing": Example({"initial_scale": 0.5}),
    "precision_trial": Example(),
    "compile": Example({"backend": "eager"}),
}
