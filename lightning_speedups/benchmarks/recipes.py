"""End-to-end benchmark: the plain Lightning baseline vs the ``fast_train`` recipe and vs ``autotune``, time to a
target accuracy, on two tasks that ship with the package.

Baseline (as most users write it): the task's datamodule with per-sample transforms, batch size 32, Adam at a
constant 1e-3, fp32, default Trainer. The recipe and the autotuned plan train the same model on the same data to the
same target; runs alternate baseline / recipe / autotune. ``autotune``'s trial time is counted in its time to the
target. ``no_bf16=True`` keeps bf16 out of every choice, so a CPU with bf16 units can check the plan a CPU without
them would get.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import lightning as L

from lightning_speedups._errors import SpeedupConfigError
from lightning_speedups.autotune import autotune
from lightning_speedups.benchmarks._common import BenchRow, TimeToTarget
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
)

# task -> (datamodule factory at the baseline's batch size, default target accuracy)
TASKS: dict[str, tuple[Callable[[], L.LightningDataModule], float]] = {
    "digits": (lambda: DigitsDataModule(batch_size=32, seed=0), 0.95),
    "shapes": (lambda: ShapesDataModule(n_train=4096, n_val=1024, batch_size=32, seed=0), 0.90),
}
KINDS = ("baseline", "fast_train", "autotune")


def time_to_accuracy(
    kind: str,
    target: float,
    max_epochs: int,
    width: int,
    seed: int,
    recipe_epochs: int = 4,
    batch_size: int = 64,
    task: str = "digits",
    no_bf16: bool = False,
) -> TimeToTarget:
    """Train the baseline, the recipe or the autotuned baseline once from ``seed``; the recorder holds the curve and
    the time (``autotune``'s trial time included).

    The baseline and the autotuned plan may run up to ``max_epochs``; the recipe's schedule spans ``recipe_epochs``
    at ``batch_size``. All stop as soon as they reach ``target``.
    """
    L.seed_everything(seed, verbose=False)
    recorder = TimeToTarget(target)
    data = TASKS[task][0]()
    if kind in ("baseline", "autotune"):
        model = DemoClassifier(width=width, optimizer_config=OptimizerConfig("adam", lr=1e-3))
        callbacks: list[L.Callback] = []
        kwargs: dict[str, Any] = dict(accelerator="cpu", devices=1, max_epochs=max_epochs)
        extra_s = 0.0
        if kind == "autotune":
            plan = autotune(model, data, cache=False, no_bf16=no_bf16, **kwargs)
            plan.apply(model, data)
            callbacks, kwargs = plan
            data = plan.datamodule or data
            extra_s = plan.trial_s
            L.seed_everything(seed, verbose=False)  # the trials drew no random numbers, but stay exact
        trainer = L.Trainer(callbacks=[*callbacks, recorder], **kwargs, **_QUIET)
        trainer.fit(model, data)
        if recorder.reached_at is not None:
            recorder.reached_at += extra_s
        recorder.curve = [(t + extra_s, a) for t, a in recorder.curve]
        return recorder
    model = DemoClassifier(width=width)
    recipe = fast_train(model=model, max_epochs=recipe_epochs, precision="32-true" if no_bf16 else "auto", **_QUIET)
    recipe.apply(model)
    callbacks, kwargs = recipe
    trainer = L.Trainer(callbacks=[*callbacks, recorder], **kwargs)
    trainer.fit(model, device_datamodule(data, batch_size=batch_size, seed=seed))
    return recorder


def _row(task: str, kind: str, target: float, recs: dict[str, list[TimeToTarget]]) -> BenchRow:
    base, cand = recs["baseline"], recs[kind]
    missed = [k for k, rs in (("baseline", base), (kind, cand)) if any(r.reached_at is None for r in rs)]
    acc_base = median([r.curve[-1][1] for r in base])
    acc_cand = median([r.curve[-1][1] for r in cand])
    curves = {k: ([t for t, _ in recs[k][0].curve], [a for _, a in recs[k][0].curve]) for k in ("baseline", kind)}
    variant = f"{kind} vs plain baseline ({task})"
    if missed:
        best = {k: max(a for r in recs[k] for _, a in r.curve) for k in ("baseline", kind)}
        note = "; ".join(f"target not reached by {k} (best val_acc {best[k]:.3f})" for k in missed)
        return BenchRow("recipe" if kind == "fast_train" else "autotune", variant, f"time to val_acc {target:.2f}",
                        math.nan, math.nan, math.nan, "s", acc_base, acc_cand, note, {"curves": curves})  # fmt: skip
    t_base = median([r.reached_at for r in base])  # type: ignore[misc]
    t_cand = median([r.reached_at for r in cand])  # type: ignore[misc]
    per_run = [b.reached_at / max(c.reached_at, 1e-9) for b, c in zip(base, cand)]  # type: ignore[operator]
    return BenchRow(
        technique="recipe" if kind == "fast_train" else "autotune",
        variant=variant,
        metric=f"time to val_acc {target:.2f}",
        baseline=t_base,
        candidate=t_cand,
        ratio=t_base / max(t_cand, 1e-9),
        unit="s",
        accuracy_baseline=acc_base,
        accuracy_candidate=acc_cand,
        note=f"accuracy when each reached the target; median of {len(base)} alternating run(s)",
        extra={"curves": curves, "ratio_min": min(per_run), "ratio_max": max(per_run)},
    )


def run(quick: bool = True, target: float | None = None, no_bf16: bool = False) -> list[BenchRow]:
    """Baseline vs ``fast_train`` and vs ``autotune``: time-to-target ratios (medians over alternating runs, with
    min-max), final accuracy, on the digits task (quick) or both tasks (full)."""
    repeats = 1 if quick else 3
    max_epochs = 8 if quick else 12
    recipe_epochs = 4 if quick else 5
    width = 16 if quick else 32
    rows = []
    for task in ("digits",) if quick else tuple(TASKS):
        goal = target if target is not None else TASKS[task][1]
        recs: dict[str, list[TimeToTarget]] = {k: [] for k in KINDS}
        for r in range(repeats):  # alternate so machine noise hits every kind alike
            for kind in KINDS:
                recs[kind].append(time_to_accuracy(kind, goal, max_epochs, width, seed=r, recipe_epochs=recipe_epochs,
                                                   task=task, no_bf16=no_bf16))  # fmt: skip
        if all(r.reached_at is None for rs in recs.values() for r in rs):
            best = max(a for rs in recs.values() for r in rs for _, a in r.curve)
            raise SpeedupConfigError(
                f"`target`={goal} was not reached by any run on {task} within {max_epochs} epochs (best val_acc "
                f"{best:.3f}). Allowed values: a target <= {best:.3f}, the best reached. HINT: lower the target "
                "accuracy."
            )
        rows += [_row(task, kind, goal, recs) for kind in ("fast_train", "autotune")]
    return rows


if __name__ == "__main__":  # pragma: no cover
    from lightning_speedups.benchmarks.runner import bench_main

    bench_main(run)
