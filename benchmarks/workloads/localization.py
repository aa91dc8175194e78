"""A localisation workload: a CNN regressing the box around the objects of a generated scene.

Box regression is a kind the other tasks do not cover: four numbers per image, a smooth-L1 loss, judged by the mean
intersection over union of the predicted and true boxes (``val_iou``). The boxes follow torchvision's v2 transforms as
``tv_tensors.BoundingBoxes`` (a random resized crop and a flip move them with the image), as a user's detection
pipeline has them. The module trains as most Lightning examples do: AdamW 1e-3 with a cosine decay over the planned
run.
"""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset
from torchvision import tv_tensors
from torchvision.ops import masks_to_boxes
from torchvision.transforms import v2

from benchmarks.workloads._registry import Workload, register_workload
from benchmarks.workloads.segmentation import draw_scenes

__all__ = ["BoxDataModule", "BoxRegressor", "box_iou_pairs", "mask_boxes"]


def mask_boxes(masks: torch.Tensor) -> torch.Tensor:
    """The ``(n, 4)`` float boxes (x1, y1, x2, y2, pixel edges) around the nonzero pixels of ``(n, H, W)`` masks:
    torchvision's ``masks_to_boxes`` (which gives the last pixel's index) with the far edges one pixel on."""
    return masks_to_boxes(masks) + torch.tensor([0.0, 0.0, 1.0, 1.0])


def box_iou_pairs(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The IoU of each box in ``a`` with the box at the same row of ``b`` (both ``(n, 4)``, x1 y1 x2 y2)."""
    lt = torch.maximum(a[:, :2], b[:, :2])
    rb = torch.minimum(a[:, 2:], b[:, 2:])
    inter = (rb - lt).clamp_min(0).prod(dim=1)
    area = (a[:, 2:] - a[:, :2]).clamp_min(0).prod(dim=1) + (b[:, 2:] - b[:, :2]).clamp_min(0).prod(dim=1)
    return inter / (area - inter).clamp_min(1e-9)


class _BoxScenes(Dataset):
    """Per sample: v2 transforms on the image and its box together; returns the float image and the box scaled to
    [0, 1] by the output size."""

    def __init__(self, images: torch.Tensor, boxes: torch.Tensor, transform: v2.Transform) -> None:
        self.images = images
        self.boxes = boxes
        self.transform = transform

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, idx: int) -> tuple[torch.Tensor, torch.Tensor]:
        size = tuple(self.images.shape[-2:])
        box = tv_tensors.BoundingBoxes(self.boxes[idx : idx + 1], format="XYXY", canvas_size=size)
        image, box = self.transform(tv_tensors.Image(self.images[idx]), box)
        h, w = image.shape[-2:]
        scale = torch.tensor([w, h, w, h], dtype=torch.float32)
        return image.as_subclass(torch.Tensor), box.as_subclass(torch.Tensor)[0].float() / scale


class BoxDataModule(L.LightningDataModule):
    """:func:`~benchmarks.workloads.segmentation.draw_scenes` with the box around both objects as
    the target; training takes a random resized crop (scale 0.6-1, boxes clamped to it) and a horizontal flip."""

    def __init__(
        self, n_train: int = 4096, n_val: int = 512, batch_size: int = 32, size: int = 64, seed: int = 0
    ) -> None:
        super().__init__()
        self.n_train = n_train
        self.n_val = n_val
        self.batch_size = batch_size
        self.size = size
        self.seed = seed

    def setup(self, stage: str | None = None) -> None:
        norm = [v2.ToDtype(torch.float32, scale=True), v2.Normalize([0.5] * 3, [0.25] * 3)]
        train_tf = v2.Compose(
            [
                v2.RandomResizedCrop(self.size, scale=(0.6, 1.0), antialias=True),
                v2.RandomHorizontalFlip(),
                v2.ClampBoundingBoxes(),
                *norm,
            ]
        )
        images, masks = draw_scenes(self.n_train, self.seed + 50_000, self.size)
        self.train_set = _BoxScenes(images, mask_boxes(masks), train_tf)
        images, masks = draw_scenes(self.n_val, self.seed + 60_000, self.size)
        self.val_set = _BoxScenes(images, mask_boxes(masks), v2.Compose(norm))

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=128)


class BoxCNN(nn.Sequential):
    """A CNN as people write one for a box: four stride-2 conv-BN-ReLU stages of ``width`` x (1, 2, 4, 8) channels
    (64 px to a 4 x 4 map), read flat by a linear layer to the four coordinates (a global pool would lose where)."""

    def __init__(self, width: int = 24, size: int = 64) -> None:
        chans = [3] + [width * 2**i for i in range(4)]
        stages = [
            nn.Sequential(
                nn.Conv2d(chans[i], chans[i + 1], 3, stride=2, padding=1, bias=False),
                nn.BatchNorm2d(chans[i + 1]),
                nn.ReLU(inplace=True),
            )
            for i in range(4)
        ]
        super().__init__(*stages, nn.Flatten(), nn.Linear(chans[-1] * (size // 16) ** 2, 4))


class BoxRegressor(L.LightningModule):
    """A plain box regressor: the network's four outputs through a sigmoid are the box (x1, y1, x2, y2 as fractions
    of the image), trained on the smooth-L1 loss; ``val_iou`` (the metric, the mean IoU) and ``val_loss``."""

    def __init__(self, net: nn.Module, lr: float = 1e-3, weight_decay: float = 1e-4) -> None:
        super().__init__()
        self.net = net
        self.lr = lr
        self.weight_decay = weight_decay

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.net(x))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, box = batch
        loss = nn.functional.smooth_l1_loss(self(x), box, beta=0.05)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, box = batch
        pred = self(x)
        self.log("val_loss", nn.functional.smooth_l1_loss(pred, box, beta=0.05))
        self.log("val_iou", box_iou_pairs(pred, box).mean())

    def configure_optimizers(self) -> Any:
        opt = torch.optim.AdamW(self.parameters(), lr=self.lr, weight_decay=self.weight_decay)
        total = max(1, int(self.trainer.estimated_stepping_batches))
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=total)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def _build_box_cnn(seed: int, small: bool = False) -> tuple[L.LightningModule, L.LightningDataModule]:
    torch.manual_seed(seed)
    n_train, n_val = (128, 64) if small else (4096, 512)
    net = BoxCNN(width=8 if small else 24)
    return BoxRegressor(net), BoxDataModule(n_train=n_train, n_val=n_val, seed=seed)


register_workload(
    Workload(
        name="box_cnn",
        kind="image_localization",
        split="held_out",
        metric="val_iou",
        mode="max",
        target=0.65,
        description="A plain CNN (four stride-2 conv-BN-ReLU stages of 24-192 channels, a linear head on the flat "
        "4 x 4 map, 0.23M parameters) regressing the box around the two objects of generated 64 px scenes (4096 "
        "train / 512 val), per-sample RandomResizedCrop + flip moving the box as tv_tensors.BoundingBoxes, AdamW 1e-3 "
        "with a cosine decay over the planned run, batch 32, smooth-L1 loss, mean IoU as the metric (the mean box "
        "scores 0.49). Target 0.65 from two calibration seeds (reached at 62% and 56% of the run, plateau 0.667). "
        "Added held out when the schedule left the conv default plan because of resnet18_cifar, to judge that change.",
        build=_build_box_cnn,
        max_epochs=8,
        val_check_interval=0.25,
    )
)
