"""lightning-speedups: Lightning callbacks and a LightningModule mixin that make training faster, measured."""

from lightning_speedups._errors import SpeedupConfigError
from lightning_speedups._registry import TechniqueInfo, get_technique, list_techniques, register_technique

# callbacks (importing them registers their techniques)
from lightning_speedups.callbacks.speed_flags import SpeedFlags

# mixin, optimizers and schedulers
from lightning_speedups.optim import SpeedupMixin

# settings (trainer arguments for this hardware)
from lightning_speedups.settings import (
    TrainerSettings,
    cpu_bf16_is_fast,
    enable_speed_flags,
    explain_trainer_settings,
    trainer_settings,
)

__version__ = "0.1.0"

__all__ = [
    # errors
    "SpeedupConfigError",
    # technique registry
    "TechniqueInfo",
    "get_technique",
    "list_techniques",
    "register_technique",
    # callbacks
    "SpeedFlags",
    # mixin, optimizers and schedulers
    "SpeedupMixin",
    # settings
    "TrainerSettings",
    "cpu_bf16_is_fast",
    "enable_speed_flags",
    "explain_trainer_settings",
    "trainer_settings",
]
