"""The workload suite: training tasks written the way users write them, to judge speedups on.

Each task is a *plain* ``L.LightningModule`` with its own ``configure_optimizers`` and a plain ``DataLoader`` with
per-sample work, trained offline (no downloads), and declares its metric, the target to time and its split:
``"dev"`` tasks may be used while building a technique, ``"held_out"`` tasks only to judge it.

Example::

    >>> from benchmarks.workloads import get_workload, list_workloads, trainer_kwargs
    >>> "gpt_stdlib" in list_workloads(split="dev"), "signal_cnn1d" in list_workloads(split="held_out")
    (True, True)
    >>> w = get_workload("gpt_stdlib")
    >>> w.metric, w.mode
    ('val_loss', 'min')
"""

from benchmarks.workloads import (  # noqa: F401  (registration)
    audio,
    denoising,
    graph,
    images,
    localization,
    recsys,
    segmentation,
    signals,
    tabular,
    text_cls,
    text_lm,
    text_mlm,
)
from benchmarks.workloads._registry import (
    KINDS,
    SPLITS,
    Workload,
    get_workload,
    list_workloads,
    register_workload,
    trainer_kwargs,
)
from benchmarks.workloads._run import TargetClock, time_to_target

__all__ = [
    # registry
    "KINDS",
    "SPLITS",
    "Workload",
    "get_workload",
    "list_workloads",
    "register_workload",
    "trainer_kwargs",
    # running
    "TargetClock",
    "time_to_target",
]
