"""Optimizer and LR-scheduler configuration (mission tips 2 and 3): configs, registries, mixin, LR finder rules."""

from lightning_speedups.optim.config import (
    OptimizerConfig,
    SchedulerConfig,
    as_optimizer_config,
    as_scheduler_config,
    scale_lr,
)
from lightning_speedups.optim.mixin import SpeedupMixin, effective_batch_size
from lightning_speedups.optim.optimizers import (
    OptimizerInfo,
    build_param_groups,
    choose_implementation,
    create_optimizer,
    get_optimizer_info,
    list_optimizers,
    register_optimizer,
)
from lightning_speedups.optim.schedulers import (
    SchedulerInfo,
    create_scheduler,
    get_scheduler_info,
    lightning_scheduler_config,
    list_schedulers,
    register_scheduler,
)

__all__ = [
    "SpeedupMixin",
    "OptimizerConfig",
    "SchedulerConfig",
    "as_optimizer_config",
    "as_scheduler_config",
    "scale_lr",
    "effective_batch_size",
    "OptimizerInfo",
    "build_param_groups",
    "choose_implementation",
    "create_optimizer",
    "get_optimizer_info",
    "list_optimizers",
    "register_optimizer",
    "SchedulerInfo",
    "create_scheduler",
    "get_scheduler_info",
    "lightning_scheduler_config",
    "list_schedulers",
    "register_scheduler",
]
