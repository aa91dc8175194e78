"""ProgressiveResizing on architecture classes beyond plain classifiers (issue 26).

- training-only branches (Inception's auxiliary classifier): the smallest size is checked in train mode;
- patch embeddings (vision transformers): every side of the schedule is checked, not only the smallest;
- segmentation (dict outputs, per-pixel targets): masks are resized with the images, by nearest neighbour.
"""

from __future__ import annotations

from typing import Any

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

from lightning_speedups._errors import SpeedupConfigError
from lightning_speedups.callbacks.progressive_resizing import ProgressiveResizing
from lightning_speedups.functional.progressive_resizing import resize_batch
from tests.helpers import quiet_trainer


class _Pairs(Dataset):
    """Images with a class label, or with a per-pixel mask (as tuples or dicts)."""

    def __init__(self, side: int, n: int = 8, masks: bool = False, dicts: bool = False) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 3, side, side, generator=g)
        self.y = torch.randint(0, 3, (n, side, side) if masks else (n,), generator=g)
        self.dicts = dicts

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> Any:
        return {"image": self.x[i], "mask": self.y[i]} if self.dicts else (self.x[i], self.y[i])


# ---------------------------------------------------------------------------------------------------- training-only
class AuxNet(nn.Module):
    """Inception's pattern in miniature: an auxiliary head (avg-pool 5/3, then a 5x5 conv) run only in training."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU())
        self.fc = nn.Linear(8, 3)
        self.aux = nn.Sequential(nn.Conv2d(8, 4, 5), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 3))

    def forward(self, x: torch.Tensor) -> Any:
        f = self.features(x)
        out = self.fc(f.mean((2, 3)))
        if self.training:  # 32 px: 10 px into the 5x5 conv; 16 px: 4 px, too small
            return out, self.aux(F.avg_pool2d(f, 5, stride=3))
        return out


class AuxModule(L.LightningModule):
    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net
        self.steps = 0

    def forward(self, x: torch.Tensor) -> Any:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.steps += 1
        x, y = batch
        out = self(x)
        logits, aux = (out.logits, out.aux_logits) if hasattr(out, "aux_logits") else out
        return F.cross_entropy(logits, y) + 0.4 * F.cross_entropy(aux, y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def test_resizing_checks_training_only_branch():
    model = AuxModule(AuxNet())
    before = {k: v.clone() for k, v in model.state_dict().items()}
    trainer = quiet_trainer(max_steps=2, limit_val_batches=0, callbacks=[ProgressiveResizing(initial_scale=0.5)])
    with pytest.raises(SpeedupConfigError, match=r"`AuxModule` fails on \(16, 16\) inputs in training mode") as err:
        trainer.fit(model, DataLoader(_Pairs(32), batch_size=4))
    msg = str(err.value)
    assert "`net.aux.0` (Conv2d)" in msg and "here >= 0.625 (sides of 20 pixels run)" in msg
    assert model.steps == 0 and model.training  # refused before the first step, train/eval flags kept
    for k, v in model.state_dict().items():  # BatchNorm statistics restored after the train-mode check
        assert torch.equal(v, before[k]), k
    # the smallest scale the message names trains
    trainer = quiet_trainer(max_steps=2, limit_val_batches=0, callbacks=[ProgressiveResizing(initial_scale=0.625)])
    trainer.fit(model, DataLoader(_Pairs(32), batch_size=4))
    assert model.steps == 2


def test_resizing_refuses_inception_v3_aux_logits():
    torchvision = pytest.importorskip("torchvision")
    with torch.random.fork_rng():
        torch.manual_seed(0)
        net = torchvision.models.inception_v3(weights=None, num_classes=3, aux_logits=True, init_weights=False)
    model = AuxModule(net)
    cb = ProgressiveResizing(initial_scale=0.5, size_increment=64)  # large increments: few sizes to try
    trainer = quiet_trainer(max_steps=1, limit_val_batches=0, callbacks=[cb])
    with pytest.raises(
        SpeedupConfigError,
        match=r"`AuxModule` fails on \(128, 128\) inputs in training mode.*"
        r"`net\.AuxLogits\.conv1\.conv` \(Conv2d\).*Kernel size can't be greater",
    ):
        trainer.fit(model, DataLoader(_Pairs(299, n=2), batch_size=2))
    assert model.steps == 0


# ---------------------------------------------------------------------------------------------------- patch sizes
class PatchNet(nn.Module):
    """A vision transformer's stem in miniature: 8x8 patches, and timm's check that the sides divide by the patch."""

    def __init__(self) -> None:
        super().__init__()
        self.patch = nn.Conv2d(3, 8, 8, stride=8)
        self.fc = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> Any:
        torch._assert(x.shape[-2] % 8 == 0, f"Input height ({x.shape[-2]}) should be divisible by patch size (8).")
        out = self.fc(self.patch(x).flatten(2).mean(2))
        return out, out  # (logits, aux): AuxModule's loss


def test_resizing_checks_every_side_of_the_schedule():
    """The smallest (16) and full (32) sides run, 20 and 28 (on the 40-step ramp) do not: refused before any step,
    with the increment that works; with it, the run trains at 16, 24 and 32."""
    model = AuxModule(PatchNet())
    before = {k: v.clone() for k, v in model.state_dict().items()}
    trainer = quiet_trainer(max_steps=40, limit_val_batches=0, callbacks=[ProgressiveResizing(initial_scale=0.5)])
    with pytest.raises(SpeedupConfigError, match=r"fails in training mode on sides 20, 28.*`size_increment`=4") as err:
        trainer.fit(model, DataLoader(_Pairs(32), batch_size=4))
    msg = str(err.value)
    assert "divisible by patch size" in msg and "Sides that run: 16, 24, 32" in msg and "size_increment=8" in msg
    assert model.steps == 0
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k
    cb = ProgressiveResizing(initial_scale=0.5, size_increment=8)
    trainer = quiet_trainer(max_steps=8, limit_val_batches=0, callbacks=[cb])
    trainer.fit(model, DataLoader(_Pairs(32, n=32), batch_size=4))
    assert model.steps == 8 and set(cb.sizes) >= {"16x16", "32x32"}


# ---------------------------------------------------------------------------------------------------- segmentation
class TinyUNet(nn.Module):
    """A plain U-Net (one down, one up, a skip connection) returning ``{"out": logits}`` like torchvision's."""

    def __init__(self, classes: int = 3) -> None:
        super().__init__()
        self.enc = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU())
        self.down = nn.Sequential(nn.MaxPool2d(2), nn.Conv2d(8, 16, 3, padding=1), nn.ReLU())
        self.up = nn.ConvTranspose2d(16, 8, 2, stride=2)
        self.head = nn.Conv2d(16, classes, 1)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        e = self.enc(x)
        return {"out": self.head(torch.cat([e, self.up(self.down(e))], 1))}


class SegModule(L.LightningModule):
    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net
        self.seen: list[tuple[tuple[int, ...], tuple[int, ...], torch.dtype]] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, mask = (batch["image"], batch["mask"]) if isinstance(batch, dict) else batch
        self.seen.append((tuple(x.shape[-2:]), tuple(mask.shape[-2:]), mask.dtype))
        assert set(mask.unique().tolist()) <= {0, 1, 2}  # class ids, not interpolated values
        return F.cross_entropy(self.net(x)["out"], mask)  # per-pixel loss: fails unless the masks follow the images

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


@pytest.mark.parametrize("dicts", [False, True], ids=["tuple", "dict"])
def test_resizing_segmentation_resizes_masks(dicts: bool):
    model = SegModule(TinyUNet())
    cb = ProgressiveResizing(initial_scale=0.5, delay_fraction=1.0, finetune_fraction=0.0)  # small all along
    trainer = quiet_trainer(max_steps=2, limit_val_batches=0, callbacks=[cb])
    trainer.fit(model, DataLoader(_Pairs(32, masks=True, dicts=dicts), batch_size=4))
    assert model.seen == [((16, 16), (16, 16), torch.int64)] * 2


def test_resizing_torchvision_segmentation():
    torchvision = pytest.importorskip("torchvision")
    with torch.random.fork_rng():
        torch.manual_seed(0)
        net = torchvision.models.segmentation.lraspp_mobilenet_v3_large(
            weights=None, weights_backbone=None, num_classes=3
        )
    model = SegModule(net)
    cb = ProgressiveResizing(initial_scale=0.5, delay_fraction=1.0, finetune_fraction=0.0)
    trainer = quiet_trainer(max_steps=2, limit_val_batches=0, callbacks=[cb])
    trainer.fit(model, DataLoader(_Pairs(64, masks=True, dicts=True), batch_size=4))
    assert model.seen == [((32, 32), (32, 32), torch.int64)] * 2


def test_resize_batch_per_pixel_targets():
    images = torch.arange(64.0).view(1, 1, 8, 8).repeat(2, 3, 1, 1)
    ids = torch.arange(64).view(1, 8, 8).repeat(2, 1, 1)
    labels = torch.tensor([1, 2])
    mask4 = ids[:, None].clone()
    out = resize_batch({"x": images, "y": labels, "masks": (ids, mask4)}, 0.5)
    assert out["y"] is labels  # classification targets [B]: untouched
    small, small4 = out["masks"]
    assert small.shape == (2, 4, 4) and small.dtype == torch.int64 and small4.shape == (2, 1, 4, 4)
    assert set(small.flatten().tolist()) <= set(ids.flatten().tolist())  # nearest: existing values only
    assert torch.equal(small4[:, 0], small)
    # crop: the mask gets the image's window
    out = resize_batch((images, ids), 0.5, mode="crop", generator=torch.Generator().manual_seed(1))
    assert torch.equal(out[0][:, 0].long(), out[1])
    # a tensor whose last dims are not the image's is left alone
    other = torch.zeros(2, 5, 7, dtype=torch.long)
    assert resize_batch((images, other), 0.5)[1] is other
