"""Applying a search's choice on the live trainer: learning rates rescaled for the new size, the result logged."""

from __future__ import annotations

import dataclasses

import lightning as L
from lightning.pytorch.utilities.rank_zero import rank_zero_info

from lightning_speedups._compat import refresh_scheduler_last_lr
from lightning_speedups.functional.batch_size import BatchSizeSearchResult, scale_lr_factor

__all__ = ["apply_lr_choice", "log_search", "scale_live_lrs"]

_LR_KEYS = ("lr", "initial_lr", "max_lr", "min_lr")


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


def apply_lr_choice(
    trainer: L.Trainer,
    pl_module: L.LightningModule,
    result: BatchSizeSearchResult,
    fresh: bool,
    scale_lr: str | None,
    current: int,
) -> None:
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
