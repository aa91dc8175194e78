"""Benchmark: our throughput batch-size finder vs Lightning's ``BatchSizeFinder`` plus an exhaustive sweep.

Run: ``python -m lightning_speedups.benchmarks.batch_size [--full]``.
Rows: search time (Lightning / ours, > 1 = ours faster) and the samples/s of each chosen size relative to the best
size of the sweep (measured interleaved in one process, plain training steps with data loading). Then the same under
load: a CPU-bound busy loop in another process, started and stopped here, while our finder runs N times (10 in full
mode, 1 in quick) and Lightning's a few times; each choice is scored against the best size of an interleaved sweep
under the same load (how many runs come within 10% of it). Search time is the finder call alone: the model, the data
and the Trainer are built outside the timer on both sides. Quick mode runs each part once on a smaller problem
(:data:`QUICK`), so the whole bench stays within a couple of minutes on 2 cores.
"""

from __future__ import annotations

import contextlib
import math
import multiprocessing
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import lightning as L
import torch

from lightning_speedups.benchmarks._common import BenchRow, quiet_lightning
from lightning_speedups.demo import DemoClassifier, DigitsDataModule
from lightning_speedups.measure import interleaved_timings, median
from lightning_speedups.tuner import find_batch_size

__all__ = ["FULL", "QUICK", "BenchSizes", "run"]


@dataclass(frozen=True)
class BenchSizes:
    """How much each part of the bench measures."""

    image_size: int
    classes: tuple[int, ...] | None  # digit classes in the data (``None``: all ten)
    search_runs: int  # interleaved timed searches of each finder
    sweep_from: int  # the smallest batch of the reference sweeps
    sweep_steps: int  # timed steps per size of the reference sweep
    samples: int  # samples trained per timed run of a chosen size
    repeats: int  # interleaved timed runs of each chosen size
    load_runs: int  # our finder's runs under load
    load_lightning_runs: int  # Lightning's runs under load
    load_samples: int  # samples per timed run of each ladder size, under load


FULL = BenchSizes(32, None, 5, 8, 3, 3072, 5, 10, 3, 2048)
# 3 digit classes of 16x16 images (~430 training images): every search and sweep stops at a smaller batch
QUICK = BenchSizes(16, (0, 1, 2), 1, 32, 2, 128, 2, 1, 1, 128)


def _trainer(**kw: Any) -> L.Trainer:
    return L.Trainer(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        num_sanity_val_steps=0,
        **kw,
    )


def _task(size: int, classes: tuple[int, ...] | None = None) -> tuple[DemoClassifier, DigitsDataModule]:
    L.seed_everything(0, verbose=False)
    return DemoClassifier(width=8), DigitsDataModule(batch_size=32, size=size, classes=classes)


def _train_samples(size: int, batch: int, samples: int, classes: tuple[int, ...] | None = None) -> Any:
    """A callable that trains ``samples`` images at ``batch`` (data loading + forward + backward + Adam step)."""
    model, dm = _task(size, classes)
    dm.setup("fit")
    dm.batch_size = batch
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    model.train()
    steps = max(2, math.ceil(samples / batch))

    def fn() -> int:
        seen = 0
        it = iter(dm.train_dataloader())
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
    """Search time and chosen-size throughput of both finders, plus the sweep, on the digits demo task.

    Both finders run at their defaults and uncapped: Lightning's ``power`` mode from 2 until the batch reaches the
    training-set size (no OOM on a CPU), ours from 16 until its plateau rule stops it. Quick mode shrinks the problem
    for both (16x16 images, 3 of the 10 digit classes: ~430 training images; see :data:`QUICK`) instead of capping
    Lightning, and runs each part once.
    """
    sizes = QUICK if quick else FULL
    with quiet_lightning():
        return _compare_finders(sizes) + run_under_load(quick)


def _compare_finders(sizes: BenchSizes) -> list[BenchRow]:
    """Both finders' search time, interleaved, and the samples/s of each one's choice against the sweep's best."""
    # long: a benchmark script: one measurement after another, read top to bottom
    from lightning.pytorch.tuner import Tuner

    found: dict[str, Any] = {}

    def ours(**kw: Any) -> float:
        model, dm = _task(sizes.image_size, sizes.classes)  # building the task is not search time (on either side)
        trainer = _trainer(max_epochs=1)
        start = time.perf_counter()
        found["ours"] = find_batch_size(trainer, model, dm, verbose=False, progress_bar=False, **kw)
        return time.perf_counter() - start

    def lightning(**kw: Any) -> float:
        model, dm = _task(sizes.image_size, sizes.classes)
        tuner = Tuner(_trainer(max_epochs=1, default_root_dir=_tmpdir()))
        start = time.perf_counter()
        chosen = tuner.scale_batch_size(model, datamodule=dm, mode="power", **kw)
        elapsed = time.perf_counter() - start
        found["lightning"] = int(chosen or dm.batch_size)
        return elapsed

    # one small untimed run of each first: imports, allocator and first-op costs must not land on either side
    ours(max_val=32)
    lightning(max_trials=2)
    times: dict[str, list[float]] = {"lightning": [], "ours": []}
    for _ in range(sizes.search_runs):  # interleaved, so machine noise reaches both alike (a search is 0.5-3 s)
        times["lightning"].append(lightning())
        times["ours"].append(ours())
    t_pl = median(times["lightning"])
    t_ours = median(times["ours"])
    result = found["ours"]
    pl_choice = found["lightning"]

    # exhaustive reference: every power of two from sweep_from to the training-set size, a few timed steps per size
    model, dm = _task(sizes.image_size, sizes.classes)
    sweep = find_batch_size(
        _trainer(max_epochs=1),
        model,
        dm,
        mode="sweep",
        init_val=sizes.sweep_from,
        steps_per_trial=sizes.sweep_steps,
        warmup_steps=1,
        trial_samples=None,
        trial_time=None,
        verbose=False,
        progress_bar=False,
    )
    best = max((t for t in sweep.trials if t.ok), key=lambda t: t.samples_per_s).batch_size

    # the three chosen sizes, trained interleaved on the same sample budget
    chosen = {"sweep_best": best, "ours": result.chosen, "lightning": pl_choice}
    fns = {name: _train_samples(sizes.image_size, b, sizes.samples, sizes.classes) for name, b in chosen.items()}
    reps = interleaved_timings(fns, repeats=sizes.repeats, warmup=1)
    sps = {name: fns[name].seen / median(reps[name]) for name in fns}  # type: ignore[attr-defined]

    ratio_b = sps["ours"] / sps["sweep_best"]
    common = {
        "sweep": [(t.batch_size, round(t.samples_per_s, 1)) for t in sweep.trials],
        "image_size": sizes.image_size,
        "train_images": len(dm.train_set) if hasattr(dm, "train_set") else None,
    }
    runs = len(times["ours"])
    return [
        BenchRow(
            "batch_size_finder",
            "search time: ours vs Lightning BatchSizeFinder (uncapped)",
            "search_time",
            t_pl,
            t_ours,
            t_pl / max(t_ours, 1e-9),
            "s",
            note=f"ours chose {result.chosen} ({result.stop_reason}, {len(result.trials)} sizes), Lightning "
            f"chose {pl_choice} (power mode from 2 up to the dataset size); "
            + (f"medians of {runs} interleaved runs" if runs > 1 else "one run each"),
            extra={**common, "ours_trials": [(t.batch_size, len(t.step_times)) for t in result.trials], "times": times},
        ),
        BenchRow(
            "batch_size_finder",
            f"samples/s at our choice ({result.chosen}) vs sweep best ({best})",
            "throughput",
            sps["sweep_best"],
            sps["ours"],
            ratio_b,
            "samples/s",
            note=("within 10% of the best size" if ratio_b >= 0.9 else "more than 10% below the best size")
            + "; accuracy not measured: batch size changes optimisation (the finder scales the lr: lr_scaling)",
            extra={**common, "quality_ratio": True},
        ),
        BenchRow(
            "batch_size_finder",
            f"samples/s at Lightning's choice ({pl_choice}) vs sweep best ({best})",
            "throughput",
            sps["sweep_best"],
            sps["lightning"],
            sps["lightning"] / sps["sweep_best"],
            "samples/s",
            note="Lightning grows until OOM / dataset size, it does not look at speed",
            extra={**common, "quality_ratio": True},
        ),
    ]


def _busy(stop: Any) -> None:  # pragma: no cover - runs in the background process
    while not stop.is_set():
        sum(i * i for i in range(10_000))


@contextlib.contextmanager
def background_load(processes: int = 1) -> Iterator[None]:
    """CPU-bound busy loops in ``processes`` other processes while the body runs (forked: no torch in the child)."""
    methods = multiprocessing.get_all_start_methods()
    ctx = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
    stop = ctx.Event()
    procs = [ctx.Process(target=_busy, args=(stop,), daemon=True) for _ in range(processes)]
    for p in procs:
        p.start()
    try:
        yield
    finally:
        stop.set()
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.terminate()


def run_under_load(quick: bool = True, runs: int | None = None) -> list[BenchRow]:
    """Decision quality and search time of our finder with a CPU-bound process on the machine."""
    # long: a benchmark script: one measurement after another, read top to bottom
    sizes = QUICK if quick else FULL
    size = sizes.image_size
    classes = sizes.classes
    runs = runs or sizes.load_runs
    pl_runs = sizes.load_lightning_runs
    from lightning.pytorch.tuner import Tuner

    def ours() -> tuple[int, float, Any]:
        model, dm = _task(size, classes)  # building the task is not search time (on either side)
        trainer = _trainer(max_epochs=1)
        start = time.perf_counter()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            r = find_batch_size(trainer, model, dm, verbose=False, progress_bar=False)
        elapsed = time.perf_counter() - start
        untrusted = any("timing cannot be trusted" in str(w.message) for w in caught)
        return r.chosen, elapsed, (r, untrusted)

    def lightning() -> float:
        model, dm = _task(size, classes)
        tuner = Tuner(_trainer(max_epochs=1, default_root_dir=_tmpdir()))
        start = time.perf_counter()
        tuner.scale_batch_size(model, datamodule=dm, mode="power")
        return time.perf_counter() - start

    chosen: list[int] = []
    t_ours: list[float] = []
    t_pl: list[float] = []
    details: list[dict[str, Any]] = []
    with background_load():
        if not quick:  # quick: run() compared the finders just before, the process is warm
            ours()  # warm the process up under load (imports, allocator), untimed
        for i in range(runs):
            b, t, (r, untrusted) = ours()
            chosen.append(b)
            t_ours.append(t)
            details.append(
                {
                    "chosen": b,
                    "search_s": round(t, 2),
                    "stop": r.stop_reason,
                    "untrusted": untrusted,
                    "sizes": [x.batch_size for x in r.trials],
                    "remeasured": len(r.remeasured),
                    "final": r.final.get("median_samples_per_s"),
                }
            )
            if i < pl_runs:  # Lightning's search interleaved with ours, so both see the same load
                t_pl.append(lightning())
        # the reference: every ladder size trained interleaved on the same sample budget, under the same load
        _model, dm = _task(size, classes)
        dm.setup("fit")
        n = len(dm.train_set)
        powers = [b for b in (16, 32, 64, 128, 256, 512, 1024, 2048) if sizes.sweep_from <= b < n]
        ladder = sorted({*powers, n, *chosen})
        fns = {b: _train_samples(size, b, sizes.load_samples, classes) for b in ladder}
        reps = interleaved_timings(fns, repeats=sizes.repeats, warmup=1)
    sps = {b: fns[b].seen / median(reps[b]) for b in ladder}  # type: ignore[attr-defined]
    best = max(sps, key=sps.get)  # type: ignore[arg-type]
    quality = [sps.get(b, 0.0) / sps[best] for b in chosen]
    hits = sum(q >= 0.9 for q in quality)
    ratio_t = median(t_pl) / max(median(t_ours), 1e-9)
    common = {
        "load": "1 busy-loop process",
        "sweep_samples_per_s": {b: round(v, 1) for b, v in sps.items()},
        "runs": details,
        "image_size": size,
    }
    return [
        BenchRow(
            "batch_size_finder",
            f"under load: our choice vs sweep best ({best})" + (f", median of {runs} runs" if runs > 1 else ""),
            "throughput",
            sps[best],
            median([sps.get(b, 0.0) for b in chosen]),
            median(quality),
            "samples/s",
            note=f"{hits} of {runs} runs within 10% of the best size (chosen {chosen}; per run "
            f"{[round(q, 2) for q in quality]})",
            extra={**common, "quality_ratio": True},
        ),
        BenchRow(
            "batch_size_finder",
            "under load: search time, ours vs Lightning BatchSizeFinder",
            "search_time",
            median(t_pl),
            median(t_ours),
            ratio_t,
            "s",
            note=f"medians of {len(t_ours)} (ours) and {len(t_pl)} (Lightning) interleaved runs; ours "
            f"{[round(t, 1) for t in t_ours]} s",
            extra=common,
        ),
    ]


def _tmpdir() -> str:
    # Lightning's finder writes a checkpoint into default_root_dir: keep it out of the working directory
    import atexit
    import shutil
    import tempfile

    path = tempfile.mkdtemp(prefix="bsf_bench_")
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


if __name__ == "__main__":  # pragma: no cover
    from lightning_speedups.benchmarks.runner import bench_main

    bench_main(run)
