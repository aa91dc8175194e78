"""SpeedFlags callback: set TF32 and cuDNN autotuning at setup (code optimization, way 8)."""

from __future__ import annotations

import lightning as L
from lightning.pytorch.utilities import rank_zero_info
from typing_extensions import override

from lightning_speedups._registry import TechniqueInfo, register_technique
from lightning_speedups.settings import enable_speed_flags

__all__ = ["SpeedFlags"]


class SpeedFlags(L.Callback):
    """Calls :func:`~lightning_speedups.settings.enable_speed_flags` for the trainer's accelerator at ``setup``.

    On CUDA it turns on TF32 matmuls and cuDNN autotuning; elsewhere it changes nothing and says why.
    ``self.applied`` holds ``{flag: what was done}``.

    Example::

        >>> import lightning as L
        >>> trainer = L.Trainer(callbacks=[SpeedFlags()], accelerator="cpu", logger=False)
    """

    def __init__(self, verbose: bool = True) -> None:
        self.verbose = verbose
        self.applied: dict[str, str] = {}

    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        accelerator = trainer.strategy.root_device.type
        self.applied = enable_speed_flags(accelerator)
        if self.verbose:
            rank_zero_info("SpeedFlags: " + "; ".join(f"{k}: {v}" for k, v in self.applied.items()))


register_technique(
    TechniqueInfo(
        name="speed_flags",
        callback=SpeedFlags,
        functional=enable_speed_flags,
        summary="TF32 matmuls + cuDNN autotuning on NVIDIA GPUs (a no-op with a reason elsewhere)",
        ways=(8, 9),
    )
)
