"""Time-to-accuracy benchmark of label smoothing, EMA, progressive resizing and FastSchedule, on two tasks.

Each method is the baseline plus one callback. The baseline is the same on both tasks: a ``DemoClassifier``, Adam at
a constant 1e-3, batch 64, fp32, data kept on the device with batch augmentation (so the row measures the method,
not the data path). The two tasks ship with the package:

* ``digits``: scikit-learn's handwritten digits (1437 train / 360 val), 32x32, random crop (pad 2);
* ``shapes``: the generated CIFAR-shaped ``ShapesDataModule`` (10 classes), random crop (pad 4) + flip.

Runs alternate baseline, method, baseline, method... (seeds 0, 1, 2 in full mode), so machine noise reaches both
alike. The metric is the training time until validation accuracy first reaches the target, validated every half
epoch; validation time is excluded (it is the measuring instrument, and EMA's weight swap is part of it). Rows give
the median over runs, the ratio (> 1: the method gets there sooner), how many runs reached the target, and the
median final validation accuracy at the end of the epoch budget next to it ("target not reached" / "no speedup"
when so). The note adds the same ratio in process CPU time, steadier than wall time on a machine shared with other
jobs; ``extra`` holds every run's times and the epochs each needed.

Run: ``python -m lightning_speedups.benchmarks.time_to_accuracy [--full] [--threads 1]`` (all four methods against
one shared, interleaved baseline); ``lightning-speedups bench --only ema`` runs one method against its own baseline.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import lightning as L

from lightning_speedups._errors import SpeedupConfigError, check_range
from lightning_speedups.benchmarks._common import BenchRow, TrainClock, quiet_lightning
from lightning_speedups.callbacks.ema import EMA
from lightning_speedups.callbacks.fast_schedule import FastSchedule
from lightning_speedups.callbacks.label_smoothing import LabelSmoothing
from lightning_speedups.callbacks.progressive_resizing import ProgressiveResizing
from lightning_speedups.demo import DemoClassifier, DigitsDataModule, ShapesDataModule
from lightning_speedups.measure import median
from lightning_speedups.optim import OptimizerConfig
from lightning_speedups.recipes import device_datamodule

__all__ = [
    "METHODS",
    "compare",
    "run",
    "run_ema",
    "run_fast_schedule",
    "run_label_smoothing",
    "run_progressive_resizing",
]

# the callbacks each method adds to the baseline (fresh instances per run)
METHODS: dict[str, Callable[[], list[L.Callback]]] = {
    "label_smoothing": lambda: [LabelSmoothing(0.1)],
    "ema": lambda: [EMA(decay=0.999, warmup=True)],
    "progressive_resizing": lambda: [ProgressiveResizing(initial_scale=0.5, finetune_fraction=0.2, delay_fraction=0.5)],
    "fast_schedule": lambda: [FastSchedule(warmup=0.05, peak_factor=3.0, decay="linear")],
}
BATCH_SIZE = 64
LR = 1e-3


@dataclass(frozen=True)
class _Task:
    name: str
    describe: str
    width: int
    epochs: int
    target: float
    make: Callable[[int], L.LightningDataModule]


def _tasks(quick: bool) -> list[_Task]:
    def digits(seed: int) -> L.LightningDataModule:
        return device_datamodule(DigitsDataModule(batch_size=BATCH_SIZE), batch_size=BATCH_SIZE, seed=seed)

    def shapes(n_train: int, n_val: int) -> Callable[[int], L.LightningDataModule]:
        def make(seed: int) -> L.LightningDataModule:
            source = ShapesDataModule(n_train=n_train, n_val=n_val, batch_size=BATCH_SIZE)
            return device_datamodule(source, batch_size=BATCH_SIZE, hflip=0.5, seed=seed)

        return make

    if quick:  # a few seconds per run on 2 cores: checks the plumbing; use --full for numbers
        return [
            _Task("digits", "digits 32px, width 8", 8, 4, 0.6, digits),
            _Task("shapes", "shapes 1024 train, width 8", 8, 3, 0.5, shapes(1024, 256)),
        ]
    return [
        _Task("digits", "digits 32px, width 16", 16, 8, 0.95, digits),
        _Task("shapes", "shapes 2048 train, width 16", 16, 6, 0.95, shapes(2048, 512)),
    ]


def train_once(task: _Task, method: str | None, seed: int, target: float, stop: bool) -> TrainClock:
    """Train the baseline (``method=None``) or baseline + ``METHODS[method]`` once; the recorder holds the curve."""
    L.seed_everything(seed, verbose=False)
    model = DemoClassifier(width=task.width, optimizer_config=OptimizerConfig("adam", lr=LR))
    clock = TrainClock(target, stop=stop)
    callbacks = [*(METHODS[method]() if method else []), clock]
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=task.epochs,
        val_check_interval=0.5,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        callbacks=callbacks,
    )
    trainer.fit(model, task.make(seed))
    return clock


def _reached(recs: Sequence[TrainClock], cpu: bool = False) -> list[float]:
    times = [r.cpu_reached_at if cpu else r.reached_at for r in recs]
    return [t if t is not None else math.inf for t in times]


def _ratio(base: float, cand: float) -> float:
    return base / cand if math.isfinite(base) and math.isfinite(cand) else float("nan")


def _epochs_to_target(rec: TrainClock, target: float) -> float | None:
    return next(((i + 1) / 2 for i, acc in enumerate(rec.accs) if acc >= target), None)  # validated every 1/2 epoch


def _row(task: _Task, method: str, target: float, base: list[TrainClock], cand: list[TrainClock]) -> BenchRow:
    t_base = median(_reached(base))
    t_cand = median(_reached(cand))
    ratio = _ratio(t_base, t_cand)
    cpu_ratio = _ratio(median(_reached(base, cpu=True)), median(_reached(cand, cpu=True)))
    hits_b = sum(r.reached_at is not None for r in base)
    hits_c = sum(r.reached_at is not None for r in cand)
    n = len(base)
    if not math.isfinite(t_cand) and not math.isfinite(t_base):
        note = f"target not reached by either (in most runs) within {task.epochs} epochs"
    elif not math.isfinite(t_cand):
        note = f"target not reached by {method} in {n - hits_c}/{n} runs within {task.epochs} epochs"
    elif not math.isfinite(t_base):
        note = f"target not reached by the baseline in {n - hits_b}/{n} runs within {task.epochs} epochs; {method} did"
    elif ratio < 1.05:
        note = "no speedup"
    else:
        note = f"{ratio:.2f}x sooner"
    note += f"; reached in {hits_c}/{n} vs {hits_b}/{n} runs; median of {n} interleaved run(s)"
    if math.isfinite(cpu_ratio):
        note += f"; CPU-time ratio {cpu_ratio:.2f}x"
    stop = base[0].stop
    return BenchRow(
        technique=method,
        variant=f"{method} vs baseline ({task.name})",
        metric=f"train time to {target:.0%} val acc ({task.describe}, {task.epochs} epoch budget)",
        baseline=t_base,
        candidate=t_cand,
        ratio=ratio,
        unit="s",
        accuracy_baseline=median([r.accs[-1] for r in base]),
        accuracy_candidate=median([r.accs[-1] for r in cand]),
        note=note + ("; accuracy when training stopped" if stop else "; accuracy at the end of the budget"),
        extra={
            "task": task.name,
            "target": target,
            "times_to_target": {"baseline": _reached(base), method: _reached(cand)},
            "cpu_times_to_target": {"baseline": _reached(base, cpu=True), method: _reached(cand, cpu=True)},
            "cpu_time_ratio": cpu_ratio,
            "epochs_to_target": {
                "baseline": [_epochs_to_target(r, target) for r in base],
                method: [_epochs_to_target(r, target) for r in cand],
            },
            "final_acc": {"baseline": [r.accs[-1] for r in base], method: [r.accs[-1] for r in cand]},
            "curves": {
                f"{task.name} baseline": ([t for t, _ in base[0].curve], base[0].accs),
                f"{task.name} {method}": ([t for t, _ in cand[0].curve], cand[0].accs),
            },
        },
    )


def compare(
    methods: Sequence[str], quick: bool = True, target: float | None = None, tasks: Sequence[str] | None = None
) -> list[BenchRow]:
    """Baseline vs each method on each task: runs interleaved baseline, method 1, method 2, ..., repeated.

    Args:
        methods: names in :data:`METHODS`.
        quick: 1 run per variant with small models (plumbing); ``False``: 3 runs each, larger models, full budget.
        target: validation accuracy to reach, for both tasks (default: 0.95 full; quick: 0.6 digits, 0.5 shapes).
        tasks: a subset of ``("digits", "shapes")``.
    """
    for name in methods:
        if name not in METHODS:
            raise SpeedupConfigError(f"`methods` has {name!r}. Allowed values: {', '.join(map(repr, METHODS))}.")
    if target is not None:
        check_range("target", target, 0.0, 1.0, low_inclusive=False)
    selected = [t for t in _tasks(quick) if tasks is None or t.name in tasks]
    repeats = 1 if quick else 3
    rows: list[BenchRow] = []
    with quiet_lightning(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for task in selected:
            goal = target if target is not None else task.target
            results: dict[str | None, list[TrainClock]] = {None: [], **{m: [] for m in methods}}
            for seed in range(repeats):  # A B C A B C: noise reaches every variant alike
                for method in results:
                    results[method].append(train_once(task, method, seed, goal, stop=quick))
            rows += [_row(task, m, goal, results[None], results[m]) for m in methods]
    return rows


def run(quick: bool = True, target: float | None = None) -> list[BenchRow]:
    """All four methods against one shared baseline, interleaved, on digits and shapes."""
    return compare(list(METHODS), quick, target)


def run_label_smoothing(quick: bool = True, target: float | None = None) -> list[BenchRow]:
    """Label smoothing (0.1) vs the baseline, time to target on both tasks."""
    return compare(["label_smoothing"], quick, target)


def run_ema(quick: bool = True, target: float | None = None) -> list[BenchRow]:
    """EMA of the weights (decay 0.999 with warm-up) vs the baseline, time to target on both tasks."""
    return compare(["ema"], quick, target)


def run_progressive_resizing(quick: bool = True, target: float | None = None) -> list[BenchRow]:
    """Progressive resizing (0.5 -> 1, Composer's schedule) vs the baseline, time to target on both tasks."""
    return compare(["progressive_resizing"], quick, target)


def run_fast_schedule(quick: bool = True, target: float | None = None) -> list[BenchRow]:
    """FastSchedule (5% warm-up, 3x peak, linear decay) vs the constant-lr baseline, time to target on both tasks."""
    return compare(["fast_schedule"], quick, target)


if __name__ == "__main__":  # pragma: no cover
    from lightning_speedups.benchmarks.runner import bench_main

    bench_main(run)
