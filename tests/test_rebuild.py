"""rebuild_optimizers: same LR at the same step, optimizer state carried or reset, no dead tensors."""

from __future__ import annotations

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from lightning_speedups._errors import SpeedupConfigError
from lightning_speedups._rebuild import rebuild_optimizers, slice_state_tensor
from lightning_speedups.demo import DemoClassifier
from tests.helpers import quiet_trainer


class _Model(DemoClassifier):
    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)
        sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=8)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


class _Swap(L.Callback):
    """At epoch 1, replace ``head.weight`` by a new (identical) Parameter, as a pruning step would."""

    def __init__(self, with_origin: bool) -> None:
        self.with_origin = with_origin
        self.summary: dict[str, int] = {}
        self.lr_before: float = 0.0

    def on_train_epoch_start(self, trainer, pl_module):
        if trainer.current_epoch != 1:
            return
        old = pl_module.head.weight
        self.lr_before = trainer.optimizers[0].param_groups[0]["lr"]
        new = torch.nn.Parameter(old.detach().clone())
        pl_module.head.weight = new
        origins = {id(new): (old, {0: torch.arange(old.shape[0])})} if self.with_origin else None
        self.summary = rebuild_optimizers(trainer, pl_module, origins)
        opt = trainer.optimizers[0]
        live = {id(p) for p in pl_module.parameters()}
        assert all(id(p) in live for g in opt.param_groups for p in g["params"])
        assert all(id(p) in live for p in opt.state)
        assert opt.param_groups[0]["lr"] == self.lr_before


def _loader():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(16, 3, 32, 32, generator=g)
    y = torch.randint(0, 10, (16,), generator=g)
    return DataLoader(TensorDataset(x, y), batch_size=4)


def _fit(callbacks):
    L.seed_everything(0)
    model = _Model(width=4)
    trainer = quiet_trainer(max_epochs=2, callbacks=callbacks, limit_val_batches=0)
    trainer.fit(model, _loader())
    return model, trainer


def test_rebuild_matches_uninterrupted():
    ref, ref_trainer = _fit([])
    swap = _Swap(with_origin=True)
    model, trainer = _fit([swap])
    assert swap.summary["reset"] == 0 and swap.summary["carried"] == len(list(model.parameters()))
    for (name, a), b in zip(ref.state_dict().items(), model.state_dict().values()):
        torch.testing.assert_close(a, b, msg=name)
    assert trainer.optimizers[0].param_groups[0]["lr"] == ref_trainer.optimizers[0].param_groups[0]["lr"]
    assert trainer.lr_scheduler_configs[0].scheduler.last_epoch == 8


def test_rebuild_without_origin_resets_state():
    swap = _Swap(with_origin=False)
    model, trainer = _fit([swap])
    assert swap.summary["reset"] == 1
    assert trainer.lr_scheduler_configs[0].scheduler.optimizer is trainer.optimizers[0]


def test_slice_state_tensor():
    old = torch.arange(12.0).view(4, 3)
    new = torch.zeros(2, 2)
    kept = {0: torch.tensor([0, 2]), 1: torch.tensor([1, 2])}
    torch.testing.assert_close(slice_state_tensor(old * 2, old, new, kept), (old * 2)[[0, 2]][:, [1, 2]])
    step = torch.tensor(5.0)
    assert slice_state_tensor(step, old, new, kept) == step
    assert slice_state_tensor(torch.zeros(7), old, new, kept) is None


def test_rebuild_misconfiguration():
    class _Fake:
        strategy = object()

    with pytest.raises(SpeedupConfigError, match="is not supported when parameters change"):
        rebuild_optimizers(_Fake(), torch.nn.Linear(2, 2))
