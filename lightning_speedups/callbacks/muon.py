"""Muon callback: train a LightningModule's own optimizer as the Muon hybrid, its groups and schedulers kept."""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info
from typing_extensions import override

from lightning_speedups._compat import retarget_scheduler
from lightning_speedups._errors import SpeedupConfigError, check_choice, check_range
from lightning_speedups._registry import TechniqueInfo, register_technique
from lightning_speedups._strategies import refuse_manual_optimization, refuse_sharded
from lightning_speedups.optim.lr_scaling import scale_optimizer_lrs
from lightning_speedups.optim.muon import CONV_MODES, MuonWithAdamW, muon_from_optimizer

__all__ = ["Muon"]


class Muon(Callback):
    """Replace the optimizer ``configure_optimizers`` built by the Muon hybrid, keeping everything else it set.

    :class:`~lightning_speedups.optim.muon.MuonWithAdamW` steps the hidden weight matrices with
    ``torch.optim.Muon`` and the embeddings, the output head and every bias or norm with AdamW, as one optimizer.
    At ``on_fit_start`` (after ``configure_optimizers``, before a checkpoint's optimizer state is restored, so a
    resumed fit loads the hybrid's state into the hybrid) each optimizer of the fit is converted by
    :func:`~lightning_speedups.optim.muon.muon_from_optimizer`: its param groups (lr, weight decay, names,
    ``lr_mult``) are split into a Muon and an AdamW part, Adam-type ``betas`` and ``eps`` carry over, and its LR
    schedulers (``LambdaLR``, cosine, OneCycle, ``FastSchedule``'s...) are pointed at the new groups, so the schedule
    goes on as the module wrote it. The split is reported once, by name and count.

    With the default ``adjust_lr_fn="match_rms_adamw"`` each matrix's update has the RMS of an AdamW update, so an
    Adam / AdamW learning rate carries over as it is. An SGD learning rate does not (it is 10-100x larger): for a
    module whose optimizer has no ``betas``, pass ``lr``. For :class:`~lightning_speedups.optim.SpeedupMixin` modules
    ``OptimizerConfig("muon", ...)`` builds the same optimizer without this callback.

    Args:
        lr: the base learning rate of the hybrid; every group's lr is scaled by ``lr / the optimizer's lr`` (group
            ratios kept). ``None`` keeps the module's, and needs an Adam-type optimizer.
        conv: ``"adamw"`` (convolution kernels on AdamW) or ``"muon"`` (each kernel as its ``(out, in*kh*kw)``
            matrix, as airbench does; the input stem stays on AdamW).
        warmup_steps: the hybrid's own linear lr warm-up, on top of the module's schedule; a few steps keep Muon's
            first updates from spiking the loss.
        kwargs: other :class:`~lightning_speedups.optim.muon.MuonWithAdamW` arguments (``momentum``,
            ``adjust_lr_fn``, ``ns_steps``...).

    Raises:
        SpeedupConfigError: bad arguments (here); at ``on_fit_start``, before any step: a sharded strategy (FSDP,
            DeepSpeed), manual optimization, no hidden matrix in the model, or ``lr=None`` beside an optimizer that
            is not Adam-type.

    Example::

        >>> trainer = L.Trainer(max_epochs=3, callbacks=[Muon()])  # doctest: +SKIP
    """

    def __init__(self, lr: float | None = None, conv: str = "adamw", warmup_steps: int = 10, **kwargs: Any) -> None:
        if lr is not None:
            check_range("lr", lr, 0.0, None, low_inclusive=False)
        check_choice("conv", conv, CONV_MODES)
        self.lr = lr
        self.conv = conv
        self.kwargs = {"warmup_steps": warmup_steps, **kwargs}
        # the hybrid checks its own arguments: build one on a throwaway matrix so bad ones fail here
        MuonWithAdamW([{"params": [torch.nn.Parameter(torch.zeros(2, 2))], "use_muon": True}], **self.kwargs)

    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        refuse_sharded(trainer, "Muon", "Muon needs each weight matrix whole on one rank; use 'ddp'.")
        refuse_manual_optimization(
            pl_module, "Muon", "build muon_from_optimizer(...) yourself in configure_optimizers."
        )

    @override
    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        optimizers = list(trainer.optimizers)
        for index, optimizer in enumerate(optimizers):
            if isinstance(optimizer, MuonWithAdamW):
                continue
            if self.lr is None and "betas" not in optimizer.defaults:
                raise SpeedupConfigError(
                    f"`lr`=None keeps the learning rate of {type(optimizer).__name__}, which is not Adam-type: Muon "
                    "(adjust_lr_fn='match_rms_adamw') and its AdamW part expect an AdamW learning rate. Allowed "
                    "values: Muon(lr=...) with an AdamW-like rate (1e-3 to 1e-2), or an Adam-type optimizer."
                )
            hybrid = muon_from_optimizer(optimizer, pl_module, self.conv, **self.kwargs)
            schedulers = [c.scheduler for c in trainer.lr_scheduler_configs if c.scheduler.optimizer is optimizer]
            for scheduler in schedulers:
                retarget_scheduler(scheduler, hybrid, hybrid.group_sources)
            if self.lr is not None:  # groups, their scheduler-held lrs and the schedulers' own, ratios kept
                scale_optimizer_lrs(hybrid, schedulers, self.lr / optimizer.defaults["lr"])
            optimizers[index] = hybrid
            rank_zero_info(f"[Muon] {type(optimizer).__name__} replaced. {hybrid.assignment.to_text()}")
        trainer.strategy.optimizers = optimizers


register_technique(
    TechniqueInfo(
        name="muon",
        callback=Muon,
        functional=muon_from_optimizer,
        summary="Muon for the hidden matrices, AdamW for embeddings, head and vectors, around the module's optimizer",
        ways=(2,),
    )
)
