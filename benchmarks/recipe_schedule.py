"""Which LR schedule reaches the target in the fewest epochs inside ``fast_train``: epochs, not seconds.

Usage::

    python benchmarks/recipe_schedule.py digits --seeds 5    # about 4 minutes on 2 CPU cores
    python benchmarks/recipe_schedule.py shapes --seeds 4
    python benchmarks/recipe_schedule.py digits --only warmup_cosine,onecycle --seeds 2

Each schedule trains the end-to-end bench's recipe (``fast_train`` at batch 32, fp32, channels_last, the EMA, data
on the device) from the same seeds, validating every half epoch, and prints how many half epochs each run needed to
reach the bench's target (95% on digits, 90% on shapes) and the median. The step cost is the same for every
schedule, so epochs are what differ; load on the machine does not change the counts, only how long the script takes.
``fast_train``'s schedule (warm-up 5% to a peak of 3e-3, then cosine) was chosen with this script on 2026-12-01.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import warnings
from typing import Any

import lightning as L

from lightning_speedups.benchmarks import recipes as bench
from lightning_speedups.benchmarks._common import TrainClock
from lightning_speedups.demo import DemoClassifier
from lightning_speedups.optim import SchedulerConfig
from lightning_speedups.recipes import device_datamodule, fast_train

# name -> (peak lr, scheduler config)
SCHEDULES: dict[str, tuple[float, dict[str, Any]]] = {
    "warmup_cosine": (3e-3, dict(name="linear_warmup_cosine", warmup=0.05)),  # fast_train's default
    "warmup_cosine_2e-3": (2e-3, dict(name="linear_warmup_cosine", warmup=0.05)),
    "warmup_cosine_5e-3": (5e-3, dict(name="linear_warmup_cosine", warmup=0.05)),
    "warmup_cosine_1e-2": (1e-2, dict(name="linear_warmup_cosine", warmup=0.05)),
    "onecycle": (1e-2, dict(name="onecycle", pct_start=0.2)),  # fast_train's earlier schedule
    "onecycle_3e-3": (3e-3, dict(name="onecycle", pct_start=0.05)),
}


def half_epochs_to_target(task: str, schedule: str, seed: int, epochs: int = 5) -> int | None:
    """Half epochs the recipe with ``schedule`` needed from ``seed`` to reach the task's target (None: never)."""
    lr, config = SCHEDULES[schedule]
    target = bench.TASKS[task][1]
    L.seed_everything(seed, verbose=False)
    clock = TrainClock(target)
    model = DemoClassifier(width=32)
    recipe = fast_train(
        model=model, max_epochs=epochs, lr=lr, precision="32-true", channels_last=True, cache=False, **bench._QUIET
    )
    recipe.scheduler_config = SchedulerConfig(**config)
    recipe.apply(model)
    callbacks, kwargs = recipe
    kwargs = {k: v for k, v in kwargs.items() if k not in bench._QUIET}
    data = device_datamodule(bench.TASKS[task][0](), batch_size=32, seed=seed)
    L.seed_everything(seed, verbose=False)
    L.Trainer(callbacks=[*callbacks, clock], **kwargs, **bench._QUIET).fit(model, data)
    return next((i + 1 for i, (_t, acc) in enumerate(clock.curve) if acc >= target), None)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("task", choices=list(bench.TASKS))
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--only", default=",".join(SCHEDULES), help="comma-separated schedule names")
    args = parser.parse_args(argv)
    names = args.only.split(",")
    unknown = [n for n in names if n not in SCHEDULES]
    if unknown:
        parser.error(f"--only {unknown} unknown. Allowed values: {', '.join(SCHEDULES)}")
    warnings.filterwarnings("ignore")
    for name in ("lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.ERROR)
    counts: dict[str, list[int | None]] = {n: [] for n in names}
    for seed in range(args.seeds):  # seeds outer, schedules inner: every schedule sees the same seeds
        for name in names:
            counts[name].append(half_epochs_to_target(args.task, name, seed))
    print(f"{args.task}: half epochs to val_acc {bench.TASKS[args.task][1]:.2f} (seeds 0-{args.seeds - 1})")
    for name, got in counts.items():
        reached = [c for c in got if c is not None]
        med = f"{statistics.median(reached) / 2:.1f} epochs" if len(reached) == len(got) else "target missed"
        print(f"  {name:20s} {got}  median {med}")


if __name__ == "__main__":
    main()
