"""Which time-to-accuracy methods autotune adds by default: epochs to the target, not seconds.

Usage::

    python benchmarks/autotune_methods.py digits --seeds 5        # about 3 minutes on 2 CPU cores
    python benchmarks/autotune_methods.py shapes --seeds 5        # about 4 minutes
    python benchmarks/autotune_methods.py digits --only ema,ema+schedule,recipe --interval 0.5

Every variant trains the end-to-end bench's plain baseline (``DemoClassifier`` with Adam at a constant 1e-3, batch
32, a 12-epoch plan) under autotune's step-time plan for this machine (measured once, ``methods=[]``, cached for
the whole run, fp32), then adds the variant's methods. ``recipe`` is ``fast_train`` on the same data, for reference.
Each run validates every ``--interval`` of an epoch (default a quarter: half epochs are too coarse to tell methods
apart on tasks reached in one or two epochs) and the script prints how many intervals each run needed to reach the
bench's target (95% on digits, 90% on shapes). Step costs do not differ between variants, so load on the machine
does not change the counts, only how long the script takes.

A method enters autotune's default ``methods`` only when it needs fewer intervals on both tasks; the counts in
``lightning_speedups/_autotune_methods.py`` come from this script (2026-12-01).
"""

from __future__ import annotations

import argparse
import logging
import statistics
import tempfile
import warnings
from typing import Any

import lightning as L

from lightning_speedups._autotune_methods import EMA_DECAY, SCHEDULE_PEAK, method_callbacks, schedule_warmup
from lightning_speedups.autotune import autotune
from lightning_speedups.benchmarks import recipes as bench
from lightning_speedups.benchmarks._common import TrainClock
from lightning_speedups.demo import DemoClassifier
from lightning_speedups.optim import OptimizerConfig
from lightning_speedups.recipes import device_datamodule, fast_train

PLANNED_EPOCHS = 12


# name -> (autotune's methods it adds to the step-time plan, the schedule's warm-up: None for autotune's own)
VARIANTS: dict[str, tuple[list[str], float | None]] = {
    "none": ([], None),
    "ema": (["ema"], None),
    "ema+schedule": (["ema", "schedule"], None),  # autotune's default: a quarter-epoch warm-up
    "ema+schedule_5pct": (["ema", "schedule"], 0.05),  # 5% of the 12-epoch plan: 0.6 epoch
    "recipe": ([], None),  # fast_train itself, for reference
}


def intervals_to_target(task: str, variant: str, seed: int, interval: float, cache_dir: str) -> int | None:
    """Validation intervals the variant needed from ``seed`` to reach the task's target (None: never)."""
    target = bench.TASKS[task][1]
    L.seed_everything(seed, verbose=False)
    data = bench.TASKS[task][0]()
    quiet: dict[str, Any] = {**bench._QUIET, "val_check_interval": interval}
    if variant == "recipe":
        model = DemoClassifier(width=32)
        recipe = fast_train(model=model, max_epochs=5, precision="32-true", cache_dir=cache_dir, **bench._QUIET)
        recipe.apply(model)
        callbacks, kwargs = recipe
        kwargs = {k: v for k, v in kwargs.items() if k not in bench._QUIET}
        data = device_datamodule(data, batch_size=32, seed=seed)
    else:
        model = DemoClassifier(width=32, optimizer_config=OptimizerConfig("adam", lr=1e-3))
        data.setup("fit")
        plan = autotune(model, data, methods=[], no_bf16=True, budget_s=10, cache_dir=cache_dir, accelerator="cpu",
                        devices=1, max_epochs=PLANNED_EPOCHS)  # fmt: skip
        plan.apply(model, data)
        callbacks, kwargs = plan
        data = plan.datamodule or data
        methods, warmup = VARIANTS[variant]
        settings = {**plan.settings, "ema": EMA_DECAY if "ema" in methods else None,
                    "schedule": SCHEDULE_PEAK if "schedule" in methods else None}  # fmt: skip
        if warmup is None:
            warmup = schedule_warmup(len(data.train_dataloader()), PLANNED_EPOCHS * len(data.train_dataloader()))
        callbacks = [*callbacks, *method_callbacks(settings, kwargs, [], model, warmup, 32)]
    clock = TrainClock(target)
    L.seed_everything(seed, verbose=False)
    L.Trainer(callbacks=[*callbacks, clock], **kwargs, **quiet).fit(model, data)
    return next((i + 1 for i, (_t, acc) in enumerate(clock.curve) if acc >= target), None)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("task", choices=list(bench.TASKS))
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--only", default="ema,ema+schedule,ema+schedule_5pct,recipe",
                        help=f"comma-separated variants from {', '.join(VARIANTS)}")
    parser.add_argument("--interval", type=float, default=0.25, help="validate every this fraction of an epoch")
    args = parser.parse_args(argv)
    names = args.only.split(",")
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        parser.error(f"--only {unknown} unknown. Allowed values: {', '.join(VARIANTS)}")
    if not 0.0 < args.interval <= 1.0:
        parser.error(f"--interval {args.interval} is out of range. Allowed values: (0, 1]")
    warnings.filterwarnings("ignore")
    for name in ("lightning.pytorch", "lightning.fabric", "lightning_speedups"):
        logging.getLogger(name).setLevel(logging.ERROR)
    counts: dict[str, list[int | None]] = {n: [] for n in names}
    with tempfile.TemporaryDirectory() as cache_dir:  # one step-time plan for every run
        for seed in range(args.seeds):  # seeds outer, variants inner: every variant sees the same seeds
            for name in names:
                counts[name].append(intervals_to_target(args.task, name, seed, args.interval, cache_dir))
    print(f"{args.task}: validations (every {args.interval:g} epoch) to val_acc {bench.TASKS[args.task][1]:.2f}, "
          f"seeds 0-{args.seeds - 1}")  # fmt: skip
    for name, got in counts.items():
        reached = [c for c in got if c is not None]
        med = f"{statistics.median(reached) * args.interval:.2f} epochs" if len(reached) == len(got) else "missed"
        print(f"  {name:18s} {got}  median {med}")


if __name__ == "__main__":
    main()
