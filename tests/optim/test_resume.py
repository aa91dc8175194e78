"""Resume equals the uninterrupted run for every registered optimizer x kernel, with and without a frozen backbone.

The frozen case is issue 12 item 9: fused SGD (the ``"auto"`` pick on CPU) crashed once fine-tuning unfroze a backbone
whose parameters share a param group with the already-stepped head (no momentum buffer next to ones that have it).
"""

from __future__ import annotations

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn

from lightning_speedups.callbacks.finetuning import FineTuneFreezing
from lightning_speedups.demo import DemoClassifier
from lightning_speedups.optim import OptimizerConfig, SchedulerConfig, get_optimizer_info, list_optimizers
from lightning_speedups.optim._fused_momentum import fill_missing_momentum_buffers, guard_fused_momentum
from tests.helpers import quiet_trainer
from tests.optim._data import TinyData


def _kernels(name: str) -> list[str]:
    info = get_optimizer_info(name)
    out = ["auto"]
    if info.accepts("fused"):
        out.append("fused")
    if info.accepts("foreach"):
        out += ["foreach", "for_loop"]
    return out


_CASES = [
    pytest.param(name, impl, frozen, id=f"{name}-{impl}-{'frozen' if frozen else 'unfrozen'}")
    for name in list_optimizers()
    for impl in _kernels(name)
    for frozen in (True, False)
]


# DemoClassifier is a CNN: Muon takes its kernels as matrices (conv="muon"), else it would have no matrix to step
_CNN_KWARGS = {"muon": {"conv": "muon"}}


def _fit(name: str, impl: str, frozen: bool, ckpt_dir, max_epochs: int, ckpt_path=None):  # noqa: ANN001, ANN202
    L.seed_everything(0, verbose=False)
    momentum = 0.9 if get_optimizer_info(name).momentum else None
    model = DemoClassifier(
        width=4,
        optimizer_config=OptimizerConfig(
            name,
            lr=0.02,
            weight_decay=1e-3,
            momentum=momentum,
            implementation=impl,
            kwargs=_CNN_KWARGS.get(name, {}),
        ),
        # a schedule-free optimizer replaces the schedule (the mixin refuses one beside it)
        scheduler_config=None if get_optimizer_info(name).schedule_free else SchedulerConfig("onecycle"),
    )
    callbacks: list[L.Callback] = [ModelCheckpoint(dirpath=ckpt_dir, filename="{epoch}", save_top_k=-1)]
    if frozen:  # the head (and, for SGD, its momentum buffers) steps 2 epochs before the backbone joins its group
        callbacks.append(FineTuneFreezing(unfreeze_at_epoch=2, verbose=False))
    trainer = quiet_trainer(max_epochs=max_epochs, limit_val_batches=0, enable_checkpointing=True, callbacks=callbacks)
    trainer.fit(model, TinyData(n_batches=2, batch_size=4), ckpt_path=ckpt_path)
    return model, trainer.optimizers[0]


@pytest.mark.filterwarnings("ignore:The dirpath has changed")
@pytest.mark.parametrize(("name", "impl", "frozen"), _CASES)
def test_optim_resume_every_optimizer(name: str, impl: str, frozen: bool, tmp_path) -> None:
    full, full_opt = _fit(name, impl, frozen, tmp_path / "full", max_epochs=3)
    resumed, opt = _fit(name, impl, frozen, tmp_path / "resumed", 3, ckpt_path=str(tmp_path / "full" / "epoch=1.ckpt"))
    for (key, a), b in zip(full.state_dict().items(), resumed.state_dict().values(), strict=True):
        torch.testing.assert_close(b, a, msg=key)
    a_state = full_opt.state_dict()["state"]
    b_state = opt.state_dict()["state"]
    assert a_state.keys() == b_state.keys()
    for idx in a_state:
        for key in a_state[idx]:
            torch.testing.assert_close(torch.as_tensor(b_state[idx][key]), torch.as_tensor(a_state[idx][key]))
    if frozen:
        assert all(p.requires_grad for p in resumed.parameters())


def _sgd_run(kernel: dict, dampening: float, nesterov: bool, closure: bool) -> list[torch.Tensor]:
    torch.manual_seed(0)
    params = [nn.Parameter(torch.randn(3, 4)) for _ in range(3)]
    opt = guard_fused_momentum(
        torch.optim.SGD(
            params, lr=0.1, momentum=0.9, dampening=dampening, nesterov=nesterov, weight_decay=0.01, **kernel
        )
    )
    g = torch.Generator().manual_seed(1)
    for step in range(5):
        for i, p in enumerate(params):  # param i starts getting gradients at step i: joins a group that stepped
            p.grad = torch.randn(3, 4, generator=g) if step >= i else None
        opt.step(lambda: None) if closure else opt.step()
    return [p.detach() for p in params]


@pytest.mark.parametrize(("dampening", "nesterov"), [(0.0, False), (0.0, True), (0.3, False)])
@pytest.mark.parametrize("closure", [False, True], ids=["no_closure", "closure"])
def test_fused_sgd_late_params_match_for_loop(dampening: float, nesterov: bool, closure: bool) -> None:
    fused = _sgd_run({"fused": True}, dampening, nesterov, closure)
    for kernel in ({"foreach": False}, {"foreach": True}):
        for a, b in zip(fused, _sgd_run(kernel, dampening, nesterov, closure), strict=True):
            torch.testing.assert_close(a, b)


def test_fused_sgd_guard_is_needed_and_idempotent() -> None:
    a = nn.Parameter(torch.ones(2))
    b = nn.Parameter(torch.ones(2))
    plain = torch.optim.SGD([a, b], lr=0.1, momentum=0.9, fused=True)
    a.grad = torch.ones(2)
    plain.step()
    b.grad = torch.ones(2)
    with pytest.raises(TypeError, match="got NoneType"):  # torch's behaviour: if this stops raising, drop the guard
        plain.step()
    assert fill_missing_momentum_buffers(plain) == [b]
    plain.step()  # filled by hand: steps now
    opt = torch.optim.SGD([a], lr=0.1, momentum=0.9, fused=True)
    assert guard_fused_momentum(guard_fused_momentum(opt)) is opt and len(opt._optimizer_step_pre_hooks) == 1


class _PlainFused(L.LightningModule):
    """A user's own module and optimizer: ``torch.optim.SGD(fused=True)``, no SpeedupMixin."""

    def __init__(self) -> None:
        super().__init__()
        self.net = DemoClassifier(width=4)

    def training_step(self, batch, batch_idx):  # noqa: ANN001, ANN201
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self):  # noqa: ANN201
        return torch.optim.SGD(self.parameters(), lr=0.02, momentum=0.9, fused=True)


@pytest.mark.filterwarnings("ignore:The dirpath has changed")
@pytest.mark.parametrize("lr_decay", [1.0, 0.65])
def test_plain_module_fused_sgd_with_finetuning(lr_decay: float, tmp_path) -> None:
    def fit(max_epochs: int, ckpt_dir, ckpt_path=None):  # noqa: ANN001, ANN202
        L.seed_everything(0, verbose=False)
        model = _PlainFused()
        mc = ModelCheckpoint(dirpath=ckpt_dir, filename="{epoch}", save_top_k=-1)
        cb = FineTuneFreezing(unfreeze_at_epoch=1, lr_decay=lr_decay, verbose=False)
        trainer = quiet_trainer(
            max_epochs=max_epochs, limit_val_batches=0, enable_checkpointing=True, callbacks=[cb, mc]
        )
        trainer.fit(model, TinyData(n_batches=2, batch_size=4), ckpt_path=ckpt_path)
        assert all(g["fused"] for g in trainer.optimizers[0].param_groups)  # split groups (lr_decay) stay fused
        return model

    full = fit(3, tmp_path / "full")
    resumed = fit(3, tmp_path / "resumed", ckpt_path=str(tmp_path / "full" / "epoch=0.ckpt"))
    for (key, a), b in zip(full.state_dict().items(), resumed.state_dict().values(), strict=True):
        torch.testing.assert_close(b, a, msg=key)
