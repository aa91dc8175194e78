"""Demo models: a small conv net and an MLP, both LightningModules using :class:`SpeedupMixin`."""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
import torchmetrics
from torch import nn

from lightning_speedups._errors import check_int
from lightning_speedups.optim.mixin import SpeedupMixin

__all__ = ["DemoClassifier", "DemoMLP"]


def _conv_block(c_in: int, c_out: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(c_in, c_out, 3, padding=1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU(inplace=True))


class _ClassifierBase(SpeedupMixin, L.LightningModule):
    """Shared training/validation/test steps with torchmetrics accuracy; subclasses build ``backbone`` and ``head``."""

    backbone: nn.Module
    head: nn.Module

    def __init__(self, num_classes: int, **mixin_kwargs: Any) -> None:
        super().__init__(**mixin_kwargs)
        check_int("num_classes", num_classes, 2)
        self.train_acc = torchmetrics.classification.MulticlassAccuracy(num_classes, average="micro")
        self.val_acc = torchmetrics.classification.MulticlassAccuracy(num_classes, average="micro")
        self.test_acc = torchmetrics.classification.MulticlassAccuracy(num_classes, average="micro")
        self.loss_fn = nn.CrossEntropyLoss()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(x))

    def _step(self, batch: Any, stage: str, metric: torchmetrics.Metric) -> torch.Tensor:
        x, y = batch
        logits = self(x)
        loss = self.loss_fn(logits, y)
        metric(logits, y)
        self.log(f"{stage}_loss", loss, prog_bar=stage != "train", sync_dist=stage != "train")
        self.log(f"{stage}_acc", metric, prog_bar=True, on_step=False, on_epoch=True)
        return loss

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self._step(batch, "train", self.train_acc)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self._step(batch, "val", self.val_acc)

    def test_step(self, batch: Any, batch_idx: int) -> None:
        self._step(batch, "test", self.test_acc)


class DemoClassifier(_ClassifierBase):
    """A small VGG-style conv net (5 conv-BN-ReLU blocks, global pooling, linear head) for 32x32 images.

    Args:
        num_classes: output classes.
        in_channels: image channels.
        width: channels of the first block (later blocks use 2x and 4x); compute grows with its square.
        optimizer_config, scheduler_config: see :class:`SpeedupMixin` (default: Adam, lr 1e-3, constant).

    Example::

        >>> model = DemoClassifier(width=8)
        >>> tuple(model(model.example_input_array).shape)
        (1, 10)
    """

    def __init__(
        self,
        num_classes: int = 10,
        in_channels: int = 3,
        width: int = 32,
        optimizer_config: Any = None,
        scheduler_config: Any = None,
    ) -> None:
        super().__init__(num_classes, optimizer_config=optimizer_config, scheduler_config=scheduler_config)
        check_int("width", width, 1)
        self.save_hyperparameters()
        w = width
        self.backbone = nn.Sequential(
            _conv_block(in_channels, w),
            _conv_block(w, w),
            nn.MaxPool2d(2),
            _conv_block(w, 2 * w),
            _conv_block(2 * w, 2 * w),
            nn.MaxPool2d(2),
            _conv_block(2 * w, 4 * w),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
        )
        self.head = nn.Linear(4 * w, num_classes)
        self.example_input_array = torch.zeros(1, in_channels, 32, 32)


class DemoMLP(_ClassifierBase):
    """A Linear-only classifier (flatten -> hidden layers -> head), for quantization and float8 work.

    Example::

        >>> model = DemoMLP(hidden=(64,))
        >>> tuple(model(model.example_input_array).shape)
        (1, 10)
    """

    def __init__(
        self,
        num_classes: int = 10,
        in_features: int = 3 * 32 * 32,
        hidden: tuple[int, ...] | list[int] = (512, 256),
        optimizer_config: Any = None,
        scheduler_config: Any = None,
    ) -> None:
        super().__init__(num_classes, optimizer_config=optimizer_config, scheduler_config=scheduler_config)
        self.save_hyperparameters()
        layers: list[nn.Module] = [nn.Flatten()]
        prev = in_features
        for h in hidden:
            layers += [nn.Linear(prev, h), nn.ReLU(inplace=True)]
            prev = h
        self.backbone = nn.Sequential(*layers)
        self.head = nn.Linear(prev, num_classes)
        side = int(round((in_features / 3) ** 0.5))
        self.example_input_array = (
            torch.zeros(1, 3, side, side) if 3 * side * side == in_features else torch.zeros(1, in_features)
        )
