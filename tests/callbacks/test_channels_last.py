from __future__ import annotations

import json
from typing import Any

import pytest
import torch
from lightning.pytorch.callbacks import Callback
from torch import nn
from torch.utils.data import DataLoader, TensorDataset, default_collate

from lightning_speedups._errors import SpeedupConfigError
from lightning_speedups.callbacks.channels_last import ChannelsLast
from lightning_speedups.demo import DemoClassifier, DemoMLP
from lightning_speedups.functional.channels_last import is_channels_last
from tests.helpers import quiet_trainer


def _loader(n: int = 64, tuple_batches: bool = False) -> DataLoader:
    g = torch.Generator().manual_seed(0)
    ds = TensorDataset(torch.randn(n, 3, 32, 32, generator=g), torch.randint(0, 10, (n,), generator=g))
    collate = (lambda b: tuple(default_collate(b))) if tuple_batches else None  # default collate gives lists
    return DataLoader(ds, batch_size=16, collate_fn=collate)


class Recorder(DemoClassifier):
    """Records the memory format that `training_step`, `validation_step` and `forward` receive."""

    def __init__(self) -> None:
        super().__init__(width=8)
        self.seen: dict[str, list[bool]] = {"step": [], "forward": [], "val": []}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen["forward"].append(is_channels_last(x))
        return super().forward(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.seen["step"].append(is_channels_last(batch[0]))
        return super().training_step(batch, batch_idx)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.seen["val"].append(is_channels_last(batch[0]))
        super().validation_step(batch, batch_idx)


def test_channels_last_misconfiguration():
    with pytest.raises(SpeedupConfigError, match="`convert_batch`='yes' is not supported. Allowed values: True, False"):
        ChannelsLast(convert_batch="yes")  # type: ignore[arg-type]


def test_channels_last_fit_list_batches():
    model = Recorder()
    trainer = quiet_trainer(max_steps=2, limit_val_batches=1, val_check_interval=2, callbacks=[ChannelsLast()])
    trainer.fit(model, _loader(), _loader(32))
    assert model.seen["step"] == [True, True]  # converted in place before training_step
    assert model.seen["val"] == [True]
    assert all(model.seen["forward"]) and len(model.seen["forward"]) == 3
    assert all(is_channels_last(m.weight) for m in model.modules() if isinstance(m, nn.Conv2d))
    # Adam state follows the parameters' layout
    state = trainer.optimizers[0].state[model.backbone[0][0].weight]
    assert is_channels_last(state["exp_avg"])


def test_channels_last_fit_tuple_batches():
    """Tuples cannot be changed in place: the forward pre-hook converts what reaches `self(x)`."""
    model = Recorder()
    trainer = quiet_trainer(max_steps=2, limit_val_batches=0, callbacks=[ChannelsLast()])
    trainer.fit(model, _loader(tuple_batches=True))
    assert model.seen["step"] == [False, False]
    assert model.seen["forward"] == [True, True]


def test_channels_last_without_callback_baseline():
    model = Recorder()
    quiet_trainer(max_steps=2, limit_val_batches=0).fit(model, _loader())
    assert model.seen["step"] == [False, False] and model.seen["forward"] == [False, False]


def test_channels_last_no_conv_model_warns():
    model = DemoMLP(hidden=(16,))
    callback = ChannelsLast()
    with pytest.warns(UserWarning, match="no 2-D convolution"):
        quiet_trainer(max_steps=1, limit_val_batches=0, callbacks=[callback]).fit(model, _loader())
    assert not callback.active and callback.converted_batches == 0
    assert not model._forward_pre_hooks


def test_channels_last_checkpoint_loads_into_plain_model():
    model = DemoClassifier(width=8)
    trainer = quiet_trainer(max_steps=3, limit_val_batches=0, callbacks=[ChannelsLast()])
    trainer.fit(model, _loader())
    trainer.save_checkpoint("cl.ckpt")
    state = torch.load("cl.ckpt", weights_only=True)["state_dict"]
    assert all(v.is_contiguous() for v in state.values())  # saved as plain NCHW

    plain = DemoClassifier.load_from_checkpoint("cl.ckpt")
    assert not any(is_channels_last(m.weight) for m in plain.modules() if isinstance(m, nn.Conv2d))
    for key, value in model.state_dict().items():
        assert torch.equal(plain.state_dict()[key], value), key
    model.eval()
    plain.eval()
    x = torch.randn(8, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(plain(x), model(x), atol=1e-5, rtol=1e-5)
    assert not model._forward_pre_hooks  # hook removed at teardown


def test_channels_last_resume():
    def fit(epochs: int, ckpt_path: str | None = None, save: str | None = None) -> DemoClassifier:
        torch.manual_seed(0)
        model = DemoClassifier(width=8)
        trainer = quiet_trainer(max_epochs=epochs, limit_val_batches=0, callbacks=[ChannelsLast()])
        trainer.fit(model, _loader(32), ckpt_path=ckpt_path)  # 2 batches an epoch, checkpoint at the epoch end
        if save:
            trainer.save_checkpoint(save)
        return model

    full = fit(2)
    fit(1, save="half.ckpt")
    resumed = fit(2, ckpt_path="half.ckpt")
    assert all(is_channels_last(m.weight) for m in resumed.modules() if isinstance(m, nn.Conv2d))
    for (name, a), b in zip(full.named_parameters(), resumed.parameters()):
        torch.testing.assert_close(b, a, atol=1e-6, rtol=1e-5, msg=name)


@pytest.mark.ddp
def test_channels_last_ddp(tmp_path):
    model = DemoClassifier(width=8)
    callbacks = [ChannelsLast(), _ReportRank(tmp_path)]
    trainer = quiet_trainer(max_steps=2, limit_val_batches=0, devices=2, strategy="ddp_spawn", callbacks=callbacks)
    trainer.fit(model, _loader())
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for report in reports:
        assert report["conv_weights_cl"] and report["batch_cl"]
    assert reports[0]["checksum"] == pytest.approx(reports[1]["checksum"], rel=1e-6)  # ranks stay in sync


class _ReportRank(Callback):
    def __init__(self, path: Any) -> None:
        self.path = path
        self.batch_cl = False

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self.batch_cl = is_channels_last(batch[0])

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        convs = [m.weight for m in pl_module.modules() if isinstance(m, nn.Conv2d)]
        report = {
            "conv_weights_cl": all(is_channels_last(w) for w in convs),
            "batch_cl": self.batch_cl,
            "checksum": float(sum(p.double().sum() for p in pl_module.parameters())),
        }
        (self.path / f"rank{trainer.global_rank}.json").write_text(json.dumps(report))
