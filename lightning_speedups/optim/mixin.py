"""SpeedupMixin: builds optimizer and scheduler from config attributes. (Foundation version: issue 3 completes it.)"""

from __future__ import annotations

from typing import Any

import torch

from lightning_speedups._structure import apply_structure_records

__all__ = ["SpeedupMixin"]


class SpeedupMixin:
    """LightningModule mixin; ``configure_optimizers`` comes from ``self.optimizer_config`` / ``scheduler_config``."""

    def __init__(self, *args: Any, optimizer_config: Any = None, scheduler_config: Any = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.optimizer_config = optimizer_config
        self.scheduler_config = scheduler_config

    def configure_optimizers(self) -> Any:
        return torch.optim.Adam(self.parameters(), lr=1e-3)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # rebuild pruned / quantized structure before Lightning's strict load_state_dict
        apply_structure_records(self, checkpoint)  # type: ignore[arg-type]
        super().on_load_checkpoint(checkpoint)  # type: ignore[misc]
