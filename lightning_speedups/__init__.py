"""lightning-speedups: Lightning callbacks and a LightningModule mixin that make training faster, measured."""

from lightning_speedups._errors import SpeedupConfigError
from lightning_speedups._registry import TechniqueInfo, get_technique, list_techniques, register_technique
from lightning_speedups.optim import SpeedupMixin

__version__ = "0.1.0"

__all__ = [
    # errors
    "SpeedupConfigError",
    # technique registry
    "TechniqueInfo",
    "get_technique",
    "list_techniques",
    "register_technique",
    # mixin
    "SpeedupMixin",
]
