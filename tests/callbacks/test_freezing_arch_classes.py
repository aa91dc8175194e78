"""FineTuneFreezing on architecture classes beyond pretrained classifiers (issue 26).

Class: a backbone that relies on BatchNorm to keep its activations in range (Inception v3's truncated-normal init)
and whose norm layers were never trained (built from scratch: running mean 0, variance 1). Held in eval mode while
frozen, those layers do not normalise at all; the activations overflow, training turns the weights to NaN and the
reloaded model's outputs "differ" from the trained one's (NaN != NaN), while resume (NaN-equal states) looks fine.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_speedups.callbacks.finetuning import FineTuneFreezing
from tests.helpers import quiet_trainer


class NormReliantNet(nn.Module):
    """Convolutions initialised far too large (std 1): without BatchNorm statistics the activations explode."""

    def __init__(self, depth: int = 8, width: int = 16) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        channels = 3
        for _ in range(depth):
            conv = nn.Conv2d(channels, width, 3, padding=1, bias=False)
            nn.init.normal_(conv.weight, std=1.0)
            layers += [conv, nn.BatchNorm2d(width), nn.ReLU()]
            channels = width
        self.features = nn.Sequential(*layers)
        self.fc = nn.Linear(width, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.features(x).mean((2, 3)))


class Classifier(L.LightningModule):
    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        out = self(x)
        return F.cross_entropy(out.logits if hasattr(out, "logits") else out, y)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)  # as the zoo's


def _loader(side: int, n: int = 8) -> DataLoader:
    g = torch.Generator().manual_seed(0)
    return DataLoader(
        TensorDataset(torch.randn(n, 3, side, side, generator=g), torch.randint(0, 3, (n,), generator=g)), batch_size=4
    )


def _fit_and_reload(build: Any, side: int, tmp_path: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """Fit 2 epochs (unfreezing at epoch 1), save, load into a fresh model: (trained, reloaded) eval outputs."""
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = Classifier(build())
    trainer = quiet_trainer(max_epochs=2, limit_val_batches=0, callbacks=[FineTuneFreezing(verbose=False)])
    with pytest.warns(UserWarning, match=r"statistics of a freshly built layer"):
        trainer.fit(model, _loader(side))
    trainer.save_checkpoint(tmp_path / "last.ckpt")
    x = torch.randn(2, 3, side, side, generator=torch.Generator().manual_seed(1))
    model.eval()
    with torch.no_grad():
        trained = model(x)
    with torch.random.fork_rng():
        torch.manual_seed(1)  # other initial weights: everything must come from the checkpoint
        fresh = Classifier(build())
    fresh.load_state_dict(torch.load(tmp_path / "last.ckpt", weights_only=True)["state_dict"])
    fresh.eval()
    with torch.no_grad():
        return trained, fresh(x)


def test_freezing_untrained_norms_reload(tmp_path):
    trained, reloaded = _fit_and_reload(NormReliantNet, 16, tmp_path)
    assert torch.isfinite(trained).all()  # held in eval mode with identity statistics, the net overflowed to NaN
    torch.testing.assert_close(reloaded, trained)


def test_freezing_keeps_pretrained_norms_in_eval():
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = Classifier(NormReliantNet(depth=2))
    model.train()  # "pretrain": two batches in train mode give every BatchNorm real statistics
    with torch.no_grad():
        for x, _ in _loader(16):
            model(x)
    stats = {k: v.clone() for k, v in model.state_dict().items() if "running" in k}
    trainer = quiet_trainer(max_epochs=1, limit_val_batches=0, callbacks=[FineTuneFreezing(unfreeze_at_epoch=None)])
    trainer.fit(model, _loader(16))
    for k, v in stats.items():  # computed statistics: frozen as before
        assert torch.equal(model.state_dict()[k], v), k


def test_freezing_inception_v3_reload(tmp_path):
    torchvision = pytest.importorskip("torchvision")

    def build() -> nn.Module:  # the weights=None defaults: init_weights=True (truncated normal, std 0.1)
        return torchvision.models.inception_v3(weights=None, num_classes=3, aux_logits=False, init_weights=True)

    trained, reloaded = _fit_and_reload(build, 112, tmp_path)
    assert torch.isfinite(trained).all()
    torch.testing.assert_close(reloaded, trained)
