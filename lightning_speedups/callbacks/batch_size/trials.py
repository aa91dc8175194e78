"""The trials of ``ThroughputBatchSizeFinder`` on the live trainer: real, timed optimizer steps at one batch size.

Kept apart from the callback (which decides *when* to search and what to apply): :func:`search_on_trainer` runs the
search with the trainer's state put back afterwards, and :func:`run_trial` runs real, timed optimizer steps at one
batch size and returns a :class:`~lightning_speedups.functional.batch_size.BatchSizeTrial` for the search policy. The
Lightning internals a step goes through (batch hooks, strategy ``training_step``, logged results, DDP no-sync) are
reached through :mod:`lightning_speedups._compat`.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import lightning as L
import torch
from lightning.pytorch.utilities.data import extract_batch_size
from lightning.pytorch.utilities.memory import is_oom_error

from lightning_speedups._compat import (
    before_batch_transfer,
    no_gradient_sync,
    replace_training_results,
    restore_training_results,
    set_results_batch,
    strategy_training_step,
)
from lightning_speedups._tokens import TokenCount
from lightning_speedups.functional.batch_size import (
    BatchSizeSearchConfig,
    BatchSizeSearchResult,
    BatchSizeTrial,
    MemoryMeter,
    search_batch_size,
    snapshot_training_state,
)

__all__ = ["is_oom", "run_trial", "search_on_trainer", "trial_progress_bar"]


def is_oom(err: BaseException) -> bool:
    """Whether ``err`` is an out-of-memory error (CUDA or CPU allocator)."""
    return isinstance(err, torch.cuda.OutOfMemoryError) or is_oom_error(err)


def trial_progress_bar(trainer: L.Trainer) -> Any:
    """A tqdm bar for the trials on rank 0 when the trainer shows a progress bar, else ``None``."""
    if not (trainer.is_global_zero and trainer.progress_bar_callback is not None):
        return None
    from lightning.pytorch.callbacks.progress.tqdm_progress import Tqdm

    return Tqdm(desc="Batch-size search", unit="trial", leave=False, dynamic_ncols=True, file=sys.stdout)


def search_on_trainer(
    trainer: L.Trainer,
    pl_module: L.LightningModule,
    measure: Callable[[int], BatchSizeTrial],
    config: BatchSizeSearchConfig,
    meter: MemoryMeter,
    ladder: Sequence[int],
    *,
    allowed: Callable[[int], bool] | None = None,
    epoch_samples: int | None = None,
    progress_bar: bool = True,
) -> BatchSizeSearchResult:
    """:func:`~lightning_speedups.functional.batch_size.search_batch_size` with ``measure`` on the live trainer.

    The trials must leave no trace: the training state (weights, gradients, optimizers, schedulers, a grad scaler,
    metrics, RNG, module modes) is snapshot and put back, the trainer's callbacks do not see the trial steps, their
    logged values go to a throw-away collection, and manual optimization's step count is restored. The memory budget
    is ``config.memory_budget`` of what ``meter`` says this process may use.
    """
    optimizers = list(trainer.optimizers)
    schedulers = [c.scheduler for c in trainer.lr_scheduler_configs]
    scaler = getattr(trainer.precision_plugin, "scaler", None)
    bar = trial_progress_bar(trainer) if progress_bar else None
    saved_callbacks = trainer.callbacks
    saved_results = None
    manual = trainer.fit_loop.epoch_loop.manual_optimization.optim_step_progress
    manual_state = manual.state_dict()
    try:
        with snapshot_training_state(pl_module, optimizers, schedulers, [scaler] if scaler is not None else []):
            baseline = meter.current()
            budget = int(config.memory_budget * meter.capacity())
            trainer.callbacks = []  # other callbacks must not see trial steps
            saved_results = replace_training_results(trainer)  # trial logs go to a throw-away collection
            return search_batch_size(
                measure,
                config,
                ladder,
                memory_budget_bytes=budget,
                memory_baseline=baseline,
                allowed=allowed,
                on_trial=None if bar is None else lambda t: _show_trial(bar, t),
                epoch_samples=epoch_samples,
            )
    finally:
        trainer.callbacks = saved_callbacks
        if saved_results is not None:
            restore_training_results(trainer, saved_results)
        manual.load_state_dict(manual_state)
        if bar is not None:
            bar.close()


def _show_trial(bar: Any, t: BatchSizeTrial) -> None:
    """One trial on the progress bar: its size, rate and status."""
    bar.update(1)
    bar.set_postfix({"batch": t.batch_size, f"{t.unit}_per_s": f"{t.rate:.0f}", "status": t.status})


def run_trial(
    trainer: L.Trainer,
    pl_module: L.LightningModule,
    meter: MemoryMeter,
    loader: Iterable,
    size: int,
    config: BatchSizeSearchConfig,
    warmup: int,
    clock: Callable[[], float] = time.perf_counter,
    start: float | None = None,
    count_tokens: Callable[[Any], TokenCount | None] | None = None,
) -> BatchSizeTrial:
    """``warmup`` untimed then timed optimizer steps on ``loader`` (batches of ``size``); samples/s and peak memory.

    With ``count_tokens`` (``batch -> TokenCount | None``) every timed batch's real tokens are counted (on the batch
    as the loader yields it, after the step's clock reading); when all of them hold tokens the trial carries
    ``tokens_per_s`` and ``step_tokens`` and the search ranks tokens/s.

    An out-of-memory error ends the trial as ``"oom"``; any other error propagates. Gradients are dropped afterwards.
    Under DDP every rank agrees on the result (slowest rank's fastest rate, largest peak, any OOM, rank 0's step and
    elapsed times for the noise rules), so all take the same next step. ``clock`` times the steps; ``start`` (a
    ``clock`` reading) is when the trial began, loader set-up included, for ``elapsed_s``.
    """
    start = clock() if start is None else start
    device = trainer.strategy.root_device
    rates: list[float] = []
    times: list[float] = []
    tokens: list[int] = []
    oom = False
    pl_module.train()
    meter.start()
    try:
        # no gradient all-reduce: ranks measure independently, so an OOM on one rank cannot hang the others
        with no_gradient_sync(trainer.strategy):
            _timed_steps(trainer, pl_module, loader, config, warmup, rates, times, clock, count_tokens, tokens)
    except RuntimeError as err:
        if not is_oom(err):
            raise
        oom = True
    finally:
        for p in pl_module.parameters():
            p.grad = None
    peak = meter.stop()
    # the fastest timed step: interference from other processes only ever slows a step down
    rate = max(rates) if rates and not oom else 0.0
    counted = bool(times) and len(tokens) == len(times) and all(n > 0 for n in tokens)
    tok_rate = max(n / max(dt, 1e-9) for n, dt in zip(tokens, times)) if counted and not oom else 0.0
    elapsed = clock() - start
    if trainer.world_size > 1:  # agree per trial so every rank takes the same next step
        stats = torch.tensor(
            [-rate, float(peak), float(oom), -tok_rate, float(not counted)], device=device, dtype=torch.float64
        )
        stats = trainer.strategy.reduce(stats, reduce_op="max")
        rate = -float(stats[0])
        peak = int(stats[1])
        oom = bool(stats[2] > 0)
        tok_rate = -float(stats[3])
        counted = not bool(stats[4] > 0)
        times, elapsed, tokens = trainer.strategy.broadcast((times, elapsed, tokens), src=0)
    return BatchSizeTrial(
        size,
        rate,
        int(peak),
        "oom" if oom else "ok",
        list(times),
        float(elapsed),
        tokens_per_s=tok_rate if counted else None,
        step_tokens=list(tokens) if counted else [],
    )


def _timed_steps(
    trainer: L.Trainer,
    pl_module: L.LightningModule,
    loader: Iterable,
    cfg: BatchSizeSearchConfig,
    warmup: int,
    rates: list[float],
    times: list[float],
    clock: Callable[[], float],
    count_tokens: Callable[[Any], TokenCount | None] | None = None,
    tokens: list[int] | None = None,
) -> None:
    """``warmup`` untimed steps, then timed ones until the step, sample or time budget of a trial is spent; with
    ``count_tokens``, each timed batch's real tokens go to ``tokens`` (none once a batch holds no tokens)."""
    device = trainer.strategy.root_device
    iterator = iter(loader)
    seen = 0
    spent = 0.0
    i = 0
    try:
        while True:
            timed = i >= warmup
            if timed and cfg.trial_done(len(times), seen, spent):
                break
            t0 = clock()
            try:
                batch = next(iterator)
            except StopIteration:
                iterator = iter(loader)
                batch = next(iterator)
            n = extract_batch_size(batch)
            _train_step(trainer, pl_module, batch, i)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            dt = clock() - t0
            if timed:
                times.append(dt)
                rates.append(n / max(dt, 1e-9))
                seen += n
                spent += dt
                if count_tokens is not None and tokens is not None and len(tokens) == len(times) - 1:
                    count = count_tokens(batch)  # after the clock: counting is not the step's time
                    if count is not None:
                        tokens.append(count.tokens)
            i += 1
    finally:
        del iterator  # shuts worker processes down before the next size starts its own


def _train_step(trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, idx: int) -> None:
    """One step as the fit loop runs it: input conversion, batch hooks, device transfer, optimizer step."""
    batch = trainer.precision_plugin.convert_input(batch)
    batch = before_batch_transfer(pl_module, batch, dataloader_idx=0)
    batch = trainer.strategy.batch_to_device(batch, dataloader_idx=0)
    set_results_batch(trainer, batch)
    if not pl_module.automatic_optimization or not trainer.optimizers:
        out = strategy_training_step(trainer, batch, idx)
        loss = out["loss"] if isinstance(out, dict) else out
        if pl_module.automatic_optimization and isinstance(loss, torch.Tensor) and loss.requires_grad:
            trainer.strategy.backward(loss, None)
        return
    optimizer = trainer.optimizers[0]

    def closure() -> torch.Tensor | None:
        out = strategy_training_step(trainer, batch, idx)
        loss = out["loss"] if isinstance(out, dict) else out
        optimizer.zero_grad(set_to_none=True)
        if loss is not None:
            trainer.strategy.backward(loss, optimizer)
        return loss

    trainer.strategy.optimizer_step(optimizer, closure, pl_module)
