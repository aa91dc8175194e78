"""Does autotune's first run harm a short run? A plain 1-D CNN, plain fit against autotune's first run, to a target.

Usage::

    python benchmarks/autotune_short_run.py                 # 3 seeds, about 1 minute on 2 CPU cores
    python benchmarks/autotune_short_run.py --seeds 5 --epochs 8

A new user's case (issue 50, part 3): a small ``Conv1d`` network in a plain ``LightningModule`` (its own Adam in
``configure_optimizers``), generated 3-channel signals of 8 waveform classes
(:func:`~benchmarks.workloads.signals.draw_signals`) in a ``TensorDataset``, a planned run of
``--epochs`` epochs whose plain fit reaches ``val_acc`` ``--target`` in a few seconds. Per seed, interleaved (plain,
autotune, plain, autotune, ...): the plain fit, and ``autotune(model, loader, cache=False)`` (an empty cache: its first
run) then the fit with the plan. Each is timed from before the Trainer (plain) or before ``autotune`` (autotune) to the
first validation that reaches the target, validation included, so every cost of the first run counts: the sizing
steps, the model copies, the trials, the device twin, ``plan.apply`` and the in-fit trial's steps. The script prints
the machine, each run, the medians over seeds and the ratio (plain / autotune: above 1, autotune reached it sooner),
with the plan's notes of the first seed. Timing: a machine shared with other jobs moves the seconds; the runs are
interleaved so that load hits both sides alike.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import time
import warnings
from collections.abc import Sequence
from typing import Any

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from benchmarks.workloads.signals import draw_signals, signal_cnn
from lightning_speedups.autotune import autotune
from lightning_speedups.measure import machine_info

WINDOW = 256  # the centred window of each 512-sample signal the network sees


class SignalNet(L.LightningModule):
    """A plain module as a user writes one: a 1-D CNN, cross-entropy, Adam 1e-3 from ``configure_optimizers``."""

    def __init__(self, width: int = 16, lr: float = 3e-3) -> None:
        super().__init__()
        self.net = signal_cnn(width=width)
        self.lr = lr

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.cross_entropy(self(x), y)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_acc", (self(x).argmax(1) == y).float().mean(), prog_bar=False)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=self.lr)


class _Reach(L.Callback):
    """Stops the fit at the first validation whose ``val_acc`` reaches ``target``, noting the clock then."""

    def __init__(self, target: float) -> None:
        self.target = target
        self.reached_at: float | None = None
        self.cpu_at: float | None = None
        self.best = 0.0

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        acc = float(trainer.callback_metrics.get("val_acc", 0.0))
        self.best = max(self.best, acc)
        if acc >= self.target and self.reached_at is None:
            self.reached_at = time.perf_counter()
            self.cpu_at = time.process_time()
            trainer.should_stop = True


def _data(seed: int, args: argparse.Namespace) -> tuple[DataLoader, DataLoader]:
    """Centred windows of generated signals in TensorDatasets: the training loader shuffles, validation does not."""
    lo = (512 - WINDOW) // 2
    x, y = draw_signals(args.n_train, seed, noise=args.noise)
    xv, yv = draw_signals(args.n_val, seed + 10_000, noise=args.noise)
    batch_size = args.batch_size
    train = DataLoader(TensorDataset(x[..., lo : lo + WINDOW].contiguous(), y), batch_size=batch_size, shuffle=True)
    val = DataLoader(TensorDataset(xv[..., lo : lo + WINDOW].contiguous(), yv), batch_size=512)
    return train, val


def _trainer_kwargs(epochs: int, val_every: int) -> dict[str, Any]:
    return {
        "max_epochs": epochs,
        "accelerator": "cpu",
        "val_check_interval": val_every,
        "logger": False,
        "enable_checkpointing": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
    }


def run_once(seed: int, tuned: bool, args: argparse.Namespace) -> dict[str, Any]:
    """One fit of ``seed``: plain, or autotune's first run then the planned fit; seconds to the target."""
    train, val = _data(seed, args)
    L.seed_everything(seed, verbose=False)
    model = SignalNet(args.width)
    kwargs = _trainer_kwargs(args.epochs, args.val_every)
    reach = _Reach(args.target)
    start = time.perf_counter()
    cpu_start = time.process_time()
    notes: list[str] = []
    tune_s = 0.0
    in_fit = ""
    if tuned:
        plan = autotune(model, train, cache=False, no_bf16=args.no_bf16, **kwargs)
        plan.apply(model, train)
        tune_s = time.perf_counter() - start
        notes = plan.explain(width=None).splitlines()
        callbacks, kwargs = plan
        trainer = L.Trainer(callbacks=[*callbacks, reach], **kwargs)
        trainer.fit(model, plan.train_dataloaders or train, val)
        in_fit = "; ".join(_decided(cb) for cb in callbacks if hasattr(cb, "kept"))
    else:
        trainer = L.Trainer(callbacks=[reach], **kwargs)
        trainer.fit(model, train, val)
    end = reach.reached_at if reach.reached_at is not None else time.perf_counter()
    cpu_end = reach.cpu_at if reach.cpu_at is not None else time.process_time()
    return {
        "seed": seed,
        "tuned": tuned,
        "seconds": end - start,
        "cpu_s": cpu_end - cpu_start,
        "reached": reach.reached_at is not None,
        "steps": trainer.global_step,
        "best": reach.best,
        "tune_s": tune_s,
        "in_fit": in_fit,
        "notes": notes,
    }


def _decided(trial: Any) -> str:
    """What an in-fit trial callback of the plan decided in the fit."""
    return f"{type(trial).__name__} kept {trial.kept} after {trial.rounds} rounds ({trial.ratio[1]:.2f}x)"


def _line(row: dict[str, Any]) -> str:
    what = "autotune" if row["tuned"] else "plain   "
    reached = "reached" if row["reached"] else f"NOT reached (best {row['best']:.3f})"
    tuned = f"  autotune() and apply {row['tune_s']:.2f}s  {row['in_fit']}" if row["tuned"] else ""
    seconds = f"{row['seconds']:6.2f}s (cpu {row['cpu_s']:6.2f}s)"
    return f"  seed {row['seed']} {what} {seconds}  {reached} at step {row['steps']}{tuned}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=12, help="the planned run (autotune sizes its budget by it)")
    parser.add_argument("--target", type=float, default=0.7, help="val_acc to reach")
    parser.add_argument("--width", type=int, default=16)
    parser.add_argument("--n-train", type=int, default=4096)
    parser.add_argument("--noise", type=float, default=0.1, help="white noise std of the signals")
    parser.add_argument("--no-bf16", action="store_true", help="autotune's no-bf16 path (nothing to gain here)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: steadier on a shared machine)")
    parser.add_argument("--n-val", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--val-every", type=int, default=8, help="validate every this many training batches")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", ".*does not have many workers.*")
    info = machine_info()
    print(f"machine: {info}")
    run_once(1000, False, args)  # warm-up: first-call costs (imports, allocator) paid by neither side
    rows = []
    for seed in range(args.seeds):
        for tuned in (False, True) if seed % 2 == 0 else (True, False):
            row = run_once(seed, tuned, args)
            rows.append(row)
            print(_line(row), flush=True)
    first = next(r for r in rows if r["tuned"])
    print("autotune's plan (first seed):")
    print("\n".join(f"  {n}" for n in first["notes"]))
    plain = statistics.median(r["seconds"] for r in rows if not r["tuned"])
    tuned = statistics.median(r["seconds"] for r in rows if r["tuned"])
    plain_cpu = statistics.median(r["cpu_s"] for r in rows if not r["tuned"])
    tuned_cpu = statistics.median(r["cpu_s"] for r in rows if r["tuned"])
    print(
        f"median seconds to val_acc {args.target} over {args.seeds} seeds: plain {plain:.2f}s, "
        f"autotune first run {tuned:.2f}s: {plain / tuned:.2f}x as fast (process CPU time: plain {plain_cpu:.2f}s, "
        f"autotune {tuned_cpu:.2f}s: {plain_cpu / tuned_cpu:.2f}x)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
