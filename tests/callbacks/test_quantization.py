"""QuantizationAwareTraining and Float8Training callbacks."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_speedups._errors import SpeedupConfigError
from lightning_speedups.callbacks.quantization import Float8Training, QuantizationAwareTraining
from lightning_speedups.demo import DemoClassifier, DemoMLP, DigitsDataModule, load_digits_tensors
from lightning_speedups.functional import float8 as f8
from lightning_speedups.functional.quantization import qat_record
from tests.helpers import quiet_trainer

pytest.importorskip("torchao")


class _Digits(L.LightningDataModule):
    """64 digits, no shuffling and no augmentation: resumed runs see exactly the batches of uninterrupted ones."""

    def __init__(self) -> None:
        super().__init__()
        x, y = load_digits_tensors(32, 3)
        self.ds = TensorDataset((x[:64].float() / 255 - 0.21) / 0.34, y[:64])

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.ds, batch_size=32, shuffle=False)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.ds, batch_size=64, shuffle=False)

    def test_dataloader(self) -> DataLoader:
        return self.val_dataloader()


def test_qat_misconfiguration(monkeypatch):
    with pytest.raises(SpeedupConfigError, match="`start_epoch`=-1 is out of range. Allowed values: an integer >= 0"):
        QuantizationAwareTraining(start_epoch=-1)
    with pytest.raises(SpeedupConfigError, match="`freeze_bn_epoch`=1 is out of range.*an integer >= 2 or None"):
        QuantizationAwareTraining(start_epoch=2, freeze_bn_epoch=1)
    with pytest.raises(SpeedupConfigError, match="`weight_dtype`='int3' is not supported"):
        QuantizationAwareTraining(weight_dtype="int3")
    with pytest.raises(SpeedupConfigError, match="`activation_dtype`='fp8' is not supported"):
        QuantizationAwareTraining(activation_dtype="fp8")
    with pytest.raises(SpeedupConfigError, match="`layers`='lstm' is not supported"):
        QuantizationAwareTraining(layers=("lstm",))
    with pytest.raises(SpeedupConfigError, match="`layers`=\\(\\) is empty"):
        QuantizationAwareTraining(layers=())
    with pytest.raises(SpeedupConfigError, match="`backend`='tensorrt' is not supported"):
        QuantizationAwareTraining(backend="tensorrt")
    dm = _Digits()
    with pytest.raises(SpeedupConfigError, match="`start_epoch`=3 is not before `max_epochs`=2"):
        quiet_trainer(max_epochs=2, callbacks=[QuantizationAwareTraining(start_epoch=3)]).fit(
            DemoClassifier(width=8), dm
        )
    no_layers = QuantizationAwareTraining(layers=("linear",), exclude=("head",))
    with pytest.raises(SpeedupConfigError, match="has no layer eligible for QAT"):
        quiet_trainer(max_steps=1, callbacks=[no_layers]).fit(DemoClassifier(width=8), dm)
    model = DemoClassifier(width=8)
    model.example_input_array = None
    with pytest.raises(SpeedupConfigError, match="`convert_on_fit_end`=True needs `example_inputs`"):
        quiet_trainer(max_steps=1, callbacks=[QuantizationAwareTraining(convert_on_fit_end=True)]).fit(model, dm)
    monkeypatch.setitem(sys.modules, "torchao.quantization.qat", None)  # simulate torchao not installed
    with pytest.raises(ImportError, match=r"pip install 'lightning-speedups\[quantization\]'"):
        quiet_trainer(max_steps=1, callbacks=[QuantizationAwareTraining()]).fit(DemoClassifier(width=8), dm)


def test_qat_fit():
    """Fake quantization starts at `start_epoch`; BatchNorm running stats stop moving at `freeze_bn_epoch`."""
    seen: dict[int, bool] = {}
    stats: dict[int, torch.Tensor] = {}

    class Probe(Callback):
        def on_train_epoch_end(self, trainer, pl_module):
            seen[trainer.current_epoch] = qat_record(pl_module) is not None
            stats[trainer.current_epoch] = pl_module.backbone[0][1].running_mean.clone()

    model = DemoClassifier(width=8)
    qat = QuantizationAwareTraining(start_epoch=1, freeze_bn_epoch=2)
    trainer = quiet_trainer(max_epochs=3, limit_train_batches=2, limit_val_batches=1, callbacks=[qat, Probe()])
    head_before = model.head.weight.detach().clone()
    trainer.fit(model, DigitsDataModule(batch_size=32))
    assert seen == {0: False, 1: True, 2: True}
    assert set(qat.summary.converted) == {
        "backbone.0.0",
        "backbone.1.0",
        "backbone.3.0",
        "backbone.4.0",
        "backbone.6.0",
        "head",
    }
    assert not torch.equal(stats[0], stats[1])  # BN still learning in epoch 1
    torch.testing.assert_close(stats[1], stats[2])  # frozen in epoch 2
    assert not torch.equal(head_before, model.head.weight)  # the optimizer still updates the shared parameters
    assert trainer.callback_metrics["train_loss"].isfinite()


def _fit(ckpt_dir: Path, max_epochs: int, ckpt_path: str | None = None) -> DemoClassifier:
    L.seed_everything(0)
    model = DemoClassifier(width=8)
    ckpt = ModelCheckpoint(dirpath=ckpt_dir, save_top_k=-1, filename="{epoch}")
    trainer = quiet_trainer(
        max_epochs=max_epochs, enable_checkpointing=True, callbacks=[QuantizationAwareTraining(start_epoch=1), ckpt]
    )
    trainer.fit(model, _Digits(), ckpt_path=ckpt_path)
    return model


def test_qat_resume_and_load_from_checkpoint(tmp_path):
    full = _fit(tmp_path / "full", max_epochs=3)
    mid = tmp_path / "full" / "epoch=1.ckpt"  # saved after the first QAT epoch
    resumed = _fit(tmp_path / "resumed", max_epochs=3, ckpt_path=str(mid))
    assert qat_record(resumed) == qat_record(full)
    for (name, a), b in zip(full.state_dict().items(), resumed.state_dict().values()):
        torch.testing.assert_close(a, b, msg=name)

    loaded = DemoClassifier.load_from_checkpoint(tmp_path / "full" / "epoch=2.ckpt", strict=True)
    assert qat_record(loaded) == qat_record(full)  # fake quantizers rebuilt before the strict load
    x = torch.randn(4, 3, 32, 32)
    torch.testing.assert_close(loaded.eval()(x), full.eval()(x))
    plain = DemoClassifier(width=8)
    plain.load_state_dict(full.state_dict())
    assert not torch.allclose(plain.eval()(x), full(x))  # without the record the outputs would differ


def test_qat_test_best_checkpoint_and_second_fit(tmp_path):
    model = DemoClassifier(width=8)
    qat = QuantizationAwareTraining()
    ckpt = ModelCheckpoint(dirpath=tmp_path, monitor="val_loss")
    trainer = quiet_trainer(max_epochs=2, limit_train_batches=2, enable_checkpointing=True, callbacks=[qat, ckpt])
    dm = _Digits()
    trainer.fit(model, dm)
    results = trainer.test(model, dm, ckpt_path="best", verbose=False)
    assert 0.0 <= results[0]["test_acc"] <= 1.0
    n_layers = len(qat_record(model)["layers"])
    trainer2 = quiet_trainer(max_epochs=1, limit_train_batches=2, limit_val_batches=1, callbacks=[qat])
    trainer2.fit(model, dm)
    assert len(qat_record(model)["layers"]) == n_layers == 6  # not wrapped twice
    assert trainer2.callback_metrics["train_loss"].isfinite()


def test_qat_convert_on_fit_end():
    model = DemoMLP(hidden=(64,))
    qat = QuantizationAwareTraining(
        convert_on_fit_end=True, backend="eager_dynamic", example_inputs=torch.randn(16, 3, 32, 32)
    )
    quiet_trainer(max_steps=2, limit_val_batches=1, callbacks=[qat]).fit(model, _Digits())
    assert qat.report is not None and qat.report.candidates["eager_dynamic"]["status"] == "ok"
    assert qat.quantized_model is not None
    assert qat_record(model) is not None  # the LightningModule itself keeps its fake quantizers


class _SaveState(Callback):
    def __init__(self, out: Path) -> None:
        self.out = out

    def on_fit_end(self, trainer, pl_module):
        params = {n: p.detach().clone() for n, p in pl_module.named_parameters()}
        torch.save({"params": params, "qat": qat_record(pl_module)}, self.out / f"rank{trainer.global_rank}.pt")


@pytest.mark.ddp
def test_qat_ddp_ranks_identical(tmp_path):
    model = DemoClassifier(width=8)
    init = {n: p.detach().clone() for n, p in model.named_parameters()}
    trainer = quiet_trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp_spawn",
        max_steps=3,
        limit_val_batches=0,
        callbacks=[QuantizationAwareTraining(), _SaveState(tmp_path)],
    )
    trainer.fit(model, DigitsDataModule(batch_size=16, augment=False))
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1))
    assert r0["qat"] is not None and r0["qat"] == r1["qat"]
    for name in init:  # parameters identical across ranks (BN running stats are per-rank without SyncBatchNorm)
        torch.testing.assert_close(r0["params"][name], r1["params"][name], msg=name)
    assert not torch.equal(r0["params"]["head.weight"], init["head.weight"])  # and they were trained


# ------------------------------------------------------------------------------------------------------- float8
def test_float8_misconfiguration(monkeypatch):
    with pytest.raises(SpeedupConfigError, match="`recipe`='delayed' is not supported"):
        Float8Training(recipe="delayed")
    with pytest.raises(SpeedupConfigError, match="`min_features`=8 is out of range"):
        Float8Training(min_features=8)
    with pytest.raises(SpeedupConfigError, match="`filter_fn`=3 is not callable"):
        Float8Training(filter_fn=3)
    monkeypatch.setattr(f8, "_cuda_capability", lambda: None)
    with pytest.raises(SpeedupConfigError, match="compute capability >= 8.9, but no CUDA GPU is available"):
        quiet_trainer(max_steps=1, callbacks=[Float8Training()]).fit(DemoMLP(hidden=(1024,)), _Digits())
    monkeypatch.setattr(f8, "_cuda_capability", lambda: (8, 0))
    with pytest.raises(SpeedupConfigError, match="this GPU has 8.0"):
        Float8Training().setup(SimpleNamespace(), DemoMLP(hidden=(1024,)), "fit")
    monkeypatch.setattr(f8, "_cuda_capability", lambda: (9, 0))
    with pytest.raises(SpeedupConfigError, match="has no nn.Linear eligible for float8"):
        Float8Training().setup(SimpleNamespace(), DemoMLP(hidden=(64,)), "fit")


def test_float8_skip_if_unsupported(monkeypatch):
    monkeypatch.setattr(f8, "_cuda_capability", lambda: None)
    cb = Float8Training(skip_if_unsupported=True)
    model = DemoMLP(hidden=(1024,))
    with pytest.warns(UserWarning, match="Float8Training skipped: float8 training needs a CUDA GPU"):
        quiet_trainer(max_steps=1, limit_val_batches=1, callbacks=[cb]).fit(model, _Digits())
    assert cb.summary is None and "no CUDA GPU" in cb.skipped_reason
    assert type(model.backbone[1]) is nn.Linear


def test_float8_conversion_with_mocked_capability(monkeypatch):
    """On CPU the conversion itself runs (torchao builds Float8Linear); only the float8 matmuls need the GPU."""
    from torchao.float8.float8_linear import Float8Linear

    monkeypatch.setattr(f8, "_cuda_capability", lambda: (9, 0))
    model = DemoMLP(hidden=(1024, 1024, 32))
    params = {id(p) for p in model.parameters()}
    cb = Float8Training(exclude=("backbone.3",))
    cb.setup(SimpleNamespace(), model, "fit")
    assert cb.summary.converted == ["backbone.1"]
    assert cb.summary.skipped == {
        "backbone.3": "excluded",
        "backbone.5": "dims 1024x32 below min_features=1024",
        "head": "dims 32x10 not divisible by 16",
    }
    assert isinstance(model.backbone[1], Float8Linear) and type(model.backbone[3]) is nn.Linear
    assert {id(p) for p in model.parameters()} == params  # same Parameters: the optimizer built later sees them
    cb.setup(SimpleNamespace(), model, "fit")  # a second fit does not convert twice
    assert cb.summary.converted == ["backbone.1"]


@pytest.mark.requires_sm89
def test_float8_fit_cuda():
    from torchao.float8.float8_linear import Float8Linear

    model = DemoMLP(hidden=(1024, 1024))
    cb = Float8Training()
    trainer = quiet_trainer(
        accelerator="cuda", max_steps=3, limit_val_batches=1, precision="bf16-mixed", callbacks=[cb]
    )
    trainer.fit(model, _Digits())
    assert isinstance(model.backbone[3], Float8Linear)
    assert trainer.callback_metrics["train_loss"].isfinite()


def test_qat_prepared_model_with_model_summary_fits_again():
    """A QAT-prepared model goes through Lightning's model summary (FLOP counting under no_grad) in a later fit."""
    pytest.importorskip("torchao")
    kw = dict(
        limit_train_batches=2,
        limit_val_batches=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=True,
        max_epochs=1,
    )
    model = DemoClassifier(width=8)
    L.Trainer(callbacks=[QuantizationAwareTraining(start_epoch=0)], **kw).fit(model, DigitsDataModule(batch_size=16))
    trainer = L.Trainer(**kw)
    trainer.fit(model, DigitsDataModule(batch_size=16))
    assert trainer.global_step == 2


def test_qat_convert_on_fit_end_needs_a_heldout_half():
    model = DemoClassifier(width=4)
    model.example_input_array = torch.zeros(1, 3, 32, 32)
    cb = QuantizationAwareTraining(convert_on_fit_end=True)
    with pytest.raises(SpeedupConfigError, match="has 1 sample\\(s\\).*at least 2 samples"):
        quiet_trainer(max_steps=1, callbacks=[cb]).fit(
            model,
            torch.utils.data.DataLoader(
                torch.utils.data.TensorDataset(torch.randn(4, 3, 32, 32), torch.randint(0, 10, (4,))), batch_size=2
            ),
        )
