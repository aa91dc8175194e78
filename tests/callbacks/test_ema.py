from __future__ import annotations

import json
import pickle
from typing import Any

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import EMAWeightAveraging, ModelCheckpoint, StochasticWeightAveraging
from torch.utils.data import DataLoader, TensorDataset

from lightning_speedups._compat import averaged_model
from lightning_speedups._errors import SpeedupConfigError
from lightning_speedups.callbacks.ema import EMA
from lightning_speedups.demo import DemoClassifier
from tests.helpers import quiet_trainer


def _loader(n: int = 32, batch_size: int = 16) -> DataLoader:
    g = torch.Generator().manual_seed(0)
    ds = TensorDataset(torch.randn(n, 3, 32, 32, generator=g), torch.randint(0, 10, (n,), generator=g))
    return DataLoader(ds, batch_size=batch_size)


def _model() -> DemoClassifier:
    L.seed_everything(0, verbose=False)
    return DemoClassifier(width=4, optimizer_config={"name": "sgd", "lr": 0.05})


def test_ema_misconfiguration():
    with pytest.raises(SpeedupConfigError, match=r"`decay`=1.5 is out of range.*a number in \[0.0, 1.0\)"):
        EMA(decay=1.5)
    with pytest.raises(SpeedupConfigError, match=r"`update_every_n_steps`=0 is out of range.*an integer >= 1\."):
        EMA(update_every_n_steps=0)
    with pytest.raises(SpeedupConfigError, match=r"`update_starting_at_step`=-1 is out of range.*>= 0 or None"):
        EMA(update_starting_at_step=-1)
    with pytest.raises(SpeedupConfigError, match=r"`update_starting_at_epoch`=1.5 is not an integer \(a float\)"):
        EMA(update_starting_at_epoch=1.5)  # type: ignore[arg-type]
    with pytest.raises(SpeedupConfigError, match=r"`warmup`=1 is not supported. Allowed values: True, False"):
        EMA(warmup=1)  # type: ignore[arg-type]
    with pytest.raises(SpeedupConfigError, match=r"`device`='gpu0' is not supported"):
        EMA(device="gpu0")
    trainer = quiet_trainer(max_steps=1, limit_val_batches=0, callbacks=[EMA(), StochasticWeightAveraging(1e-2)])
    with pytest.raises(SpeedupConfigError, match=r"another weight-averaging callback \(StochasticWeightAveraging\)"):
        trainer.fit(_model(), _loader())
    assert trainer.global_step == 0


def test_ema_is_lightnings_and_pickles():
    cb = pickle.loads(pickle.dumps(EMA(decay=0.9, update_every_n_steps=2)))  # ddp_spawn pickles callbacks
    assert isinstance(cb, EMAWeightAveraging)
    assert cb.should_update(step_idx=0) and not cb.should_update(step_idx=1) and not cb.should_update(epoch_idx=0)
    late = EMA(update_starting_at_step=3, update_starting_at_epoch=1)
    assert not late.should_update(step_idx=2) and late.should_update(step_idx=3)
    assert not late.should_update(epoch_idx=0) and late.should_update(epoch_idx=1)


def test_ema_fit_validates_on_average_and_ends_with_it(tmp_path):
    seen: dict[str, list[torch.Tensor]] = {"val": [], "train": []}

    class Peek(L.Callback):
        def on_validation_epoch_start(self, trainer: Any, pl_module: Any) -> None:
            seen["val"].append(pl_module.head.weight.detach().clone())

        def on_train_batch_end(self, trainer: Any, pl_module: Any, *args: Any) -> None:
            seen["train"].append(pl_module.head.weight.detach().clone())

    model = _model()
    trainer = quiet_trainer(max_epochs=2, callbacks=[EMA(decay=0.9, warmup=False), Peek()])
    trainer.fit(model, _loader(), _loader())
    raw = seen["train"]  # 4 steps; the average: copy, then 0.9 / 0.1 blends
    expected = raw[0]
    for w in raw[1:]:
        expected = 0.9 * expected + 0.1 * w
    torch.testing.assert_close(seen["val"][-1], expected)  # validation ran on the average
    torch.testing.assert_close(model.head.weight, expected)  # and the model ends with it
    trainer.save_checkpoint(tmp_path / "end.ckpt")
    ckpt = torch.load(tmp_path / "end.ckpt", weights_only=False)
    assert int(ckpt["averaging_state"]["n_averaged"]) == 4
    torch.testing.assert_close(ckpt["current_model_state"]["head.weight"], raw[-1])  # raw weights kept for resume


def _snapshot(trainer: L.Trainer, model: L.LightningModule, ema: EMA) -> dict[str, Any]:
    """What a checkpoint of this state would hold (the EMA's own ``on_save_checkpoint``, no file)."""
    ckpt: dict[str, Any] = {"state_dict": {k: v.clone() for k, v in model.state_dict().items()}}
    ema.on_save_checkpoint(trainer, model, ckpt)
    return ckpt


def _fit(
    epochs: int, ckpt_path: Any = None, save: Any = None, callbacks: list[Any] | None = None, **kw: Any
) -> dict[str, Any]:
    model = _model()
    ema = EMA(decay=0.8, update_starting_at_epoch=0)
    trainer = quiet_trainer(max_epochs=epochs, limit_val_batches=0, callbacks=[ema, *(callbacks or [])], **kw)
    trainer.fit(model, _loader(48), ckpt_path=ckpt_path)  # 3 batches an epoch
    if save:
        trainer.save_checkpoint(save)
    return _snapshot(trainer, model, ema)


def _assert_same(a: dict[str, Any], b: dict[str, Any]) -> None:
    """Same average, same raw weights, same update count."""
    for key in ("state_dict", "current_model_state", "averaging_state"):
        assert list(a[key]) == list(b[key])
        for name, x in a[key].items():
            torch.testing.assert_close(b[key][name], x, atol=1e-6, rtol=1e-5, msg=f"{key}: {name}")


def test_ema_resume(tmp_path):
    """Save after fit returned at epoch 1, resume: the same EMA, raw weights and update count as not stopping."""
    full = _fit(3)
    _fit(1, save=tmp_path / "half.ckpt")
    ckpt = torch.load(tmp_path / "half.ckpt", weights_only=False)
    # state_dict is the average (for load_from_checkpoint), current_model_state the raw weights (for resume)
    assert not torch.allclose(ckpt["current_model_state"]["head.weight"], ckpt["state_dict"]["head.weight"])
    assert ckpt["callbacks"]["EMA"]["latest_update_step"] == 3 and ckpt["callbacks"]["EMA"]["decay"] == 0.8
    resumed = _fit(3, ckpt_path=tmp_path / "half.ckpt")
    _assert_same(full, resumed)
    assert int(full["averaging_state"]["n_averaged"]) == 9 + 3  # every step, and every epoch end
    reloaded = DemoClassifier.load_from_checkpoint(tmp_path / "half.ckpt")  # the EMA model
    torch.testing.assert_close(reloaded.head.weight, ckpt["state_dict"]["head.weight"])


def test_ema_resume_from_model_checkpoint(tmp_path):
    full = _fit(3)
    saver = ModelCheckpoint(dirpath=tmp_path, filename="e{epoch}", save_top_k=-1, every_n_epochs=1)
    _fit(3, callbacks=[saver], enable_checkpointing=True)
    resumed = _fit(3, ckpt_path=tmp_path / "eepoch=0.ckpt")
    _assert_same(full, resumed)


@pytest.mark.ddp
def test_ema_ddp(tmp_path):
    ema = EMA(decay=0.9)
    model = _model()
    trainer = quiet_trainer(
        max_steps=4,
        limit_val_batches=1,
        val_check_interval=2,
        devices=2,
        strategy="ddp_spawn",
        callbacks=[ema, _ReportRank(tmp_path)],
    )
    trainer.fit(model, _loader(64), _loader(32))
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for report in reports:
        assert report["n_averaged"] == 4 and report["model_is_average"]
    assert reports[0]["avg_checksum"] == pytest.approx(reports[1]["avg_checksum"], rel=1e-6)  # ranks agree
    # the main process gets rank 0's final weights: the average
    final = float(sum(p.detach().double().sum() for p in model.parameters()))
    assert final == pytest.approx(reports[0]["avg_checksum"])


class _ReportRank(L.Callback):
    def __init__(self, path: Any) -> None:
        self.path = path

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:  # after on_train_end: the model holds the average
        ckpt = _snapshot(trainer, pl_module, next(cb for cb in trainer.callbacks if isinstance(cb, EMA)))
        avg = ckpt["state_dict"]
        report = {
            "n_averaged": int(ckpt["averaging_state"]["n_averaged"]),
            "avg_checksum": float(
                sum(v.double().sum() for k, v in avg.items() if "running" not in k and "num_batches" not in k)
            ),
            "model_is_average": all(torch.equal(p, avg[n]) for n, p in pl_module.named_parameters()),
        }
        (self.path / f"rank{trainer.global_rank}.json").write_text(json.dumps(report))


class _Versioned(torch.nn.Module):
    """Refuses a state dict without its module version, as torchvision's MNASNet does."""

    _version = 2

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, *args, **kwargs):
        if local_metadata.get("version") not in (1, 2):
            raise RuntimeError(f"version should be set to 1 or 2 instead of {local_metadata.get('version')}")
        super()._load_from_state_dict(state_dict, prefix, local_metadata, *args, **kwargs)


class _VersionedModule(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = _Versioned()

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_ema_resume_keeps_module_versions(tmp_path):
    """Lightning rebuilds the average's state as a plain dict; a module that reads its version on load still resumes."""
    g = torch.Generator().manual_seed(0)
    loader = DataLoader(TensorDataset(torch.randn(16, 8, generator=g), torch.randint(0, 3, (16,), generator=g)), 8)

    def fit(epochs: int, **kw: Any) -> _VersionedModule:
        L.seed_everything(0, verbose=False)
        module = _VersionedModule()
        trainer = quiet_trainer(max_epochs=epochs, callbacks=[EMA(decay=0.8)])
        trainer.fit(module, loader, **kw)
        if epochs == 1:
            trainer.save_checkpoint(tmp_path / "half.ckpt")
        return module

    full = fit(2)
    fit(1)
    assert torch.load(tmp_path / "half.ckpt", weights_only=True)["state_dict"]._metadata["net"]["version"] == 2
    resumed = fit(2, ckpt_path=tmp_path / "half.ckpt")
    torch.testing.assert_close(resumed.net.fc.weight, full.net.fc.weight)
    fresh = _VersionedModule()
    fresh.load_state_dict(torch.load(tmp_path / "half.ckpt", weights_only=True)["state_dict"])


class _RebuiltBuffer(L.LightningModule):
    """A buffer the forward pass replaces by one sized for the input, as timm's ConViT does with ``rel_indices``
    (registered ``[1, 1, 1, 3]``, rebuilt ``[1, N, N, 3]`` on the first call)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(8, 3)
        self.register_buffer("table", torch.zeros(1, 1), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.table.shape[1] != x.shape[1]:
            self.table = torch.linspace(0, 1, x.shape[1]).unsqueeze(0)
        return self.fc(x * (1 + self.table))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.cross_entropy(self(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


class _Lazy(_RebuiltBuffer):
    """A lazy module: its weight is materialized by the first forward pass, after the average was copied."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.LazyLinear(3)


@pytest.mark.parametrize("module", [_RebuiltBuffer, _Lazy], ids=["rebuilt_buffer", "lazy_linear"])
def test_ema_follows_tensors_made_on_the_first_forward(module, tmp_path):
    """Before: the first update failed (``output with shape [1, 1] doesn't match the broadcast shape [1, 8]``, the
    sweep's timm_convit cell; ``Can't access the shape of an uninitialized parameter`` for a LazyLinear). The
    average takes the new tensor, and resume equals the uninterrupted run."""
    g = torch.Generator().manual_seed(0)
    loader = DataLoader(TensorDataset(torch.randn(32, 8, generator=g), torch.randint(0, 3, (32,), generator=g)), 8)

    def fit(epochs: int, **kw: Any) -> L.LightningModule:
        L.seed_everything(0, verbose=False)
        net = module()
        ema = EMA(decay=0.8)
        trainer = quiet_trainer(max_epochs=epochs, callbacks=[ema])
        trainer.fit(net, loader, **kw)
        average = averaged_model(ema).module
        assert average.table.shape == (1, 8) and average.fc.weight.shape == (3, 8)
        if epochs == 1:
            trainer.save_checkpoint(tmp_path / "half.ckpt")
        return net

    full = fit(2)
    fit(1)
    resumed = fit(2, ckpt_path=tmp_path / "half.ckpt")
    torch.testing.assert_close(resumed.fc.weight, full.fc.weight)
