"""Optimizer and LR-scheduler configuration (ways 2 and 3): configs, registries, mixin, LR finder rules."""

from lightning_speedups._registry import TechniqueInfo, register_technique
from lightning_speedups.optim.config import (
    OptimizerConfig,
    SchedulerConfig,
    as_optimizer_config,
    as_scheduler_config,
    scale_lr,
)
from lightning_speedups.optim.lr_finder import LR_RULES, LRFinderResult, apply_lr, suggest_from_curve, suggest_lr
from lightning_speedups.optim.mixin import SpeedupMixin, effective_batch_size
from lightning_speedups.optim.muon import MuonWithAdamW, assign_muon, muon_from_optimizer
from lightning_speedups.optim.optimizers import (
    OptimizerInfo,
    build_param_groups,
    choose_implementation,
    create_optimizer,
    get_optimizer_info,
    list_optimizers,
    register_optimizer,
)
from lightning_speedups.optim.plots import plot_lr_finder, plot_lr_schedule, simulate_lr_schedule
from lightning_speedups.optim.precise_bn import recompute_batchnorm
from lightning_speedups.optim.schedule_free import (
    ModeSwitch,
    create_schedule_free_adamw,
    create_schedule_free_sgd,
    eval_weights_into_checkpoint,
    in_train_mode,
    is_schedule_free,
    schedule_free_eval,
    schedule_free_train,
)
from lightning_speedups.optim.schedulers import (
    SchedulerInfo,
    create_scheduler,
    get_scheduler_info,
    lightning_scheduler_config,
    list_schedulers,
    register_scheduler,
)
from lightning_speedups.optim.wsd import WSDFactor, cool_down

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
    "LR_RULES",
    "LRFinderResult",
    "apply_lr",
    "suggest_from_curve",
    "suggest_lr",
    "plot_lr_finder",
    "plot_lr_schedule",
    "simulate_lr_schedule",
    "MuonWithAdamW",
    "assign_muon",
    "muon_from_optimizer",
    "WSDFactor",
    "cool_down",
    "ModeSwitch",
    "create_schedule_free_adamw",
    "create_schedule_free_sgd",
    "eval_weights_into_checkpoint",
    "in_train_mode",
    "is_schedule_free",
    "recompute_batchnorm",
    "schedule_free_eval",
    "schedule_free_train",
]

register_technique(
    TechniqueInfo(
        name="optim",
        callback=None,
        functional=create_optimizer,
        summary="SpeedupMixin + OptimizerConfig/SchedulerConfig: no-decay groups, lr multipliers, per-step schedules",
        ways=(2, 3),
        bench="lightning_speedups.benchmarks.optim:run",
    )
)
