"""Optimizer and LR-scheduler configuration (mission tips 2 and 3)."""

from lightning_speedups.optim.mixin import SpeedupMixin

__all__ = ["SpeedupMixin"]
