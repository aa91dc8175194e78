"""ThroughputBatchSizeFinder: pick the batch size that trains fastest (or the largest that fits), then train with it."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, GradientAccumulationScheduler
from lightning.pytorch.utilities.rank_zero import rank_zero_deprecation, rank_zero_warn
from torch.utils.data import DataLoader
from typing_extensions import override

from lightning_speedups._compat import (
    fit_source_dataloader,
    fit_source_instance,
    fit_source_is_module,
    reload_train_dataloader,
    set_fit_train_loader,
    train_dataloader_built,
    tuner_exit,
)
from lightning_speedups._errors import SpeedupConfigError, check_choice, check_int
from lightning_speedups._registry import TechniqueInfo, register_technique
from lightning_speedups._strategies import refuse_sharded
from lightning_speedups._tokens import TokenCounter
from lightning_speedups.callbacks.batch_size.apply import apply_lr_choice, log_search
from lightning_speedups.callbacks.batch_size.loaders import (
    batch_size_holders,
    dataset_len,
    epoch_samples,
    fit_loader_problem,
    rebuild_loader,
)
from lightning_speedups.callbacks.batch_size.trials import run_trial, search_on_trainer
from lightning_speedups.functional.batch_size import (
    BatchSizeSearchConfig,
    BatchSizeSearchResult,
    BatchSizeTrial,
    MemoryMeter,
    NoBatchSizeFits,
    batch_size_ladder,
    search_batch_size,
)
from lightning_speedups.optim.lr_scaling import LR_SCALING

__all__ = ["ThroughputBatchSizeFinder", "UNITS"]

UNITS = ("auto", "samples")  # what the trials' rates count: real tokens on token sequences ("auto"), or samples
_SEARCH_DEFAULTS = dataclasses.asdict(BatchSizeSearchConfig())  # the fields the keywords may set
_SEARCH_FIELDS = tuple(_SEARCH_DEFAULTS)


class ThroughputBatchSizeFinder(Callback):
    """Measure samples/s per batch size at the start of ``fit`` and train with the best one.

    Each trial runs real optimizer steps (data loading, forward, backward, step, through the trainer's strategy and
    precision) on the live model: ``warmup_steps`` untimed ones (first size only on CPU, every size on CUDA), then
    timed ones until ``steps_per_trial`` steps, ``trial_samples`` samples or ``trial_time`` seconds. Afterwards
    weights, gradients, optimizer, scheduler, metric and RNG state and module modes are put back bitwise, so training
    starts exactly as it would have. Nothing is written to disk. Unlike Lightning's ``BatchSizeFinder`` it does not
    climb until out-of-memory: doubling stops once samples/s stops improving by ``min_gain``, at once where a fixed
    per-step cost explains the flattening, else after ``patience`` doublings in a row (a flat stretch that rises
    again is climbed past). Timing noise (other processes, loaders) cannot stop it: a stop needs paired, interleaved
    re-measurements of both sizes that clear the noise, and the fastest sizes are re-measured interleaved before the
    choice; the result holds that evidence (``decisions``, ``final``, ``note``). The learning rates follow the chosen
    size (``lr_scaling``). On token sequences (a 2-D integer ``input_ids``; see
    :func:`~lightning_speedups._tokens.count_tokens`) it measures real, non-pad tokens/s instead of samples/s: with
    dynamic padding a larger batch pads to a longer sample, so samples/s would not count the work done. The result's
    ``unit`` and its table say which (``"tokens"``: "measured in real (non-pad) tokens/s").

    Args:
        config: how the search walks and when it stops
            (:class:`~lightning_speedups.functional.batch_size.BatchSizeSearchConfig`; ``None``: its defaults, or
            the search keywords below).
        lr_scaling: how the learning rates follow the chosen batch size (each param group's ``lr``, the schedulers'
            base and peak lrs, a SpeedupMixin's ``optimizer_config.lr``), from the loader's size to the chosen one:
            ``"auto"`` (default) the square-root rule for Adam-type optimizers (Adam, AdamW, NAdam, RAdam, Adagrad,
            RMSprop, any with ``betas``, MuonWithAdamW) and the linear rule for SGD, per optimizer (a SpeedupMixin's
            own ``optimizer_config.lr_scaling`` when it sets one; no scaling with ``keep_global_batch``, nor for an
            optimizer no rule is known for, e.g. LBFGS); ``"sqrt"`` or ``"linear"`` for every optimizer; ``None``: the
            learning rates stay. The summary (``result.lr_note``, the table) says what each optimizer got; a resumed
            run takes the scaled values from its checkpoint and does not scale again.
        scale_lr: deprecated name of ``lr_scaling`` (``"linear"`` | ``"sqrt"``); ``None``: not given.
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
        **search: the fields of ``BatchSizeSearchConfig`` as keywords (``mode``, ``init_val``, ``max_val``,
            ``steps_per_trial``, ``min_gain``, ``confirm_rounds``, ``search_time``, ...), a supported shorthand for
            ``config=BatchSizeSearchConfig(...)`` that also reads flat in a LightningCLI YAML file. Not together
            with ``config``.

    Example::

        >>> import lightning as L
        >>> from lightning_speedups.demo import DemoClassifier, DigitsDataModule
        >>> config = BatchSizeSearchConfig(init_val=16, max_val=32, steps_per_trial=1, warmup_steps=0)
        >>> finder = ThroughputBatchSizeFinder(config)  # or ThroughputBatchSizeFinder(init_val=16, max_val=32, ...)
        >>> trainer = L.Trainer(accelerator="cpu", max_steps=1, callbacks=[finder], logger=False,
        ...                     enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False)
        >>> dm = DigitsDataModule()
        >>> trainer.fit(DemoClassifier(width=8), datamodule=dm)
        >>> dm.batch_size == finder.result.chosen
        True
    """

    def __init__(
        self,
        config: BatchSizeSearchConfig | None = None,
        *,
        lr_scaling: str | None = "auto",
        scale_lr: str | None = None,
        keep_global_batch: bool | int = False,
        attr_name: str = "batch_size",
        rerun_at_epochs: Sequence[int] = (),
        progress_bar: bool = True,
        verbose: bool = True,
        exit_after_search: bool = False,
        clock: Callable[[], float] = time.perf_counter,
        unit: str = "auto",
        pad_value: int | None = None,
        **search: Any,
    ) -> None:
        _check_config_arguments(config, search)
        # the keywords build the same config (LightningCLI reads their names and types from this call)
        self.config = config if config is not None else BatchSizeSearchConfig(**search)
        if not callable(clock):
            raise SpeedupConfigError(f"`clock`={clock!r} is invalid. Allowed values: a callable returning seconds.")
        self.clock = clock
        self.lr_scaling = _lr_scaling_argument(lr_scaling, scale_lr, keep_global_batch)
        self.unit = check_choice("unit", unit, UNITS)
        self.pad_value = check_int("pad_value", pad_value, optional=True)
        self._counter = TokenCounter(pad_value) if unit == "auto" else None
        if not isinstance(keep_global_batch, (bool, int)) or (
            not isinstance(keep_global_batch, bool) and keep_global_batch < 1
        ):
            raise SpeedupConfigError(
                f"`keep_global_batch`={keep_global_batch!r} is invalid. Allowed values: True, False or a positive int."
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
        self.progress_bar = progress_bar
        self.verbose = verbose
        self.result: BatchSizeSearchResult | None = None
        self.history: list[BatchSizeSearchResult] = []
        self._restored = False
        self.exit_after_search = exit_after_search
        self._fit_loader: DataLoader | None = None
        self._warm: set[int] = set()

    # ------------------------------------------------------------------ checkpoint state
    @override
    def state_dict(self) -> dict[str, Any]:
        return {"history": [r.as_dict() for r in self.history]}

    @override
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
    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        refuse_sharded(
            trainer,
            "ThroughputBatchSizeFinder",
            "its trials snapshot and restore the model's weights, "
            "which a sharded strategy splits over the ranks; find the size on one device and pass it.",
        )
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
            self._check_global_target(trainer, pl_module)

    def _check_global_target(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """``keep_global_batch`` against the trainer: no accumulation scheduler, a target the data and ladder allow."""
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

    @override
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

    @override
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
        target = self._global_target(trainer, pl_module) if self.keep_global_batch is not False else None
        ladder, allowed, per_epoch = self._ladder(trainer, target)
        try:
            result = search_on_trainer(
                trainer,
                pl_module,
                lambda b: self._trial(trainer, pl_module, meter, b),
                self.config,
                meter,
                ladder,
                allowed=allowed,
                epoch_samples=per_epoch,
                progress_bar=self.progress_bar,
            )
        except NoBatchSizeFits as err:
            self._set_size(trainer, pl_module, base)
            if not err.over_budget_only:  # a size ran out of memory: the model does not train here at any size
                raise
            result = self._keep_size(base, err)
        except BaseException:
            self._set_size(trainer, pl_module, base)
            raise
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

    def _keep_size(self, base: int, err: NoBatchSizeFits) -> BatchSizeSearchResult:
        """Every size ran but over the memory budget: the model's own state takes most of the memory, so no size is
        chosen by speed, and the loader's size stays (the fit runs as it would have without the finder)."""
        rank_zero_warn(
            f"ThroughputBatchSizeFinder: {str(err).removeprefix('Batch-size search: ')} The model's own training "
            f"state takes most of the memory, so no size is chosen by throughput: the loader's batch size {base} is "
            "kept. HINT: raise `memory_budget` (up to 1.0), or free memory; on a machine with swap the fit pages out "
            "beyond it, slower."
        )
        return BatchSizeSearchResult(
            chosen=base,
            mode=self.config.mode,
            trials=err.trials,
            stop_reason="no size within the memory budget: the loader's size kept",
            memory_budget_bytes=err.memory_budget_bytes,
        )

    def _ladder(
        self, trainer: L.Trainer, target: int | None
    ) -> tuple[list[int], Callable[[int], bool] | None, int | None]:
        """The sizes to try (capped by the dataset and a kept global ``target``), which sizes are allowed, and the
        samples per epoch the sizes are ranked by (``None`` when the loader drops its last partial batch)."""
        allowed = None
        cap = self.config.max_val
        length = dataset_len(trainer, self._fit_loader, probe=True)
        if length is not None:
            cap = min(cap, max(1, length))
        if target is not None:
            allowed = lambda b: target % b == 0  # noqa: E731
            cap = min(cap, target)
        ladder = batch_size_ladder(min(self.config.init_val, cap), cap, allowed)
        return ladder, allowed, epoch_samples(trainer, self._fit_loader, length)

    def _trial(self, trainer: L.Trainer, pl_module: L.LightningModule, meter: MemoryMeter, size: int) -> BatchSizeTrial:
        start = self.clock()
        loader = self._make_loader(trainer, pl_module, size)
        # the process is warm after the first size; only CUDA pays again per new shape (cuDNN autotune, allocator)
        cold = not self._warm or (trainer.strategy.root_device.type == "cuda" and size not in self._warm)
        self._warm.add(size)
        warmup = self.config.warmup_steps if cold else 0
        return run_trial(
            trainer,
            pl_module,
            meter,
            loader,
            size,
            self.config,
            warmup,
            clock=self.clock,
            start=start,
            count_tokens=self._counter,
        )

    # ------------------------------------------------------------------ applying the choice
    def _apply(
        self, trainer: L.Trainer, pl_module: L.LightningModule, result: BatchSizeSearchResult, fresh: bool
    ) -> None:
        current = self._get_size(trainer, pl_module)
        self._set_size(trainer, pl_module, result.chosen)
        if result.accumulate_grad_batches is not None:
            trainer.accumulate_grad_batches = result.accumulate_grad_batches
        apply_lr_choice(trainer, pl_module, result, fresh, self.lr_scaling, current)


def _lr_scaling_argument(lr_scaling: Any, scale_lr: Any, keep_global_batch: Any) -> str | None:
    """``lr_scaling`` checked (``scale_lr``, its deprecated name, in its place when given); ``None`` when the global
    batch is kept and ``lr_scaling`` is ``"auto"``: the effective batch, and so the learning rate, do not change."""
    check_choice("lr_scaling", lr_scaling, LR_SCALING)
    if scale_lr is not None:
        check_choice("scale_lr", scale_lr, ("linear", "sqrt", None))
        if lr_scaling != "auto" and lr_scaling != scale_lr:
            raise SpeedupConfigError(
                f"`scale_lr`={scale_lr!r} and `lr_scaling`={lr_scaling!r} were both given. Allowed values: "
                "`lr_scaling` alone. HINT: `scale_lr` is the deprecated name of `lr_scaling`."
            )
        rank_zero_deprecation("ThroughputBatchSizeFinder: `scale_lr` is deprecated, pass `lr_scaling` instead.")
        lr_scaling = scale_lr
    if keep_global_batch is not False and lr_scaling not in ("auto", None):
        name = "scale_lr" if scale_lr is not None else "lr_scaling"
        raise SpeedupConfigError(
            f"`{name}`={lr_scaling!r} cannot be combined with `keep_global_batch`={keep_global_batch!r}. "
            f"Allowed values: {name}=None or 'auto' when the global batch is kept. HINT: the effective batch does "
            "not change, so the learning rate should not either."
        )
    return None if keep_global_batch is not False else lr_scaling


def _check_config_arguments(config: Any, search: dict[str, Any]) -> None:
    """``config`` is a :class:`BatchSizeSearchConfig` or ``None``; the other keywords are its fields, not both."""
    if config is not None and not isinstance(config, BatchSizeSearchConfig):
        raise SpeedupConfigError(
            f"`config`={config!r} is invalid. Allowed values: a BatchSizeSearchConfig or None. HINT: the search "
            "settings go in `BatchSizeSearchConfig(...)` or are passed as keywords, e.g. `mode='max_fit'`."
        )
    unknown = sorted(set(search) - set(_SEARCH_FIELDS))
    if unknown:
        raise TypeError(
            f"ThroughputBatchSizeFinder got unexpected keyword argument(s) {unknown}. Allowed values: the callback's "
            f"own arguments and the fields of BatchSizeSearchConfig: {', '.join(_SEARCH_FIELDS)}."
        )
    # a keyword at its default adds nothing (LightningCLI passes every keyword it resolved, defaults included)
    changed = [f"`{k}`={v!r}" for k, v in sorted(search.items()) if v != _SEARCH_DEFAULTS[k]]
    if config is not None and changed:
        raise SpeedupConfigError(
            f"`config` was given together with {', '.join(changed)}. Allowed values: the search settings in "
            "`config` or as keywords, not both. HINT: `dataclasses.replace(config, ...)` changes a field of a config."
        )


register_technique(
    TechniqueInfo(
        name="batch_size_finder",
        callback=ThroughputBatchSizeFinder,
        functional=search_batch_size,
        summary="Pick the batch size with the highest measured samples/s, or real tokens/s on token sequences "
        "(stops at the plateau, not at OOM).",
        ways=(7,),
        bench="lightning_speedups.benchmarks.batch_size:run",
    )
)
