"""load_checkpoint: one reload for any module (pruned shapes, fake quantizers), weights_only, clear errors."""

from __future__ import annotations

import pickle

import lightning as L
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_speedups import QuantizationAwareTraining, SpeedupConfigError, StructuredPruning, load_checkpoint
from lightning_speedups.functional import prune_structured, save_pruned
from tests.helpers import quiet_trainer


class PlainNet(L.LightningModule):
    """A plain LightningModule: its own optimizer, no SpeedupMixin, no example_input_array."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1),
            nn.BatchNorm2d(8),
            nn.ReLU(),
            nn.Conv2d(8, 8, 3, padding=1),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(8, 16),
            nn.ReLU(),
            nn.Linear(16, 4),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.cross_entropy(self(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)


def _loader() -> DataLoader:
    g = torch.Generator().manual_seed(0)
    return DataLoader(TensorDataset(torch.randn(8, 3, 8, 8, generator=g), torch.randint(0, 4, (8,), generator=g)), 4)


def _fit(cb, epochs: int, ckpt_path=None, model=None):
    L.seed_everything(0)
    model = model or PlainNet()
    trainer = quiet_trainer(max_epochs=epochs, callbacks=[cb])
    trainer.fit(model, _loader(), ckpt_path=ckpt_path)
    return model, trainer


X = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("technique", ["structured", "qat"])
def test_load_checkpoint_plain_module_reload_and_resume(tmp_path, technique):
    pytest.importorskip("torch_pruning" if technique == "structured" else "torchao")

    def callback():
        return StructuredPruning(amount=0.5) if technique == "structured" else QuantizationAwareTraining(start_epoch=0)

    model, trainer = _fit(callback(), 1)
    path = tmp_path / "e1.ckpt"
    trainer.save_checkpoint(path)
    fresh = load_checkpoint(PlainNet(), path)
    model.eval(), fresh.eval()
    torch.testing.assert_close(fresh(X), model(X), rtol=0, atol=0)  # fake quantizers / pruned shapes rebuilt
    if technique == "qat":  # a plain module's own load_from_checkpoint silently drops the quantizers
        plain = PlainNet.load_from_checkpoint(path).eval()
        assert not torch.equal(plain(X), model(X))
    straight, _ = _fit(callback(), 3)
    resumed, _ = _fit(callback(), 3, ckpt_path=path)  # a plain module resumes: structure rebuilt before the load
    for (n, a), (_, b) in zip(straight.state_dict().items(), resumed.state_dict().items()):
        torch.testing.assert_close(a, b, msg=n)


def test_load_checkpoint_plain_nn_module(tmp_path):
    pytest.importorskip("torch_pruning")
    net = PlainNet().net
    prune_structured(net, X, 0.5)
    save_pruned(net, tmp_path / "p.pt")
    fresh = load_checkpoint(PlainNet().net, tmp_path / "p.pt")
    assert fresh[0].out_channels == 4
    torch.testing.assert_close(fresh.eval()(X), net.eval()(X))


def test_load_checkpoint_bad_input(tmp_path):
    with pytest.raises(SpeedupConfigError, match="`path`='.*missing.ckpt' does not exist"):
        load_checkpoint(PlainNet(), tmp_path / "missing.ckpt")
    (tmp_path / "garbage.ckpt").write_bytes(b"not a checkpoint")
    with pytest.raises(SpeedupConfigError, match="is not a checkpoint that loads with `weights_only=True`"):
        load_checkpoint(PlainNet(), tmp_path / "garbage.ckpt")

    class Evil:
        def __reduce__(self):
            return (print, ("this must never run",))

    (tmp_path / "evil.ckpt").write_bytes(pickle.dumps({"state_dict": {}, "x": Evil()}))
    with pytest.raises(SpeedupConfigError, match="weights_only=True"):
        load_checkpoint(PlainNet(), tmp_path / "evil.ckpt")
    torch.save({"epoch": 3}, tmp_path / "nostate.ckpt")
    with pytest.raises(SpeedupConfigError, match="has no `state_dict` of tensors"):
        load_checkpoint(PlainNet(), tmp_path / "nostate.ckpt")
    torch.save({"state_dict": PlainNet().state_dict(), "lightning_speedups": {"sparsify24": {}}}, tmp_path / "new.ckpt")
    with pytest.raises(SpeedupConfigError, match="cannot rebuild: \\['sparsify24'\\]"):
        load_checkpoint(PlainNet(), tmp_path / "new.ckpt")
    # a foreign checkpoint: the error lists what does not fit, and the model is left as it was
    torch.save({"state_dict": nn.Linear(3, 2).state_dict()}, tmp_path / "foreign.ckpt")
    model = PlainNet()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(SpeedupConfigError, match="(?s)does not fit PlainNet: .*Missing key"):
        load_checkpoint(model, tmp_path / "foreign.ckpt")
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_load_checkpoint_failed_structure_leaves_model_unchanged(tmp_path):
    pytest.importorskip("torch_pruning")
    net = PlainNet()
    prune_structured(net, X, 0.5)
    save_pruned(net, tmp_path / "p.pt")
    other = nn.Sequential(nn.Conv2d(3, 8, 3), nn.Linear(3, 3))  # names overlap, the rest does not fit
    params = [id(p) for p in other.parameters()]
    with pytest.raises(SpeedupConfigError, match="does not fit"):
        load_checkpoint(other, tmp_path / "p.pt")
    assert [id(p) for p in other.parameters()] == params and other[0].out_channels == 8
