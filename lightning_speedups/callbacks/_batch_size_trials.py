"""The trial loop of ``ThroughputBatchSizeFinder``, and its other work on the live trainer.

Kept apart from the callback (which decides *when* to search and what to apply): :func:`run_trial` runs real,
timed optimizer steps at one batch size and returns a :class:`~lightning_speedups.functional.batch_size.BatchSizeTrial`
for the search policy; the helpers below re-batch loaders, find where the batch size lives and rescale live learning
rates. The Lightning internals a step goes through (batch hooks, strategy ``training_step``, logged results, DDP
no-sync) are reached through :mod:`lightning_speedups._compat`.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Callable, Iterable
from typing import Any

import lightning as L
import torch
from lightning.pytorch.utilities.data import extract_batch_size
from lightning.pytorch.utilities.memory import is_oom_error
from lightning.pytorch.utilities.rank_zero import rank_zero_info
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, RandomSampler, SequentialSampler

from lightning_speedups._compat import (
    before_batch_transfer,
    fit_source_dataloader,
    fit_source_instance,
    no_gradient_sync,
    refresh_scheduler_last_lr,
    set_results_batch,
    strategy_training_step,
)
from lightning_speedups._tokens import TokenCount
from lightning_speedups.functional.batch_size import (
    BatchSizeSearchConfig,
    BatchSizeSearchResult,
    BatchSizeTrial,
    MemoryMeter,
    scale_lr_factor,
)

__all__ = [
    "apply_lr_choice",
    "batch_size_holders",
    "dataset_len",
    "fit_loader_problem",
    "is_oom",
    "log_search",
    "rebuild_loader",
    "run_trial",
    "scale_live_lrs",
    "trial_progress_bar",
]

_LR_KEYS = ("lr", "initial_lr", "max_lr", "min_lr")


def is_oom(err: BaseException) -> bool:
    """Whether ``err`` is an out-of-memory error (CUDA or CPU allocator)."""
    return isinstance(err, torch.cuda.OutOfMemoryError) or is_oom_error(err)


def rebuild_loader(dl: DataLoader, batch_size: int) -> DataLoader:
    """The same plain ``DataLoader`` at another batch size (shuffle, workers, collate and pinning kept)."""
    kwargs: dict[str, Any] = dict(
        batch_size=batch_size, shuffle=isinstance(dl.sampler, RandomSampler), num_workers=dl.num_workers,
        collate_fn=dl.collate_fn, pin_memory=dl.pin_memory, drop_last=dl.drop_last, timeout=dl.timeout,
        worker_init_fn=dl.worker_init_fn, generator=dl.generator, persistent_workers=dl.persistent_workers,
    )
    if dl.num_workers > 0:
        kwargs.update(prefetch_factor=dl.prefetch_factor, multiprocessing_context=dl.multiprocessing_context)
    return DataLoader(dl.dataset, **kwargs)


def fit_loader_problem(instance: Any) -> str | None:
    """Why a dataloader passed to ``fit()`` cannot be re-batched, or ``None`` when it can."""
    if not isinstance(instance, DataLoader) or type(instance) is not DataLoader:
        return f"a `{type(instance).__name__}`"
    if isinstance(instance.dataset, IterableDataset):
        return "a DataLoader over an IterableDataset"
    if type(instance.batch_sampler) is not BatchSampler or type(instance.sampler) not in (RandomSampler,
                                                                                          SequentialSampler):
        return "a DataLoader with a custom sampler or batch_sampler"
    return None


def dataset_len(trainer: L.Trainer, fit_loader: DataLoader | None, probe: bool = False) -> int | None:
    """Training samples per device: of the loader passed to ``fit``, else the datamodule's ``train_set``, else (with
    ``probe``) of the dataset behind the train dataloader; ``None`` when unknown (an iterable dataset)."""
    world = max(1, trainer.world_size)
    dataset: Any = None
    if fit_loader is not None:
        dataset = fit_loader.dataset
    elif trainer.datamodule is not None and fit_source_instance(trainer) is trainer.datamodule:
        dataset = getattr(trainer.datamodule, "train_set", None)
    if dataset is None and probe:
        dataset = getattr(fit_source_dataloader(trainer), "dataset", None)
    try:
        return None if dataset is None else len(dataset) // world
    except TypeError:
        return None


def epoch_samples(trainer: L.Trainer, fit_loader: DataLoader | None, length: int | None) -> int | None:
    """``length`` (training samples per device) when the training loader keeps its last partial batch
    (``drop_last=False``, the default), so an epoch's cost includes that batch; ``None`` when it drops it."""
    if length is None:
        return None
    loader = fit_loader if fit_loader is not None else fit_source_dataloader(trainer)
    return None if getattr(loader, "drop_last", False) else length


def batch_size_holders(trainer: L.Trainer, pl_module: L.LightningModule, name: str) -> list[Any]:
    """Objects holding ``name``: model, datamodule, then their hparams (all are kept in sync)."""
    holders: list[Any] = []
    dm = trainer.datamodule
    for obj in (pl_module, dm):
        if obj is not None and hasattr(obj, name) and not isinstance(getattr(type(obj), name, None), property):
            holders.append(obj)
    for obj in (pl_module, dm):
        hp = getattr(obj, "hparams", None) if obj is not None else None
        if hp is not None and name in hp:
            holders.append(hp)
    return holders


def scale_live_lrs(trainer: L.Trainer, factor: float) -> None:
    """Multiply the learning rates of the live optimizers and schedulers' base lrs by ``factor``."""
    for opt in trainer.optimizers:
        for group in opt.param_groups:
            for key in _LR_KEYS:
                if isinstance(group.get(key), (int, float)) and not isinstance(group.get(key), bool):
                    group[key] = group[key] * factor
    for cfg_s in trainer.lr_scheduler_configs:
        sch = cfg_s.scheduler
        if hasattr(sch, "base_lrs"):
            sch.base_lrs = [lr * factor for lr in sch.base_lrs]
        refresh_scheduler_last_lr(sch)


def _mixin_lr_rule(pl_module: L.LightningModule) -> str | None:
    cfg = getattr(pl_module, "optimizer_config", None)
    return getattr(cfg, "lr_scaling", None)


def apply_lr_choice(trainer: L.Trainer, pl_module: L.LightningModule, result: BatchSizeSearchResult, fresh: bool,
                    scale_lr: str | None, current: int) -> None:
    """Rescale the learning rates for the chosen batch size (``scale_lr``, else a SpeedupMixin's ``lr_scaling``).

    ``fresh``: the search just ran (the factor is from the base size, and a mixin's ``optimizer_config.lr`` is scaled
    too); otherwise a stored choice is re-applied: nothing on resume (the checkpoint holds scaled optimizers), else
    from the ``current`` size.
    """
    rule = scale_lr or _mixin_lr_rule(pl_module)
    cfg = getattr(pl_module, "optimizer_config", None)
    # a mixin with its own `lr_scaling` recomputes lr from the batch size whenever it rebuilds: leave its config
    owns_cfg = cfg is not None and hasattr(cfg, "lr") and _mixin_lr_rule(pl_module) is None
    if fresh:
        result.lr_factor = scale_lr_factor(result.chosen, result.base_batch_size or result.chosen, rule)
        live = result.lr_factor
        if owns_cfg and result.lr_factor != 1.0:
            result.config_lr = cfg.lr * result.lr_factor
    elif trainer.ckpt_path is not None:
        live = 1.0  # resumed: optimizer and scheduler come back scaled from the checkpoint
    elif owns_cfg and result.config_lr is not None:
        live = 1.0 if cfg.lr == result.config_lr else result.lr_factor
    else:
        live = scale_lr_factor(result.chosen, current, rule)
    if owns_cfg and result.config_lr is not None:
        pl_module.optimizer_config = dataclasses.replace(cfg, lr=result.config_lr)
    if live != 1.0:
        scale_live_lrs(trainer, live)


def trial_progress_bar(trainer: L.Trainer) -> Any:
    """A tqdm bar for the trials on rank 0 when the trainer shows a progress bar, else ``None``."""
    if not (trainer.is_global_zero and trainer.progress_bar_callback is not None):
        return None
    from lightning.pytorch.callbacks.progress.tqdm_progress import Tqdm

    return Tqdm(desc="Batch-size search", unit="trial", leave=False, dynamic_ncols=True, file=sys.stdout)


def log_search(trainer: L.Trainer, result: BatchSizeSearchResult, verbose: bool) -> None:
    """The trial table on rank 0 (when ``verbose``) and the ``batch_size_finder/*`` metrics to every logger."""
    if verbose:
        rank_zero_info(f"ThroughputBatchSizeFinder (epoch {result.epoch}):\n{result.table()}")
    best = result.trial(result.chosen)
    metrics = {
        "batch_size_finder/chosen": float(result.chosen),
        "batch_size_finder/samples_per_s": best.samples_per_s if best else 0.0,
        "batch_size_finder/search_time_s": result.search_time_s,
    }
    if result.unit == "tokens":
        metrics["batch_size_finder/tokens_per_s"] = best.rate if best else 0.0
    for logger in trainer.loggers:
        logger.log_metrics(metrics, step=trainer.global_step)


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
        stats = torch.tensor([-rate, float(peak), float(oom), -tok_rate, float(not counted)], device=device,
                             dtype=torch.float64)
        stats = trainer.strategy.reduce(stats, reduce_op="max")
        rate, peak, oom, tok_rate = -float(stats[0]), int(stats[1]), bool(stats[2] > 0), -float(stats[3])
        counted = not bool(stats[4] > 0)
        times, elapsed, tokens = trainer.strategy.broadcast((times, elapsed, tokens), src=0)
    return BatchSizeTrial(size, rate, int(peak), "oom" if oom else "ok", list(times), float(elapsed),
                          tokens_per_s=tok_rate if counted else None, step_tokens=list(tokens) if counted else [])


def _timed_steps(trainer: L.Trainer, pl_module: L.LightningModule, loader: Iterable, cfg: BatchSizeSearchConfig,
                 warmup: int, rates: list[float], times: list[float], clock: Callable[[], float],
                 count_tokens: Callable[[Any], TokenCount | None] | None = None,
                 tokens: list[int] | None = None) -> None:
    """``warmup`` untimed steps, then timed ones until the step, sample or time budget of a trial is spent; with
    ``count_tokens``, each timed batch's real tokens go to ``tokens`` (none once a batch holds no tokens)."""
    device = trainer.strategy.root_device
    iterator = iter(loader)
    seen, spent, i = 0, 0.0, 0
    try:
        while True:
            timed = i >= warmup
            if timed and times and (
                len(times) >= cfg.steps_per_trial
                or (cfg.trial_samples is not None and seen >= cfg.trial_samples)
                or (cfg.trial_time is not None and spent >= cfg.trial_time)
            ):
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
