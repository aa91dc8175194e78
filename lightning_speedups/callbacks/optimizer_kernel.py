"""OptimizerKernel callback: the module's own optimizers, run with torch's fused or foreach kernel."""

from __future__ import annotations

import lightning as L
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info
from typing_extensions import override

from lightning_speedups._compat import retarget_scheduler
from lightning_speedups._errors import check_choice
from lightning_speedups._rebuild import KERNELS, with_implementation
from lightning_speedups._strategies import refuse_sharded

__all__ = ["OptimizerKernel"]


class OptimizerKernel(Callback):
    """Run the optimizers a LightningModule's own ``configure_optimizers`` builds with ``fused=True`` or
    ``foreach=True``, keeping everything else it set.

    At ``on_fit_start`` (after ``configure_optimizers``, before a checkpoint's optimizer state is restored, so a
    resumed fit loads its state into the new optimizer) each optimizer of the fit is re-created as the same class on
    the same param groups (lr, weight decay, ``lr_mult`` and any other per-group entry) and defaults, with the
    kernel, and its LR schedulers are pointed at it, so the schedule goes on as the module wrote it. The update is the
    same; only the kernel that computes it changes. An optimizer whose class takes no such kernel, or that has none
    for its parameters' dtype or device, is kept as it is, and the one line this callback logs says so.

    autotune adds it to a plan when the kernel trial found it faster and the module builds its own optimizer (a
    :class:`~lightning_speedups.optim.SpeedupMixin` module gets the kernel through its ``optimizer_config``).

    Args:
        implementation: ``"fused"`` (one kernel for every parameter: the fastest where torch has one: Adam, AdamW,
            SGD, Adagrad on CPU and CUDA) or ``"foreach"`` (the parameters batched per operation).

    Raises:
        SpeedupConfigError: ``implementation`` is not one of them (at construction), or the strategy shards the model
            (at ``setup``: the optimizer is built on the shards).

    Example::

        >>> OptimizerKernel("fused").implementation
        'fused'
    """

    def __init__(self, implementation: str = "fused") -> None:
        check_choice("implementation", implementation, KERNELS)
        self.implementation = implementation
        self.replaced: list[str] = []  # the classes replaced at the last fit's start
        self.kept: list[str] = []  # the classes that take no such kernel, kept

    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage == "fit":
            refuse_sharded(trainer, "OptimizerKernel", "set fused=True in configure_optimizers yourself.")

    @override
    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.replaced, self.kept = [], []
        optimizers = list(trainer.optimizers)
        for index, optimizer in enumerate(optimizers):
            kernel = with_implementation(optimizer, self.implementation)
            name = type(optimizer).__name__
            if kernel is optimizer:
                self.kept.append(name)
                continue
            groups = range(len(optimizer.param_groups))
            for config in trainer.lr_scheduler_configs:
                if config.scheduler.optimizer is optimizer:
                    retarget_scheduler(config.scheduler, kernel, groups)
            optimizers[index] = kernel
            self.replaced.append(name)
        trainer.strategy.optimizers = optimizers  # also re-creates the LightningOptimizer wrappers
        rank_zero_info(f"[OptimizerKernel] {self.to_text()}")

    def to_text(self) -> str:
        """What the last fit's start did, in one line."""
        parts = []
        if self.replaced:
            parts.append(f"{', '.join(self.replaced)} with {self.implementation}=True")
        if self.kept:
            parts.append(f"{', '.join(self.kept)} kept: no {self.implementation} kernel for it here")
        return "; ".join(parts) or "no optimizer"
