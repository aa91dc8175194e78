"""ThroughputBatchSizeFinder: pick the batch size that trains fastest (or the largest that fits), then train with it."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, GradientAccumulationScheduler
from lightning.pytorch.utilities.rank_zero import rank_zero_warn
from torch.utils.data import DataLoader

from lightning_speedups._compat import (
    fit_source_dataloader,
    fit_source_instance,
    fit_source_is_module,
    reload_train_dataloader,
    replace_training_results,
    restore_training_results,
    set_fit_train_loader,
    train_dataloader_built,
    tuner_exit,
)
from lightning_speedups._errors import SpeedupConfigError, check_choice, check_int
from lightning_speedups._registry import TechniqueInfo, register_technique
from lightning_speedups._tokens import TokenCounter
from lightning_speedups.callbacks._batch_size_trials import (
    apply_lr_choice,
    batch_size_holders,
    dataset_len,
    epoch_samples,
    fit_loader_problem,
    log_search,
    rebuild_loader,
    run_trial,
    trial_progress_bar,
)
from lightning_speedups.functional.batch_size import (
    LR_RULES,
    BatchSizeSearchConfig,
    BatchSizeSearchResult,
    BatchSizeTrial,
    MemoryMeter,
    batch_size_ladder,
    search_batch_size,
    snapshot_training_state,
)

__all__ = ["ThroughputBatchSizeFinder", "UNITS"]

UNITS = ("auto", "samples")  # what the trials' rates count: real tokens on token sequences ("auto"), or samples

class ThroughputBatchSizeFinder(Callback):
    """Measure samples/s per batch size at the start of ``fit`` and train with the best one.

    Each trial runs real optimizer steps (data loading, forward, backward, step, through the trainer's strategy and
    precision) on the live model: ``warmup_steps`` untimed ones (first size only on CPU, every size on CUDA), then
    timed ones until ``steps_per_trial`` steps, ``trial_samples`` samples or ``trial_time`` seconds. Afterwards
    weights, gradients, optimizer, scheduler, metric and RNG state and module modes are put back bitwise, so training
    starts exactly as it would have. Nothing is written to disk. Unlike Lightning's ``BatchSizeFinder`` it does not
    climb until out-of-memory: doubling stops once samples/s stops improving by ``min_gain`` (``patience`` times in a
    row). Timing noise (other processes, loaders) cannot stop it: a stop needs paired, interleaved re-measurements of
    both sizes that clear the noise, and the fastest sizes are re-measured interleaved before the choice; the result
    holds that evidence (``decisions``, ``final``, ``note``). On token sequences (a 2-D integer ``input_ids``; see
    :func:`~lightning_speedups._tokens.count_tokens`) it measures real, non-pad tokens/s instead of samples/s: with
    dynamic padding a larger batch pads to a longer sample, so samples/s would not count the work done. The result's
    ``unit`` and its table say which (``"tokens"``: "measured in real (non-pad) tokens/s").

    Args:
        mode: ``"throughput"`` (default), ``"max_fit"`` or ``"sweep"``; see :class:`BatchSizeSearchConfig`.
        init_val, max_val, steps_per_trial, warmup_steps, trial_samples, trial_time: see
            :class:`~lightning_speedups.functional.batch_size.BatchSizeSearchConfig`.
        min_gain, patience, early_plateau, refine_steps, memory_budget, max_trials: see
            :class:`~lightning_speedups.functional.batch_size.BatchSizeSearchConfig`.
        confirm_rounds, confirm_top, search_time, confirm_budget: the guard against timing noise and the budgets; see
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
        clock: seconds as a float for timing the steps (injectable, so a test can feed it noise).
        unit: ``"auto"`` (tokens/s when the batches hold token sequences, else samples/s) or ``"samples"``.
        pad_value: the padding token id, for token batches without an attention mask (``None``: not used).

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
        confirm_rounds: int = 3,
        confirm_top: int = 2,
        search_time: float | None = None,
        confirm_budget: float | None = 2.0,
        clock: Callable[[], float] = time.perf_counter,
        unit: str = "auto",
        pad_value: int | None = None,
    ) -> None:
        self.config = BatchSizeSearchConfig(
            mode=mode, init_val=init_val, max_val=max_val, steps_per_trial=steps_per_trial,
            warmup_steps=warmup_steps, trial_samples=trial_samples, trial_time=trial_time, min_gain=min_gain,
            patience=patience, early_plateau=early_plateau, refine_steps=refine_steps, memory_budget=memory_budget,
            max_trials=max_trials, confirm_rounds=confirm_rounds, confirm_top=confirm_top, search_time=search_time,
            confirm_budget=confirm_budget,
        )
        if not callable(clock):
            raise SpeedupConfigError(f"`clock`={clock!r} is invalid. Allowed values: a callable returning seconds.")
        self.clock = clock
        self.scale_lr = check_choice("scale_lr", scale_lr, LR_RULES)
        self.unit, self.pad_value = check_choice("unit", unit, UNITS), check_int("pad_value", pad_value, optional=True)
        self._counter = TokenCounter(pad_value) if unit == "auto" else None
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
        self._warm: set[int] = set()

    # ------------------------------------------------------------------ checkpoint state
    def state_dict(self) -> dict[str, Any]:
        return {"history": [r.as_dict() for r in self.history]}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.history = [BatchSizeSearchResult.from_dict(d) for d in state_dict.get("history", [])]
        self.result = self.history[-1] if self.history else None
        self._restored = self.result is not None

    # ------------------------------------------------------------------ where the batch size lives
    def _holders(self, trainer: L.Trainer, pl_module: L.LightningModule) -> list[Any]:
        return batch_size_holders(trainer, pl_module, self.attr_name)

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
            set_fit_train_loader(trainer, rebuild_loader(self._fit_loader, size))

    def _make_loader(self, trainer: L.Trainer, pl_module: L.LightningModule, size: int) -> Iterable:
        self._set_size(trainer, pl_module, size)
        loader = fit_source_dataloader(trainer)
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
        self._fit_loader = None
        if not fit_source_is_module(trainer):
            instance = fit_source_instance(trainer)
            problem = fit_loader_problem(instance)
            if problem is not None:
                raise SpeedupConfigError(
                    f"`train_dataloaders` passed to `fit()` is {problem}, whose batch size cannot be changed. "
                    "Allowed values: a plain torch DataLoader over a map-style dataset. HINT: pass a "
                    "LightningDataModule (or define `train_dataloader()`) that reads `self.batch_size`."
                )
            self._fit_loader = instance
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
            length = dataset_len(trainer, self._fit_loader)
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

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.fast_dev_run:
            rank_zero_warn("ThroughputBatchSizeFinder: skipped because `fast_dev_run` is set.")
            return
        if self.result is not None:
            # resumed (or a second fit): reuse the stored choice instead of searching again
            self._apply(trainer, pl_module, self.result, fresh=False)
        else:
            self.search(trainer, pl_module)
            if self.exit_after_search:
                raise tuner_exit()
        if train_dataloader_built(trainer):  # an earlier callback's trial loop built it at the old size: rebuild
            reload_train_dataloader(trainer)

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        epoch = trainer.current_epoch
        if epoch not in self.rerun_at_epochs or any(r.epoch == epoch for r in self.history) or trainer.fast_dev_run:
            return
        self.search(trainer, pl_module)
        reload_train_dataloader(trainer)  # the epoch's dataloader was already built: rebuild it at the new size

    # ------------------------------------------------------------------ the search
    def search(self, trainer: L.Trainer, pl_module: L.LightningModule) -> BatchSizeSearchResult:
        """Run the search now on the live trainer and apply its choice (also usable from your own hook)."""
        start = self.clock()
        self._warm = set()
        base = self._get_size(trainer, pl_module)
        device = trainer.strategy.root_device
        meter = MemoryMeter(device, local_world_size=getattr(trainer, "num_devices", 1) if device.type == "cpu" else 1)
        allowed = None
        target = self._global_target(trainer, pl_module) if self.keep_global_batch is not False else None
        cap = self.config.max_val
        length = dataset_len(trainer, self._fit_loader, probe=True)
        if length is not None:
            cap = min(cap, max(1, length))
        if target is not None:
            allowed = lambda b: target % b == 0  # noqa: E731
            cap = min(cap, target)
        ladder = batch_size_ladder(min(self.config.init_val, cap), cap, allowed)
        per_epoch = epoch_samples(trainer, self._fit_loader, length)
        optimizers = list(trainer.optimizers)
        schedulers = [c.scheduler for c in trainer.lr_scheduler_configs]
        scaler = getattr(trainer.precision_plugin, "scaler", None)
        bar = trial_progress_bar(trainer) if self.progress_bar else None
        saved_callbacks, saved_results = trainer.callbacks, None
        manual = trainer.fit_loop.epoch_loop.manual_optimization.optim_step_progress
        manual_state = manual.state_dict()
        try:
            with snapshot_training_state(pl_module, optimizers, schedulers, [scaler] if scaler is not None else []):
                baseline = meter.current()
                budget = int(self.config.memory_budget * meter.capacity())
                trainer.callbacks = []  # other callbacks must not see trial steps
                saved_results = replace_training_results(trainer)  # trial logs go to a throw-away collection

                def on_trial(t: BatchSizeTrial) -> None:
                    if bar is not None:
                        bar.update(1)
                        bar.set_postfix({"batch": t.batch_size, f"{t.unit}_per_s": f"{t.rate:.0f}", "status": t.status})

                result = search_batch_size(
                    lambda b: self._trial(trainer, pl_module, meter, b), self.config, ladder,
                    memory_budget_bytes=budget, memory_baseline=baseline, allowed=allowed, on_trial=on_trial,
                    epoch_samples=per_epoch,
                )
        except BaseException:
            self._set_size(trainer, pl_module, base)
            raise
        finally:
            trainer.callbacks = saved_callbacks
            if saved_results is not None:
                restore_training_results(trainer, saved_results)
            manual.load_state_dict(manual_state)
            if bar is not None:
                bar.close()
        # every rank must train with the same size: take the smallest choice
        chosen = int(trainer.strategy.reduce(torch.tensor(result.chosen, device=device), reduce_op="min").item())
        result.chosen = chosen
        result.base_batch_size = base
        result.epoch = trainer.current_epoch
        result.search_time_s = self.clock() - start
        if target is not None:
            result.accumulate_grad_batches = max(1, target // chosen)
        self._apply(trainer, pl_module, result, fresh=True)
        self.result = result
        self.history.append(result)
        log_search(trainer, result, verbose=self.verbose)
        return result

    def _trial(self, trainer: L.Trainer, pl_module: L.LightningModule, meter: MemoryMeter, size: int) -> BatchSizeTrial:
        start = self.clock()
        loader = self._make_loader(trainer, pl_module, size)
        # the process is warm after the first size; only CUDA pays again per new shape (cuDNN autotune, allocator)
        cold = not self._warm or (trainer.strategy.root_device.type == "cuda" and size not in self._warm)
        self._warm.add(size)
        return run_trial(trainer, pl_module, meter, loader, size, self.config,
                         warmup=self.config.warmup_steps if cold else 0, clock=self.clock, start=start,
                         count_tokens=self._counter)

    # ------------------------------------------------------------------ applying the choice
    def _apply(self, trainer: L.Trainer, pl_module: L.LightningModule, result: BatchSizeSearchResult,
               fresh: bool) -> None:
        current = self._get_size(trainer, pl_module)
        self._set_size(trainer, pl_module, result.chosen)
        if result.accumulate_grad_batches is not None:
            trainer.accumulate_grad_batches = result.accumulate_grad_batches
        apply_lr_choice(trainer, pl_module, result, fresh, self.scale_lr, current)


register_technique(
    TechniqueInfo(
        name="batch_size_finder",
        callback=ThroughputBatchSizeFinder,
        functional=search_batch_size,
        summary="Pick the batch size with the highest measured samples/s, or real tokens/s on token sequences "
        "(stops at the plateau, not at OOM).",
        mission_tip="7",
        bench="lightning_speedups.benchmarks.batch_size:run",
        example_kwargs=dict(init_val=16, max_val=32, steps_per_trial=1, warmup_steps=0, progress_bar=False),
    )
)
