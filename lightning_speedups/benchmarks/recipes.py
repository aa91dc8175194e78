"""End-to-end benchmark: the plain Lightning baseline vs the ``fast_train`` recipe, time to a target accuracy.

Baseline (as most users write it): ``DigitsDataModule`` with per-sample transforms, batch size 32, Adam at a constant
1e-3, fp32, default Trainer. Same model, same data, same target accuracy; runs alternate baseline/recipe.
"""

from __future__ import annotations

from typing import Any

import lightning as L

from lightning_speedups._errors import SpeedupConfigError
from lightning_speedups.benchmarks._common import BenchRow, TimeToTarget
from lightning_speedups.demo import DemoClassifier, DigitsDataModule
from lightning_speedups.measure import median
from lightning_speedups.optim import OptimizerConfig
from lightning_speedups.recipes import device_datamodule, fast_train

__all__ = ["run", "time_to_accuracy"]

_QUIET: dict[str, Any] = dict(
    logger=False,
    enable_checkpointing=False,
    enable_progress_bar=False,
    enable_model_summary=False,
    num_sanity_val_steps=0,
)


def time_to_accuracy(
    kind: str, target: float, max_epochs: int, width: int, seed: int, recipe_epochs: int = 4, batch_size: int = 64
) -> TimeToTarget:
    """Train the baseline or the recipe once from ``seed``; the returned recorder holds the curve and the time.

    The baseline may run up to ``max_epochs``; the recipe's OneCycle schedule spans ``recipe_epochs`` at
    ``batch_size``. Both stop as soon as they reach ``target``.
    """
    L.seed_everything(seed, verbose=False)
    recorder = TimeToTarget(target)
    if kind == "baseline":
        model = DemoClassifier(width=width, optimizer_config=OptimizerConfig("adam", lr=1e-3))
        trainer = L.Trainer(accelerator="cpu", devices=1, max_epochs=max_epochs, callbacks=[recorder], **_QUIET)
        trainer.fit(model, DigitsDataModule(batch_size=32, seed=0))
        return recorder
    model = DemoClassifier(width=width)
    recipe = fast_train(model=model, max_epochs=recipe_epochs, **_QUIET)
    recipe.apply(model)
    callbacks, kwargs = recipe
    trainer = L.Trainer(callbacks=[*callbacks, recorder], **kwargs)
    trainer.fit(model, device_datamodule(DigitsDataModule(batch_size=32, seed=0), batch_size=batch_size, seed=seed))
    return recorder


def run(quick: bool = True, target: float = 0.95) -> list[BenchRow]:
    """Baseline vs ``fast_train``: time-to-``target`` ratio (medians over alternating runs) and final accuracy."""
    repeats = 1 if quick else 3
    max_epochs = 8 if quick else 12
    recipe_epochs = 4 if quick else 5
    width = 16 if quick else 32
    results: dict[str, list[TimeToTarget]] = {"baseline": [], "fast_train": []}
    for r in range(repeats):  # alternate baseline / recipe so machine noise hits both alike
        for kind in results:
            results[kind].append(time_to_accuracy(kind, target, max_epochs, width, seed=r, recipe_epochs=recipe_epochs))
    for kind, recs in results.items():
        if any(rec.reached_at is None for rec in recs):
            best = max(acc for rec in recs for _, acc in rec.curve)
            raise SpeedupConfigError(
                f"`target`={target} was not reached by the {kind} run within {max_epochs} epochs (best val_acc "
                f"{best:.3f}). HINT: lower the target accuracy."
            )
    t_base = median([rec.reached_at for rec in results["baseline"]])  # type: ignore[misc]
    t_fast = median([rec.reached_at for rec in results["fast_train"]])  # type: ignore[misc]
    acc_base = median([rec.curve[-1][1] for rec in results["baseline"]])
    acc_fast = median([rec.curve[-1][1] for rec in results["fast_train"]])
    curves = {kind: ([t for t, _ in recs[0].curve], [a for _, a in recs[0].curve]) for kind, recs in results.items()}
    return [
        BenchRow(
            technique="recipe",
            variant="fast_train vs plain baseline",
            metric=f"time to val_acc {target:.2f}",
            baseline=t_base,
            candidate=t_fast,
            ratio=t_base / max(t_fast, 1e-9),
            unit="s",
            accuracy_baseline=acc_base,
            accuracy_candidate=acc_fast,
            note=f"accuracy when each reached the target; median of {repeats} alternating run(s)",
            extra={"curves": curves},
        )
    ]


if __name__ == "__main__":  # pragma: no cover
    from lightning_speedups.benchmarks.runner import bench_main

    bench_main(run)
