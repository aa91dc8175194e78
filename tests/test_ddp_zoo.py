"""Public architectures in plain LightningModules under ``ddp_spawn`` (2 CPU ranks, gloo): ranks stay identical.

resnet18 structured pruning, ViT block-wise unfreezing and ViT mask pruning, each after a fit and after a resume
from a checkpoint. One DDP fit per test (two fits in one process can collide on ``MASTER_PORT``).
"""

from __future__ import annotations

import lightning as L
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_speedups import FineTuneFreezing, MaskPruning, StructuredPruning
from tests.helpers import quiet_trainer

pytestmark = pytest.mark.ddp


class Plain(L.LightningModule):
    """A public architecture wrapped as a user would: own optimizer, no mixin, no example_input_array."""

    def __init__(self, arch: str) -> None:
        super().__init__()
        if arch == "resnet18":
            from torchvision.models import resnet18

            self.net = resnet18(num_classes=4)
        else:
            from torchvision.models.vision_transformer import VisionTransformer

            self.net = VisionTransformer(
                image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=32, mlp_dim=64, num_classes=4
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.cross_entropy(self(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.02, momentum=0.9)


class SaveRanks(L.Callback):
    def __init__(self, out_dir: str) -> None:
        self.out_dir = out_dir

    def on_train_end(self, trainer, pl_module):
        torch.save(pl_module.state_dict(), f"{self.out_dir}/rank{trainer.global_rank}.pt")


CASES = {
    "resnet18-structured": ("resnet18", lambda: StructuredPruning(amount=0.5, start_epoch=0, end_epoch=1, steps=2)),
    "vit-freezing": ("vit", lambda: FineTuneFreezing(unfreeze_every=1, unfreeze_at_epoch=None, verbose=False)),
    "vit-masks": ("vit", lambda: MaskPruning(amount=0.5, start_epoch=0, end_epoch=1, steps=2)),
}


def _loader() -> DataLoader:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(16, 3, 32, 32, generator=g)
    y = torch.randint(0, 4, (16,), generator=g)
    return DataLoader(TensorDataset(x, y), batch_size=4)


def _assert_ranks_identical(tmp_path) -> dict[str, torch.Tensor]:
    r0 = torch.load(tmp_path / "rank0.pt", weights_only=True)
    r1 = torch.load(tmp_path / "rank1.pt", weights_only=True)
    assert r0.keys() == r1.keys()
    for name in r0:
        if "running" in name or "num_batches" in name:  # BatchNorm statistics are per rank without SyncBatchNorm
            assert r0[name].shape == r1[name].shape
            continue
        torch.testing.assert_close(r0[name], r1[name], rtol=0, atol=0, msg=name)
    return r0


def _ddp_fit(tmp_path, case: str, epochs: int, ckpt_path=None) -> dict[str, torch.Tensor]:
    arch, make = CASES[case]
    trainer = quiet_trainer(
        devices=2, strategy="ddp_spawn", max_epochs=epochs, callbacks=[make(), SaveRanks(str(tmp_path))]
    )
    trainer.fit(Plain(arch), _loader(), ckpt_path=ckpt_path)
    return _assert_ranks_identical(tmp_path)


@pytest.mark.parametrize("case", list(CASES))
def test_zoo_ddp_fit_ranks_identical(tmp_path, case):
    state = _ddp_fit(tmp_path, case, epochs=2)
    if case == "resnet18-structured":
        assert state["net.conv1.weight"].shape[0] == 32
    if case == "vit-masks":
        assert not any("parametrizations" in k for k in state)  # masks folded in: clean keys


@pytest.mark.parametrize("case", list(CASES))
def test_zoo_ddp_resume_ranks_identical(tmp_path, case):
    arch, make = CASES[case]
    L.seed_everything(0)
    single = quiet_trainer(max_epochs=1, callbacks=[make()])
    single.fit(Plain(arch), _loader())
    single.save_checkpoint(tmp_path / "e1.ckpt")  # epoch 1 of 2 done on one process; the rest under DDP
    state = _ddp_fit(tmp_path, case, epochs=2, ckpt_path=str(tmp_path / "e1.ckpt"))
    if case == "resnet18-structured":
        assert state["net.conv1.weight"].shape[0] == 32
