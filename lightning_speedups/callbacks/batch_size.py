"""ThroughputBatchSizeFinder: pick the batch size that trains fastest (or the largest that fits), then train with it."""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Iterable, Sequence
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, GradientAccumulationScheduler
from lightning.pytorch.loops.utilities import _block_parallel_sync_behavior
from lightning.pytorch.trainer import call
from lightning.pytorch.trainer.connectors.logger_connector.result import _ResultCollection
from lightning.pytorch.utilities.data import extract_batch_size
from lightning.pytorch.utilities.exceptions import _TunerExitException
from lightning.pytorch.utilities.memory import is_oom_error
from lightning.pytorch.utilities.rank_zero import rank_zero_info, rank_zero_warn
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, RandomSampler, SequentialSampler

from lightning_speedups._errors import SpeedupConfigError, check_choice
from lightning_speedups._registry import TechniqueInfo, register_technique
from lightning_speedups.functional.batch_size import (
    LR_RULES,
    BatchSizeSearchConfig,
    BatchSizeSearchResult,
    BatchSizeTrial,
    MemoryMeter,
    batch_size_ladder,
    scale_lr_factor,
    search_batch_size,
    snapshot_training_state,
)

__all__ = ["ThroughputBatchSizeFinder"]

_LR_KEYS = ("lr", "initial_lr", "max_lr", "min_lr")


def _is_oom(err: BaseException) -> bool:
    return isinstance(err, torch.cuda.OutOfMemoryError) or is_oom_error(err)


def _rebuild_loader(dl: DataLoader, batch_size: int) -> DataLoader:
    """The same plain ``DataLoader`` at another batch size (shuffle, workers, collate and pinning kept)."""
    kwargs: dict[str, Any] = dict(
        batch_size=batch_size, shuffle=isinstance(dl.sampler, RandomSampler), num_workers=dl.num_workers,
        collate_fn=dl.collate_fn, pin_memory=dl.pin_memory, drop_last=dl.drop_last, timeout=dl.timeout,
        worker_init_fn=dl.worker_init_fn, generator=dl.generator, persistent_workers=dl.persistent_workers,
    )
    if dl.num_workers > 0:
        kwargs.update(prefetch_factor=dl.prefetch_factor, multiprocessing_context=dl.multiprocessing_context)
    return DataLoader(dl.dataset, **kwargs)


def _fit_loader_problem(instance: Any) -> str | None:
    """Why a dataloader passed to ``fit()`` cannot be re-batched, or ``None`` when it can."""
    if not isinstance(instance, DataLoader) or type(instance) is not DataLoader:
        return f"a `{type(instance).__name__}`"
    if isinstance(instance.dataset, IterableDataset):
        return "a DataLoader over an IterableDataset"
    if type(instance.batch_sampler) is not BatchSampler or type(instance.sampler) not in (RandomSampler,
                                                                                          SequentialSampler):
        return "a DataLoader with a custom sampler or batch_sampler"
    return None


class ThroughputBatchSizeFinder(Callback):
    """Measure samples/s per batch size at the start of ``fit`` and train with the best one.

    Each trial runs real optimizer steps (data loading, forward, backward, step, through the trainer's strategy and
    precision) on the live model: ``warmup_steps`` untimed ones (first size only on CPU, every size on CUDA), then
    timed ones until ``steps_per_trial`` steps, ``trial_samples`` samples or ``trial_time`` seconds. Afterwards
    weights, gradients, optimizer, scheduler, metric and RNG state and module modes are put back bitwise, so training
    starts exactly as it would have. Nothing is written to disk. Unlike Lightning's ``BatchSizeFinder`` it does not
    climb until out-of-memory: doubling stops once samples/s stops improving by ``min_gain`` (``patience`` times in a
    row).

    Args:
        mode: ``"throughput"`` (default), ``"max_fit"`` or ``"sweep"``; see :class:`BatchSizeSearchConfig`.
        init_val, max_val, steps_per_trial, warmup_steps, trial_samples, trial_time, min_gain, patience,
            early_plateau, refine_steps, memory_budget, max_trials: see
            :class:`~lightning_speedups.functional.batch_size.BatchSizeSearchConfig`.
        scale_lr: ``"linear"`` | ``"sqrt"`` | ``None``: rescale learning rates (optimizer groups, scheduler base
            lrs, a SpeedupMixin's ``optimizer_config.lr``) from the old batch size to the chosen one.
        keep_global_batch: ``True`` keeps ``batch_size * accumulate_grad_batches`` as it was; an ``int`` sets that
            per-device target. Only sizes that divide it are tried, and ``accumulate_grad_batches`` makes up the rest.
        attr_name: the attribute holding the batch size, looked up on the model, the datamodule, then their hparams.
        rerun_at_epochs: epochs at whose start to search again (the first search always runs at fit start).
        progress_bar: show a tqdm bar on rank 0 when the trainer shows one.
        verbose: log the trial table (rank 0).
        exit_after_search: end ``fit`` right after the first search, without training (what
            :func:`lightning_speedups.tuner.find_batch_size` uses; Lightning's ``Tuner`` does the same).

    Example::

        >>> import lightning as L
        >>> from lightning_speedups.demo import DemoClassifier, DigitsDataModule
        >>> finder = ThroughputBatchSizeFinder(init_val=16, max_val=32, steps_per_trial=1, warmup_steps=0)
        >>> trainer = L.Trainer(accelerator="cpu", max_steps=1, callbacks=[finder], logger=False,
        ...                     enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False)
        >>> dm = DigitsDataModule()
        >>> trainer.fit(DemoClassifier(width=8), datamodule=dm)
        >>> dm.batch_size == finder.result.chosen
        True
    """

    def __init__(
        self,
        mode: str = "throughput",
        init_val: int = 16,
        max_val: int = 4096,
        steps_per_trial: int = 3,
        warmup_steps: int = 1,
        trial_samples: int | None = 256,
        trial_time: float | None = 1.0,
        min_gain: float = 0.05,
        patience: int = 2,
        early_plateau: bool = True,
        refine_steps: int = 0,
        memory_budget: float = 0.9,
        scale_lr: str | None = None,
        keep_global_batch: bool | int = False,
        attr_name: str = "batch_size",
        max_trials: int = 16,
        rerun_at_epochs: Sequence[int] = (),
        progress_bar: bool = True,
        verbose: bool = True,
        exit_after_search: bool = False,
    ) -> None:
        self.config = BatchSizeSearchConfig(
            mode=mode, init_val=init_val, max_val=max_val, steps_per_trial=steps_per_trial,
            warmup_steps=warmup_steps, trial_samples=trial_samples, trial_time=trial_time, min_gain=min_gain,
            patience=patience, early_plateau=early_plateau, refine_steps=refine_steps, memory_budget=memory_budget,
            max_trials=max_trials,
        )
        self.scale_lr = check_choice("scale_lr", scale_lr, LR_RULES)
        if not isinstance(keep_global_batch, (bool, int)) or (
            not isinstance(keep_global_batch, bool) and keep_global_batch < 1
        ):
            raise SpeedupConfigError(
                f"`keep_global_batch`={keep_global_batch!r} is invalid. Allowed values: True, False or a positive int."
            )
        if keep_global_batch is not False and scale_lr is not None:
            raise SpeedupConfigError(
                f"`scale_lr`={scale_lr!r} cannot be combined with `keep_global_batch`={keep_global_batch!r}. "
                "Allowed values: scale_lr=None when the global batch is kept. HINT: the effective batch does not "
                "change, so the learning rate should not either."
            )
        if not isinstance(attr_name, str) or not attr_name.isidentifier():
            raise SpeedupConfigError(f"`attr_name`={attr_name!r} is invalid. Allowed values: an attribute name.")
        epochs = list(rerun_at_epochs)
        if any(not isinstance(e, int) or isinstance(e, bool) or e < 0 for e in epochs):
            raise SpeedupConfigError(f"`rerun_at_epochs`={epochs!r} is invalid. Allowed values: integers >= 0.")
        if not isinstance(exit_after_search, bool):
            raise SpeedupConfigError(
                f"`exit_after_search`={exit_after_search!r} is invalid. Allowed values: True or False."
            )
        self.keep_global_batch = keep_global_batch
        self.attr_name = attr_name
        self.rerun_at_epochs = tuple(epochs)
        self.progress_bar, self.verbose = progress_bar, verbose
        self.result: BatchSizeSearchResult | None = None
        self.history: list[BatchSizeSearchResult] = []
        self._restored = False
        self.exit_after_search = exit_after_search
        self._fit_loader: DataLoader | None = None
        self._trials_run = 0

    # ------------------------------------------------------------------ checkpoint state
    def state_dict(self) -> dict[str, Any]:
        return {"history": [r.as_dict() for r in self.history]}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.history = [BatchSizeSearchResult.from_dict(d) for d in state_dict.get("history", [])]
        self.result = self.history[-1] if self.history else None
        self._restored = self.result is not None

    # ------------------------------------------------------------------ where the batch size lives
    def _holders(self, trainer: L.Trainer, pl_module: L.LightningModule) -> list[Any]:
        """Objects holding ``attr_name``: model, datamodule, then their hparams (all are kept in sync)."""
        name, holders = self.attr_name, []
        dm = trainer.datamodule
        for obj in (pl_module, dm):
            if obj is not None and hasattr(obj, name) and not isinstance(getattr(type(obj), name, None), property):
                holders.append(obj)
        for obj in (pl_module, dm):
            hp = getattr(obj, "hparams", None) if obj is not None else None
            if hp is not None and name in hp:
                holders.append(hp)
        return holders

    def _get_size(self, trainer: L.Trainer, pl_module: L.LightningModule) -> int:
        holders = self._holders(trainer, pl_module)
        if holders:
            first = holders[0]
            return int(first[self.attr_name] if isinstance(first, dict) else getattr(first, self.attr_name))
        assert self._fit_loader is not None and self._fit_loader.batch_size is not None
        return int(self._fit_loader.batch_size)

    def _set_size(self, trainer: L.Trainer, pl_module: L.LightningModule, size: int) -> None:
        for holder in self._holders(trainer, pl_module):
            if isinstance(holder, dict):
                holder[self.attr_name] = size
            else:
                setattr(holder, self.attr_name, size)
        if self._fit_loader is not None:
            trainer.fit_loop._data_source.instance = _rebuild_loader(self._fit_loader, size)

    def _make_loader(self, trainer: L.Trainer, pl_module: L.LightningModule, size: int) -> Iterable:
        self._set_size(trainer, pl_module, size)
        loader = trainer.fit_loop._data_source.dataloader()
        actual = getattr(loader, "batch_size", size)
        if actual is not None and actual != size:
            raise SpeedupConfigError(
                f"`attr_name`={self.attr_name!r} was set to {size} but the train dataloader still uses batch size "
                f"{actual}. HINT: build the DataLoader in `train_dataloader()` with `batch_size=self.{self.attr_name}`."
            )
        return loader

    # ------------------------------------------------------------------ hooks
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        source = trainer.fit_loop._data_source
        self._fit_loader = None
        if not source.is_module():
            problem = _fit_loader_problem(source.instance)
            if problem is not None:
                raise SpeedupConfigError(
                    f"`train_dataloaders` passed to `fit()` is {problem}, whose batch size cannot be changed. "
                    "Allowed values: a plain torch DataLoader over a map-style dataset. HINT: pass a "
                    "LightningDataModule (or define `train_dataloader()`) that reads `self.batch_size`."
                )
            self._fit_loader = source.instance
        elif not self._holders(trainer, pl_module):
            raise SpeedupConfigError(
                f"`attr_name`={self.attr_name!r} was not found. Looked in: the model, the datamodule, "
                f"`model.hparams` and `datamodule.hparams`. HINT: add `self.{self.attr_name} = ...` to the module that "
                "builds the train DataLoader and read it there."
            )
        if self.keep_global_batch is not False:
            if any(isinstance(c, GradientAccumulationScheduler) for c in trainer.callbacks):
                raise SpeedupConfigError(
                    "`keep_global_batch` cannot be used with a `GradientAccumulationScheduler` callback. "
                    "Allowed values: keep_global_batch=False. HINT: both set `accumulate_grad_batches`."
                )
            target = self._global_target(trainer, pl_module)
            length = self._dataset_len(trainer)
            if length is not None and target > length:
                raise SpeedupConfigError(
                    f"`keep_global_batch`={self.keep_global_batch!r} asks for {target} samples per optimizer step but "
                    f"the training set has {length} per device. Allowed values: a target <= {length}."
                )
            if target < self.config.init_val:
                raise SpeedupConfigError(
                    f"`keep_global_batch` target {target} is smaller than `init_val`={self.config.init_val}. "
                    f"Allowed values: init_val <= {target}."
                )

    def _global_target(self, trainer: L.Trainer, pl_module: L.LightningModule) -> int:
        if self.keep_global_batch is True:
            return self._get_size(trainer, pl_module) * max(1, trainer.accumulate_grad_batches)
        return int(self.keep_global_batch)

    def _dataset_len(self, trainer: L.Trainer) -> int | None:
        source = trainer.fit_loop._data_source
        if self._fit_loader is not None:
            dataset = self._fit_loader.dataset
        elif trainer.datamodule is not None and source.instance is trainer.datamodule:
            dataset = getattr(trainer.datamodule, "train_set", None)
            if dataset is None:
                return None
        else:
            return None
        try:
            return len(dataset) // max(1, trainer.world_size)  # type: ignore[arg-type]
        except TypeError:
            return None

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.fast_dev_run:
            rank_zero_warn("ThroughputBatchSizeFinder: skipped because `fast_dev_run` is set.")
            return
        if self.result is not None:
            # resumed (or a second fit): reuse the stored choice instead of searching again
            self._apply(trainer, pl_module, self.result, fresh=False)
            return
        self.search(trainer, pl_module)
        if self.exit_after_search:
            raise _TunerExitException()

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        epoch = trainer.current_epoch
        if epoch not in self.rerun_at_epochs or any(r.epoch == epoch for r in self.history) or trainer.fast_dev_run:
            return
        self.search(trainer, pl_module)
        # the epoch's dataloader was already built: rebuild it at the new size
        loop = trainer.fit_loop
        if loop._data_fetcher is not None:
            loop._data_fetcher.teardown()
        loop._combined_loader = None
        loop.setup_data()
        from lightning.fabric.utilities.data import _set_sampler_epoch

        for dl in loop._combined_loader.flattened if loop._combined_loader is not None else []:
            _set_sampler_epoch(dl, loop.epoch_progress.current.processed)

    # ------------------------------------------------------------------ the search
    def search(self, trainer: L.Trainer, pl_module: L.LightningModule) -> BatchSizeSearchResult:
        """Run the search now on the live trainer and apply its choice (also usable from your own hook)."""
        start = time.perf_counter()
        self._trials_run = 0
        base = self._get_size(trainer, pl_module)
        device = trainer.strategy.root_device
        meter = MemoryMeter(device, local_world_size=getattr(trainer, "num_devices", 1) if device.type == "cpu" else 1)
        allowed = None
        target = self._global_target(trainer, pl_module) if self.keep_global_batch is not False else None
        cap = self.config.max_val
        length = self._dataset_len(trainer)
        if length is None:
            length = self._probe_len(trainer, pl_module)
        if length is not None:
            cap = min(cap, max(1, length))
        if target is not None:
            allowed = lambda b: target % b == 0  # noqa: E731
            cap = min(cap, target)
        ladder = batch_size_ladder(min(self.config.init_val, cap), cap, allowed)
        optimizers = list(trainer.optimizers)
        schedulers = [c.scheduler for c in trainer.lr_scheduler_configs]
        scaler = getattr(trainer.precision_plugin, "scaler", None)
        bar = self._bar(trainer)
        saved_callbacks, loop = trainer.callbacks, trainer.fit_loop.epoch_loop
        saved_results = loop._results
        manual = loop.manual_optimization.optim_step_progress
        manual_state = manual.state_dict()
        try:
            with snapshot_training_state(pl_module, optimizers, schedulers, [scaler] if scaler is not None else []):
                baseline = meter.current()
                budget = int(self.config.memory_budget * meter.capacity())
                trainer.callbacks = []  # other callbacks must not see trial steps
                loop._results = _ResultCollection(training=True)  # trial logs go to a throw-away collection

                def on_trial(t: BatchSizeTrial) -> None:
                    if bar is not None:
                        bar.update(1)
                        bar.set_postfix(batch=t.batch_size, samples_per_s=f"{t.samples_per_s:.0f}", status=t.status)

                result = search_batch_size(
                    lambda b: self._trial(trainer, pl_module, meter, b), self.config, ladder,
                    memory_budget_bytes=budget, memory_baseline=baseline, allowed=allowed, on_trial=on_trial,
                )
        except BaseException:
            self._set_size(trainer, pl_module, base)
            raise
        finally:
            trainer.callbacks = saved_callbacks
            loop._results = saved_results
            manual.load_state_dict(manual_state)
            if bar is not None:
                bar.close()
        # every rank must train with the same size: take the smallest choice
        chosen = int(trainer.strategy.reduce(torch.tensor(result.chosen, device=device), reduce_op="min").item())
        result.chosen = chosen
        result.base_batch_size = base
        result.epoch = trainer.current_epoch
        result.search_time_s = time.perf_counter() - start
        if target is not None:
            result.accumulate_grad_batches = max(1, target // chosen)
        self._apply(trainer, pl_module, result, fresh=True)
        self.result = result
        self.history.append(result)
        self._log(trainer, result)
        return result

    def _probe_len(self, trainer: L.Trainer, pl_module: L.LightningModule) -> int | None:
        loader = trainer.fit_loop._data_source.dataloader()
        try:
            return len(loader.dataset) // max(1, trainer.world_size)  # type: ignore[union-attr]
        except (TypeError, AttributeError):
            return None

    def _trial(self, trainer: L.Trainer, pl_module: L.LightningModule, meter: MemoryMeter, size: int) -> BatchSizeTrial:
        loader = self._make_loader(trainer, pl_module, size)
        device = trainer.strategy.root_device
        # the process is warm after the first size; only CUDA pays again per shape (cuDNN autotune, allocator)
        warmup = self.config.warmup_steps if (self._trials_run == 0 or device.type == "cuda") else 0
        self._trials_run += 1
        rates: list[float] = []
        times: list[float] = []
        oom = False
        pl_module.train()
        meter.start()
        try:
            # no gradient all-reduce: ranks measure independently, so an OOM on one rank cannot hang the others
            with _block_parallel_sync_behavior(trainer.strategy, block=True):
                self._steps(trainer, pl_module, loader, warmup, rates, times)
        except RuntimeError as err:
            if not _is_oom(err):
                raise
            oom = True
        finally:
            for p in pl_module.parameters():
                p.grad = None
        peak = meter.stop()
        # the fastest timed step: interference from other processes only ever slows a step down
        rate = max(rates) if rates and not oom else 0.0
        if trainer.world_size > 1:  # agree per trial so every rank takes the same next step
            stats = torch.tensor([-rate, float(peak), float(oom)], device=device, dtype=torch.float64)
            stats = trainer.strategy.reduce(stats, reduce_op="max")
            rate, peak, oom = -float(stats[0]), int(stats[1]), bool(stats[2] > 0)
        return BatchSizeTrial(size, rate, int(peak), "oom" if oom else "ok", times)

    def _steps(self, trainer: L.Trainer, pl_module: L.LightningModule, loader: Iterable, warmup: int,
               rates: list[float], times: list[float]) -> None:
        """``warmup`` untimed steps, then timed ones until the step, sample or time budget of a trial is spent."""
        cfg = self.config
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
                t0 = time.perf_counter()
                try:
                    batch = next(iterator)
                except StopIteration:
                    iterator = iter(loader)
                    batch = next(iterator)
                n = extract_batch_size(batch)
                self._step(trainer, pl_module, batch, i)
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                dt = time.perf_counter() - t0
                if timed:
                    times.append(dt)
                    rates.append(n / max(dt, 1e-9))
                    seen += n
                    spent += dt
                i += 1
        finally:
            del iterator  # shuts worker processes down before the next size starts its own

    def _step(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, idx: int) -> None:
        batch = trainer.precision_plugin.convert_input(batch)
        batch = pl_module._on_before_batch_transfer(batch, dataloader_idx=0)
        batch = trainer.strategy.batch_to_device(batch, dataloader_idx=0)
        loop = trainer.fit_loop.epoch_loop
        loop._results.batch = batch
        if not pl_module.automatic_optimization or not trainer.optimizers:
            out = call._call_strategy_hook(trainer, "training_step", batch, idx)
            loss = out["loss"] if isinstance(out, dict) else out
            if pl_module.automatic_optimization and isinstance(loss, torch.Tensor) and loss.requires_grad:
                trainer.strategy.backward(loss, None)
            return
        optimizer = trainer.optimizers[0]

        def closure() -> torch.Tensor | None:
            out = call._call_strategy_hook(trainer, "training_step", batch, idx)
            loss = out["loss"] if isinstance(out, dict) else out
            optimizer.zero_grad(set_to_none=True)
            if loss is not None:
                trainer.strategy.backward(loss, optimizer)
            return loss

        trainer.strategy.optimizer_step(optimizer, closure, pl_module)

    # ------------------------------------------------------------------ applying the choice
    def _apply(self, trainer: L.Trainer, pl_module: L.LightningModule, result: BatchSizeSearchResult,
               fresh: bool) -> None:
        current = self._get_size(trainer, pl_module)
        self._set_size(trainer, pl_module, result.chosen)
        if result.accumulate_grad_batches is not None:
            trainer.accumulate_grad_batches = result.accumulate_grad_batches
        rule = self.scale_lr or self._mixin_rule(pl_module)
        cfg = getattr(pl_module, "optimizer_config", None)
        # a mixin with its own `lr_scaling` recomputes lr from the batch size whenever it rebuilds: leave its config
        owns_cfg = cfg is not None and hasattr(cfg, "lr") and self._mixin_rule(pl_module) is None
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
            self._scale_live(trainer, live)

    @staticmethod
    def _scale_live(trainer: L.Trainer, factor: float) -> None:
        for opt in trainer.optimizers:
            for group in opt.param_groups:
                for key in _LR_KEYS:
                    if isinstance(group.get(key), (int, float)) and not isinstance(group.get(key), bool):
                        group[key] = group[key] * factor
        for cfg_s in trainer.lr_scheduler_configs:
            sch = cfg_s.scheduler
            if hasattr(sch, "base_lrs"):
                sch.base_lrs = [lr * factor for lr in sch.base_lrs]
            if hasattr(sch, "_last_lr"):
                sch._last_lr = [g["lr"] for g in sch.optimizer.param_groups]

    @staticmethod
    def _mixin_rule(pl_module: L.LightningModule) -> str | None:
        cfg = getattr(pl_module, "optimizer_config", None)
        return getattr(cfg, "lr_scaling", None)

    def _bar(self, trainer: L.Trainer) -> Any:
        if not (self.progress_bar and trainer.is_global_zero and trainer.progress_bar_callback is not None):
            return None
        from lightning.pytorch.callbacks.progress.tqdm_progress import Tqdm

        return Tqdm(desc="Batch-size search", unit="trial", leave=False, dynamic_ncols=True, file=sys.stdout)

    def _log(self, trainer: L.Trainer, result: BatchSizeSearchResult) -> None:
        if self.verbose:
            rank_zero_info(f"ThroughputBatchSizeFinder (epoch {result.epoch}):\n{result.table()}")
        best = result.trial(result.chosen)
        metrics = {
            "batch_size_finder/chosen": float(result.chosen),
            "batch_size_finder/samples_per_s": best.samples_per_s if best else 0.0,
            "batch_size_finder/search_time_s": result.search_time_s,
        }
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=trainer.global_step)


register_technique(
    TechniqueInfo(
        name="batch_size_finder",
        callback=ThroughputBatchSizeFinder,
        functional=search_batch_size,
        summary="Pick the batch size with the highest measured samples/s (stops at the plateau, not at OOM).",
        mission_tip="7: batch size",
        bench="lightning_speedups.benchmarks.batch_size:run",
        example_kwargs=dict(init_val=16, max_val=32, steps_per_trial=1, warmup_steps=0, progress_bar=False),
    )
)
