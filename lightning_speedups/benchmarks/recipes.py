"""End-to-end benchmark: the plain Lightning baseline vs the ``fast_train`` recipe and vs ``autotune``, time to a
target accuracy, on two tasks that ship with the package.

Baseline (as most users write it): the task's datamodule with per-sample transforms, batch size 32, Adam at a
constant 1e-3, fp32, default Trainer. The recipe and the autotuned plan train the same model on the same data to the
same target; runs alternate baseline / recipe / autotune. What each measures on the machine is counted in its time
to the target: the recipe's layout/precision probe and ``autotune``'s trials. Both cache what they measured, so two
rows each: the first run on a machine (nothing cached; ``autotune`` within its default 5% budget) and a later run
(the cache filled once, untimed, before the runs; ``autotune`` measured with ``budget_s=10``).
The time is training time to the first validation at or above the target: every run validates every half epoch,
and validation time is not counted on any side (it is the measuring instrument). ``no_bf16=True`` keeps bf16 out of
every choice, so a CPU with bf16 units can check the plan a CPU without them would get.

Tasks: ``digits`` (scikit-learn's digits, 32x32, target 95%) and ``shapes`` (the generated CIFAR-shaped shapes with
pixel noise 0.6, target 90%; at the default noise every method is at 100% after one epoch, which cannot tell them
apart).
"""

from __future__ import annotations

import math
import shutil
import tempfile
import time
from collections.abc import Callable
from typing import Any

import lightning as L

from lightning_speedups._errors import SpeedupConfigError
from lightning_speedups.autotune import autotune
from lightning_speedups.benchmarks._common import BenchRow, TimeToTarget, TrainClock
from lightning_speedups.demo import DemoClassifier, DigitsDataModule, ShapesDataModule
from lightning_speedups.measure import median
from lightning_speedups.optim import OptimizerConfig
from lightning_speedups.recipes import device_datamodule, fast_train

__all__ = ["TASKS", "run", "time_to_accuracy"]

_QUIET: dict[str, Any] = dict(
    logger=False,
    enable_checkpointing=False,
    enable_progress_bar=False,
    enable_model_summary=False,
    num_sanity_val_steps=0,
    val_check_interval=0.5,
)

# task -> (datamodule factory at the baseline's batch size, default target accuracy)
TASKS: dict[str, tuple[Callable[[], L.LightningDataModule], float]] = {
    "digits": (lambda: DigitsDataModule(batch_size=32, seed=0), 0.95),
    "shapes": (lambda: ShapesDataModule(n_train=4096, n_val=1024, batch_size=32, seed=0, noise=0.6), 0.90),
}
KINDS = ("baseline", "fast_train", "fast_train_cached", "autotune", "autotune_cached")
AUTOTUNE_ONCE_BUDGET_S = 10.0


def time_to_accuracy(
    kind: str,
    target: float,
    max_epochs: int,
    width: int,
    seed: int,
    recipe_epochs: int = 4,
    batch_size: int = 32,
    task: str = "digits",
    no_bf16: bool = False,
    cache_dir: str | None = None,
    accelerator: str = "cpu",
) -> TimeToTarget:
    """Train the baseline, the recipe or the autotuned baseline once from ``seed``; the recorder holds the curve and
    the time (the recipe's probe and ``autotune``'s trials included).

    The baseline and the autotuned plan may run up to ``max_epochs``; the recipe's schedule spans ``recipe_epochs``
    at ``batch_size`` (the baseline's 32 by default). All stop as soon as they reach ``target``. The ``*_cached``
    kinds read ``cache_dir`` (filled by :func:`fill_caches`); the others measure afresh. Every kind trains on
    ``accelerator`` (``"cuda"`` in the GPU check, ``benchmarks/gpu_check.py``).
    """
    L.seed_everything(seed, verbose=False)
    recorder = TrainClock(target)  # training time: validation (every half epoch, on every side) is not counted
    data = TASKS[task][0]()
    cached = kind.endswith("_cached")
    if kind.startswith("autotune") or kind == "baseline":
        model = DemoClassifier(width=width, optimizer_config=OptimizerConfig("adam", lr=1e-3))
        callbacks: list[L.Callback] = []
        kwargs: dict[str, Any] = dict(accelerator=accelerator, devices=1, max_epochs=max_epochs)
        extra_s = 0.0
        if kind != "baseline":
            data.setup("fit")  # data setup: uncounted on every side (the baseline's runs inside fit, before its clock)
            start = time.perf_counter()
            plan = autotune(model, data, cache=cached, cache_dir=cache_dir, no_bf16=no_bf16, **kwargs)
            plan.apply(model, data)
            callbacks, kwargs = plan
            data = plan.datamodule or data
            extra_s = time.perf_counter() - start
    else:
        model = DemoClassifier(width=width)
        start = time.perf_counter()
        recipe = fast_train(
            model=model,
            max_epochs=recipe_epochs,
            precision="32-true" if no_bf16 else "auto",
            cache=cached,
            cache_dir=cache_dir,
            accelerator=accelerator,
            **_QUIET,
        )
        recipe.apply(model)
        callbacks, kwargs = recipe
        extra_s = time.perf_counter() - start
        data = device_datamodule(data, batch_size=batch_size, seed=seed)  # data setup: uncounted on both sides
        kwargs = {k: v for k, v in kwargs.items() if k not in _QUIET}
    # every kind fits from the same RNG state, so an autotune plan that changes nothing trains exactly as the baseline
    L.seed_everything(seed, verbose=False)
    trainer = L.Trainer(callbacks=[*callbacks, recorder], **kwargs, **_QUIET)
    trainer.fit(model, data)
    if recorder.reached_at is not None:
        recorder.reached_at += extra_s
    recorder.curve = [(t + extra_s, a) for t, a in recorder.curve]
    recorder.extra_s = extra_s
    return recorder


def fill_caches(
    task: str, max_epochs: int, width: int, recipe_epochs: int, no_bf16: bool, cache_dir: str, accelerator: str = "cpu"
) -> float:
    """Measure once, untimed in the rows: the recipe's probe and an autotune plan with ``budget_s=10``; returns the
    seconds it took (reported in the notes)."""
    start = time.perf_counter()
    L.seed_everything(0, verbose=False)
    fast_train(
        model=DemoClassifier(width=width),
        max_epochs=recipe_epochs,
        precision="32-true" if no_bf16 else "auto",
        cache_dir=cache_dir,
        accelerator=accelerator,
        **_QUIET,
    )
    model = DemoClassifier(width=width, optimizer_config=OptimizerConfig("adam", lr=1e-3))
    autotune(
        model,
        TASKS[task][0](),
        budget_s=AUTOTUNE_ONCE_BUDGET_S,
        cache_dir=cache_dir,
        no_bf16=no_bf16,
        accelerator=accelerator,
        devices=1,
        max_epochs=max_epochs,
    )
    return time.perf_counter() - start


_WHEN = {
    "fast_train": "first run: its layout/precision probe counted",
    "fast_train_cached": "later run: the probe read from the cache",
    "autotune": "first run: trials within the default 5% budget counted",
    "autotune_cached": f"later run: the plan, measured once with budget_s={AUTOTUNE_ONCE_BUDGET_S:g}, from the cache",
}


def _row(task: str, kind: str, target: float, recs: dict[str, list[TimeToTarget]], once_s: float) -> BenchRow:
    base = recs["baseline"]
    cand = recs[kind]
    technique = "recipe" if kind.startswith("fast_train") else "autotune"
    missed = [k for k, rs in (("baseline", base), (kind, cand)) if any(r.reached_at is None for r in rs)]
    acc_base = median([r.curve[-1][1] for r in base])
    acc_cand = median([r.curve[-1][1] for r in cand])
    curves = {k: ([t for t, _ in recs[k][0].curve], [a for _, a in recs[k][0].curve]) for k in ("baseline", kind)}
    variant = f"{kind.removesuffix('_cached')} vs plain baseline ({task}; {_WHEN[kind]})"
    spent = median([r.extra_s for r in cand])
    counted = f"{spent:.2f}s of measuring counted (median)" + (
        f"; the cache was filled once beforehand in {once_s:.1f}s, not counted" if kind.endswith("_cached") else ""
    )
    if missed:
        best = {k: max(a for r in recs[k] for _, a in r.curve) for k in ("baseline", kind)}
        note = "; ".join(f"target not reached by {k} (best val_acc {best[k]:.3f})" for k in missed)
        return BenchRow(
            technique,
            variant,
            f"time to val_acc {target:.2f}",
            math.nan,
            math.nan,
            math.nan,
            "s",
            acc_base,
            acc_cand,
            f"{note}; {counted}",
            {"curves": curves},
        )
    t_base = median([r.reached_at for r in base])  # type: ignore[misc]
    t_cand = median([r.reached_at for r in cand])  # type: ignore[misc]
    per_run = [b.reached_at / max(c.reached_at, 1e-9) for b, c in zip(base, cand)]  # type: ignore[operator]
    return BenchRow(
        technique=technique,
        variant=variant,
        metric=f"time to val_acc {target:.2f}",
        baseline=t_base,
        candidate=t_cand,
        ratio=t_base / max(t_cand, 1e-9),
        unit="s",
        accuracy_baseline=acc_base,
        accuracy_candidate=acc_cand,
        note=f"accuracy when each reached the target; median of {len(base)} alternating run(s); {counted}",
        extra={
            "curves": curves,
            "ratio_min": min(per_run),
            "ratio_max": max(per_run),
            "reached_at": {k: [r.reached_at for r in recs[k]] for k in ("baseline", kind)},
        },
    )


def run(quick: bool = True, target: float | None = None, no_bf16: bool = False) -> list[BenchRow]:
    """Baseline vs ``fast_train`` and vs ``autotune`` (each as a first and a later run): time-to-target ratios
    (medians over alternating runs, with min-max), final accuracy, on the digits task (quick) or both tasks (full)."""
    repeats = 1 if quick else 3
    max_epochs = 8 if quick else 12
    recipe_epochs = 4 if quick else 5
    width = 16 if quick else 32
    rows = []
    for task in ("digits",) if quick else tuple(TASKS):
        goal = target if target is not None else TASKS[task][1]
        cache_dir = tempfile.mkdtemp(prefix="ls_bench_cache_")
        try:
            once_s = fill_caches(task, max_epochs, width, recipe_epochs, no_bf16, cache_dir)
            recs: dict[str, list[TimeToTarget]] = {k: [] for k in KINDS}
            for r in range(repeats):  # alternate so machine noise hits every kind alike
                for kind in KINDS:
                    recs[kind].append(
                        time_to_accuracy(
                            kind,
                            goal,
                            max_epochs,
                            width,
                            seed=r,
                            recipe_epochs=recipe_epochs,
                            task=task,
                            no_bf16=no_bf16,
                            cache_dir=cache_dir,
                        )
                    )
        finally:
            shutil.rmtree(cache_dir, ignore_errors=True)
        if all(r.reached_at is None for rs in recs.values() for r in rs):
            best = max(a for rs in recs.values() for r in rs for _, a in r.curve)
            raise SpeedupConfigError(
                f"`target`={goal} was not reached by any run on {task} within {max_epochs} epochs (best val_acc "
                f"{best:.3f}). Allowed values: a target <= {best:.3f}, the best reached. HINT: lower the target "
                "accuracy."
            )
        rows += [_row(task, kind, goal, recs, once_s) for kind in KINDS[1:]]
    return rows


if __name__ == "__main__":  # pragma: no cover
    from lightning_speedups.benchmarks.runner import bench_main

    bench_main(run)
