"""Applying a search's choice on the live trainer: learning rates rescaled for the new size, the result logged."""

from __future__ import annotations

import dataclasses

import lightning as L
import torch
from lightning.pytorch.utilities.rank_zero import rank_zero_info

from lightning_speedups.functional.batch_size import BatchSizeSearchResult
from lightning_speedups.optim.lr_scaling import lr_factor, resolve_rule, rule_words, scale_optimizer_lrs

__all__ = ["apply_lr_choice", "log_search", "scale_live_lrs"]


def scale_live_lrs(trainer: L.Trainer, factor: float) -> None:
    """Multiply the learning rates of the live optimizers and their schedulers by ``factor``
    (:func:`~lightning_speedups.optim.lr_scaling.scale_optimizer_lrs`)."""
    schedulers = [c.scheduler for c in trainer.lr_scheduler_configs]
    for opt in trainer.optimizers:
        scale_optimizer_lrs(opt, schedulers, factor)


# one optimizer as the finder left it: the optimizer, the rule it was scaled by and the factor
_Scaled = tuple[torch.optim.Optimizer, "str | None", float]


def _mixin_lr_rule(pl_module: L.LightningModule) -> str | None:
    cfg = getattr(pl_module, "optimizer_config", None)
    return getattr(cfg, "lr_scaling", None)


def _scale_each(trainer: L.Trainer, choice: str | None, new: int, old: int) -> list[_Scaled]:
    """Scale every live optimizer (and its schedulers) from batch ``old`` to ``new`` by its own rule (``choice``,
    resolved per optimizer with ``"auto"``); each optimizer with its rule and factor."""
    schedulers = [c.scheduler for c in trainer.lr_scheduler_configs]
    done = []
    for opt in trainer.optimizers:
        rule = resolve_rule(choice, opt)
        factor = lr_factor(new, old, rule)
        scale_optimizer_lrs(opt, schedulers, factor)
        done.append((opt, rule, factor))
    return done


def _lr_note(choice: str | None, done: list[_Scaled], old: int, new: int) -> str:
    """The summary line of what happened to the learning rates."""
    if new == old:
        return f"learning rate kept: the batch size stayed {new}"
    if not done:
        return "learning rate kept: no optimizer to scale"
    parts = [(f"x{f:.3g} by the " if f != 1.0 else "") + rule_words(choice, opt, rule) for opt, rule, f in done]
    return f"learning rate for batch {old} -> {new}: " + "; ".join(parts)


def apply_lr_choice(
    trainer: L.Trainer,
    pl_module: L.LightningModule,
    result: BatchSizeSearchResult,
    fresh: bool,
    lr_scaling: str | None,
    current: int,
) -> None:
    """Rescale the learning rates for the chosen batch size by ``lr_scaling`` (``"auto"``: a SpeedupMixin's own
    ``lr_scaling`` when it has one, else each optimizer's rule,
    :func:`~lightning_speedups.optim.lr_scaling.auto_lr_rule`).

    ``fresh``: the search just ran (the factor is from the base size, and a mixin's ``optimizer_config.lr`` is scaled
    too; ``result.lr_factor`` and ``result.lr_note`` say what was done); otherwise a stored choice is re-applied:
    nothing on resume (the checkpoint holds the scaled optimizers and schedulers), else from the ``current`` size.
    """
    mixin_rule = _mixin_lr_rule(pl_module)
    choice = mixin_rule if lr_scaling == "auto" and mixin_rule is not None else lr_scaling
    cfg = getattr(pl_module, "optimizer_config", None)
    # a mixin with its own `lr_scaling` recomputes lr from the batch size whenever it rebuilds: leave its config
    owns_cfg = cfg is not None and hasattr(cfg, "lr") and mixin_rule is None
    if fresh:
        base = result.base_batch_size or result.chosen
        done = _scale_each(trainer, choice, result.chosen, base)
        result.lr_factor = done[0][2] if done else 1.0
        result.lr_note = _lr_note(choice, done, base, result.chosen)
        if result.accumulate_grad_batches is not None:
            result.lr_note = "learning rate kept: the global batch (batch size x accumulate_grad_batches) is kept"
        if owns_cfg and result.lr_factor != 1.0:
            result.config_lr = cfg.lr * result.lr_factor
    elif trainer.ckpt_path is None:  # a stored choice on a new fit; a resumed one's checkpoint holds the scaled lrs
        if owns_cfg and result.config_lr is not None:
            if cfg.lr != result.config_lr:  # the optimizers were built from the unscaled config
                scale_live_lrs(trainer, result.lr_factor)
        else:
            _scale_each(trainer, choice, result.chosen, current)
    if owns_cfg and result.config_lr is not None:
        pl_module.optimizer_config = dataclasses.replace(cfg, lr=result.config_lr)


def log_search(trainer: L.Trainer, result: BatchSizeSearchResult, verbose: bool) -> None:
    """The trial table on rank 0 (when ``verbose``) and the ``batch_size_finder/*`` metrics to every logger."""
    if verbose:
        rank_zero_info(f"ThroughputBatchSizeFinder (epoch {result.epoch}):\n{result.table()}")
    best = result.trial(result.chosen)
    metrics = {
        "batch_size_finder/chosen": float(result.chosen),
        "batch_size_finder/samples_per_s": best.samples_per_s if best else 0.0,
        "batch_size_finder/search_time_s": result.search_time_s,
        "batch_size_finder/lr_factor": result.lr_factor,
    }
    if result.unit == "tokens":
        metrics["batch_size_finder/tokens_per_s"] = best.rate if best else 0.0
    for logger in trainer.loggers:
        logger.log_metrics(metrics, step=trainer.global_step)
