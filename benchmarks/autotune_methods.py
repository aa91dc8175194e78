"""Which time-to-accuracy methods autotune adds by default: epochs to the target, not seconds.

Usage::

    python benchmarks/autotune_methods.py digits --seeds 5        # about 3 minutes on 2 CPU cores
    python benchmarks/autotune_methods.py shapes --seeds 5        # about 4 minutes
    python benchmarks/autotune_methods.py shapes --data loader --only ema,ema+schedule --interval 0.5

Every variant trains the end-to-end bench's plain baseline (``DemoClassifier`` with Adam at a constant 1e-3, batch
32, a 12-epoch plan) with fixed step-time settings (fp32, channels_last, and ``--data``: the data on the device with
batch augmentation, or the task's DataLoader with per-sample transforms, the two paths autotune chooses between), then
adds the variant's methods, built by autotune's own code. ``recipe`` is ``fast_train`` on the same data, for
reference. The settings are fixed rather than measured so that the counts do not depend on timing.
Each run validates every ``--interval`` of an epoch (default a quarter: half epochs are too coarse to tell methods
apart on tasks reached in one or two epochs) and the script prints how many intervals each run needed to reach the
bench's target (95% on digits, 90% on shapes). Step costs do not differ between variants, so load on the machine
does not change the counts, only how long the script takes.

A method enters autotune's default ``methods`` only when it needs fewer intervals on both tasks; the counts in
``lightning_speedups/autotune/methods.py`` come from this script (2026-12-01).
"""

from __future__ import annotations

import argparse
import logging
import statistics
import warnings
from typing import Any

import lightning as L

from lightning_speedups.autotune.methods import EMA_DECAY, SCHEDULE_PEAK, method_callbacks, schedule_warmup
from lightning_speedups.benchmarks import recipes as bench
from lightning_speedups.benchmarks._common import TrainClock
from lightning_speedups.callbacks.channels_last import ChannelsLast
from lightning_speedups.demo import DemoClassifier
from lightning_speedups.optim import OptimizerConfig, scale_lr
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


def intervals_to_target(
    task: str, variant: str, seed: int, interval: float, data_path: str = "device", batch_size: int = 32
) -> int | None:
    """Validation intervals the variant needed from ``seed`` to reach the task's target (None: never).

    The step-time settings are fixed, not measured, so the counts do not depend on timing: fp32, channels_last, and
    the data on the device (``data_path="device"``, batch augmentation) or the task's DataLoader with its per-sample
    transforms (``"loader"``): the two data paths autotune chooses between. A ``batch_size`` above the baseline's 32
    scales the learning rate by the square-root rule, as :meth:`~lightning_speedups.autotune.TunePlan.apply` does."""
    target = bench.TASKS[task][1]
    L.seed_everything(seed, verbose=False)
    data = bench.TASKS[task][0]()
    data.batch_size = batch_size
    if data_path == "device":
        data = device_datamodule(data, batch_size=batch_size, seed=seed)
    quiet: dict[str, Any] = {**bench._QUIET, "val_check_interval": interval}
    kwargs: dict[str, Any] = dict(accelerator="cpu", devices=1, precision="32-true", max_epochs=PLANNED_EPOCHS)
    if variant == "recipe":
        model = DemoClassifier(width=32)
        recipe = fast_train(
            model=model,
            max_epochs=5,
            lr=scale_lr(3e-3, batch_size, 32, "sqrt"),
            precision="32-true",
            channels_last=True,
            cache=False,
            **bench._QUIET,
        )
        recipe.apply(model)
        callbacks, kwargs = recipe
        kwargs = {k: v for k, v in kwargs.items() if k not in bench._QUIET}
    else:
        lr = scale_lr(1e-3, batch_size, 32, "sqrt")
        model = DemoClassifier(width=32, optimizer_config=OptimizerConfig("adam", lr=lr))
        methods, warmup = VARIANTS[variant]
        settings = {
            "ema": EMA_DECAY if "ema" in methods else None,
            "schedule": SCHEDULE_PEAK if "schedule" in methods else None,
        }
        data.setup("fit")
        epoch_steps = len(data.train_dataloader())
        if warmup is None:
            warmup = schedule_warmup(epoch_steps, PLANNED_EPOCHS * epoch_steps)
        callbacks = [ChannelsLast(), *method_callbacks(settings, kwargs, [], model, warmup, batch_size)]
    clock = TrainClock(target)
    L.seed_everything(seed, verbose=False)
    L.Trainer(callbacks=[*callbacks, clock], **kwargs, **quiet).fit(model, data)
    return next((i + 1 for i, (_t, acc) in enumerate(clock.curve) if acc >= target), None)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("task", choices=list(bench.TASKS))
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument(
        "--only",
        default="ema,ema+schedule,ema+schedule_5pct,recipe",
        help=f"comma-separated variants from {', '.join(VARIANTS)}",
    )
    parser.add_argument("--interval", type=float, default=0.25, help="validate every this fraction of an epoch")
    parser.add_argument(
        "--data",
        choices=["device", "loader"],
        default="device",
        help="the data path: on the device (batch augmentation) or the task's DataLoader",
    )
    parser.add_argument("--batch", type=int, default=32, help="batch size (lr scaled from 32 by the sqrt rule)")
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
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    for seed in seeds:  # seeds outer, variants inner: every variant sees the same seeds
        for name in names:
            counts[name].append(intervals_to_target(args.task, name, seed, args.interval, args.data, args.batch))
    print(
        f"{args.task} ({args.data} data, batch {args.batch}): validations (every {args.interval:g} epoch) to val_acc "
        f"{bench.TASKS[args.task][1]:.2f}, seeds {seeds[0]}-{seeds[-1]}"
    )
    for name, got in counts.items():
        reached = [c for c in got if c is not None]
        med = f"{statistics.median(reached) * args.interval:.2f} epochs" if len(reached) == len(got) else "missed"
        print(f"  {name:18s} {got}  median {med}")


if __name__ == "__main__":
    main()
