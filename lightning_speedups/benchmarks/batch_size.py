"""Benchmark: our throughput batch-size finder vs Lightning's ``BatchSizeFinder`` plus an exhaustive sweep.

Run: ``python -m lightning_speedups.benchmarks.batch_size [--full]``.
Rows: search time (Lightning / ours, > 1 = ours faster) and the samples/s of each chosen size relative to the best
size of the sweep (measured interleaved in one process, plain training steps with data loading).
"""

from __future__ import annotations

import logging
import math
import sys
import time
import warnings
from typing import Any

import lightning as L
import torch

from lightning_speedups.benchmarks._common import BenchRow, interleaved_timings, machine_info, median
from lightning_speedups.demo import DemoClassifier, DigitsDataModule
from lightning_speedups.functional.batch_size import find_batch_size

__all__ = ["run"]


def _trainer(**kw: Any) -> L.Trainer:
    return L.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                     enable_model_summary=False, enable_checkpointing=False, num_sanity_val_steps=0, **kw)


def _task(size: int) -> tuple[DemoClassifier, DigitsDataModule]:
    L.seed_everything(0, verbose=False)
    return DemoClassifier(width=8), DigitsDataModule(batch_size=32, size=size)


def _train_samples(size: int, batch: int, samples: int) -> Any:
    """A callable that trains ``samples`` images at ``batch`` (data loading + forward + backward + Adam step)."""
    model, dm = _task(size)
    dm.setup("fit")
    dm.batch_size = batch
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    model.train()
    steps = max(2, math.ceil(samples / batch))

    def fn() -> int:
        seen, it = 0, iter(dm.train_dataloader())
        for _ in range(steps):
            try:
                x, y = next(it)
            except StopIteration:
                it = iter(dm.train_dataloader())
                x, y = next(it)
            opt.zero_grad(set_to_none=True)
            model.loss_fn(model(x), y).backward()
            opt.step()
            seen += len(y)
        fn.seen = seen  # type: ignore[attr-defined]
        return seen

    return fn


def run(quick: bool = True) -> list[BenchRow]:
    """Search time and chosen-size throughput of both finders, plus the sweep, on the digits demo task."""
    size = 16 if quick else 32
    pl_trials = 6 if quick else 25
    for name in ("lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")

    # ours (defaults: doubling from 16, 3 timed + 1 warm-up step per size, plateau rule)
    model, dm = _task(size)
    t0 = time.perf_counter()
    ours = find_batch_size(_trainer(max_epochs=1), model, dm, verbose=False, progress_bar=False)
    t_ours = time.perf_counter() - t0

    # Lightning's BatchSizeFinder (power mode, its defaults; quick mode caps max_trials to fit the time budget)
    from lightning.pytorch.tuner import Tuner

    model, dm = _task(size)
    t0 = time.perf_counter()
    pl_choice = Tuner(_trainer(max_epochs=1, default_root_dir=_tmpdir())).scale_batch_size(
        model, datamodule=dm, mode="power", max_trials=pl_trials
    ) or dm.batch_size
    t_pl = time.perf_counter() - t0

    # exhaustive reference: every power of two from 8 (to the training-set size in full mode), more steps per size
    model, dm = _task(size)
    sweep = find_batch_size(_trainer(max_epochs=1), model, dm, mode="sweep", init_val=8, max_val=512 if quick else 2048,
                            steps_per_trial=3 if quick else 6, warmup_steps=1, verbose=False, progress_bar=False)
    best = max((t for t in sweep.trials if t.ok), key=lambda t: t.samples_per_s).batch_size

    # the three chosen sizes, trained interleaved on the same sample budget
    samples = 512 if quick else 3072
    sizes = {"sweep_best": best, "ours": ours.chosen, "lightning": int(pl_choice)}
    fns = {name: _train_samples(size, b, samples) for name, b in sizes.items()}
    times = interleaved_timings(fns, repeats=3 if quick else 5, warmup=1)
    sps = {name: fns[name].seen / median(times[name]) for name in fns}  # type: ignore[attr-defined]

    cap_note = f" (quick: Lightning capped at max_trials={pl_trials}, so its real search is longer)" if quick else ""
    common = {"sweep": [(t.batch_size, round(t.samples_per_s, 1)) for t in sweep.trials], "image_size": size}
    rows = [
        BenchRow("batch_size_finder", "search time: ours vs Lightning BatchSizeFinder", "search_time", t_pl, t_ours,
                 t_pl / max(t_ours, 1e-9), "s",
                 note=f"ours chose {ours.chosen} ({ours.stop_reason}), Lightning chose {pl_choice}{cap_note}; "
                      "target ratio >= 4", extra={**common, "ours_trials": len(ours.trials)}),
        BenchRow("batch_size_finder", f"samples/s at our choice ({ours.chosen}) vs sweep best ({best})",
                 "throughput", sps["sweep_best"], sps["ours"], sps["ours"] / sps["sweep_best"], "samples/s",
                 note="target ratio >= 0.9; accuracy not measured: batch size changes optimisation, use scale_lr",
                 extra=common),
        BenchRow("batch_size_finder", f"samples/s at Lightning's choice ({pl_choice}) vs sweep best ({best})",
                 "throughput", sps["sweep_best"], sps["lightning"], sps["lightning"] / sps["sweep_best"], "samples/s",
                 note="Lightning grows until OOM / dataset size, it does not look at speed", extra=common),
    ]
    return rows


def _tmpdir() -> str:
    # Lightning's finder writes a checkpoint into default_root_dir: keep it out of the working directory
    import atexit
    import shutil
    import tempfile

    path = tempfile.mkdtemp(prefix="bsf_bench_")
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def main() -> None:
    quick = "--full" not in sys.argv
    print(machine_info())
    for row in run(quick=quick):
        verdict = "" if row.ratio >= 1.0 or row.metric != "search_time" else "  (no speedup)"
        print(f"{row.variant}: baseline {row.baseline:.2f} {row.unit}, candidate {row.candidate:.2f} {row.unit}, "
              f"ratio {row.ratio:.2f}{verdict}  | {row.note}")


if __name__ == "__main__":
    main()
