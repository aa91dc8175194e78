"""TokenThroughput: tokens/s, padded tokens/s, pad fraction and MFU of a tiny token model, on a mocked clock."""

from __future__ import annotations

from typing import Any

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import lightning_speedups.callbacks.token_throughput as tt_mod
from lightning_speedups._errors import SpeedupConfigError
from lightning_speedups._peak import PeakEstimate
from lightning_speedups._registry import get_technique
from lightning_speedups.callbacks.token_throughput import TokenThroughput
from lightning_speedups.data import pad_collate
from lightning_speedups.demo import DemoClassifier
from tests.helpers import quiet_trainer


class FakeClock:
    """Time advances only when the model says so: rates become exact and load-independent."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class TinyLM(L.LightningModule):
    """Embedding + linear head; a training step 'costs' ``per_step`` s and a validation step ``per_val`` s."""

    def __init__(self, clock: FakeClock | None = None, per_step: float = 0.5, per_val: float = 0.0) -> None:
        super().__init__()
        self.emb = nn.Embedding(32, 8)
        self.head = nn.Linear(8, 32)
        self.clock = clock
        self.per_step = per_step
        self.per_val = per_val

    def _loss(self, batch: Any) -> torch.Tensor:
        logits = self.head(self.emb(batch["input_ids"]))
        return F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(), ignore_index=-100)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        if self.clock is not None:
            self.clock.t += self.per_step
        return self._loss(batch)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        if self.clock is not None:
            self.clock.t += self.per_val
        self.log("val_loss", self._loss(batch))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _samples(n: int = 8) -> list[dict[str, torch.Tensor]]:
    # lengths 3, 5, 3, 5, ...: every batch of two pads 3 + 5 real tokens to 2 x 5 positions (pad fraction 0.2)
    out = []
    for i in range(n):
        ids = torch.arange(1, 4 if i % 2 == 0 else 6)
        out.append({"input_ids": ids, "labels": ids.clone()})
    return out


def _loader(n: int = 8) -> DataLoader:
    return DataLoader(_samples(n), batch_size=2, collate_fn=pad_collate(multiple_of=1))


def _fake_peak(flops: float | None) -> Any:
    est = PeakEstimate(
        flops,
        "fp32",
        "cpu",
        isa="AVX2+FMA",
        flop_per_cycle_per_core=32.0,
        cores=1,
        ghz=1.0,
        estimate=flops is not None,
        reason="" if flops else "no table",
    )
    return lambda device, dtype: est


def test_token_throughput_misconfiguration():
    with pytest.raises(SpeedupConfigError, match=r"`window_size`=1 is out of range. Allowed values: an integer >= 2"):
        TokenThroughput(window_size=1)
    with pytest.raises(SpeedupConfigError, match=r"`pad_value`=.0. is not an integer \(a str\)\. Allowed"):
        TokenThroughput(pad_value="0")  # type: ignore[arg-type]
    with pytest.raises(SpeedupConfigError, match=r"`ignore_index`=None is not an integer"):
        TokenThroughput(ignore_index=None)  # type: ignore[arg-type]
    with pytest.raises(SpeedupConfigError, match=r"`batch_to_tokens`=3 is not callable. Allowed values: a callable"):
        TokenThroughput(batch_to_tokens=3)  # type: ignore[arg-type]
    with pytest.raises(SpeedupConfigError, match=r"`flops_per_token`=-1 is out of range. Allowed values: a positive"):
        TokenThroughput(flops_per_token=-1)
    with pytest.raises(SpeedupConfigError, match=r"`log_mfu`='yes' is not supported. Allowed values: True, False"):
        TokenThroughput(log_mfu="yes")  # type: ignore[arg-type]
    with pytest.raises(SpeedupConfigError, match=r"`prog_bar`=1 is not supported"):
        TokenThroughput(prog_bar=1)  # type: ignore[arg-type]


def test_token_throughput_fit_logs_exact_values(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(tt_mod, "_now", clock)
    monkeypatch.setattr(tt_mod, "device_peak_flops", _fake_peak(1e6))
    model = TinyLM(clock, per_step=0.5)
    params = sum(p.numel() for p in model.parameters())
    cb = TokenThroughput(window_size=3)
    trainer = quiet_trainer(max_steps=4, callbacks=[cb], log_every_n_steps=1)
    trainer.fit(model, train_dataloaders=_loader())
    # 8 real and 10 padded tokens per 0.5 s step
    expected = {
        "tokens_per_sec": 16.0,
        "padded_tokens_per_sec": 20.0,
        "pad_fraction": 0.2,
        "mfu": 6 * params * 16.0 / 1e6,
    }
    for name, value in expected.items():
        assert cb.metrics[name] == pytest.approx(value, rel=1e-12)
        assert float(trainer.callback_metrics[f"train/{name}"]) == pytest.approx(value, rel=1e-6)
    assert cb.last_count is not None and cb.last_count.source == "attention_mask"
    assert cb.peak is not None and cb.peak.estimate  # on a CPU the peak is an estimate


def test_token_throughput_pad_fraction_exact_and_validation_left_out(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(tt_mod, "_now", clock)
    monkeypatch.setattr(tt_mod, "device_peak_flops", _fake_peak(None))
    # validation 'costs' 10 s per batch: paused, so the training rates across the epoch boundary stay exact
    model = TinyLM(clock, per_step=0.25, per_val=10.0)
    cb = TokenThroughput(window_size=4)
    logged: list[dict[str, float]] = []

    class Probe(L.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            logged.append(dict(cb.metrics))

    trainer = quiet_trainer(max_steps=8, callbacks=[cb, Probe()], limit_val_batches=1, log_every_n_steps=1)
    trainer.fit(model, train_dataloaders=_loader(), val_dataloaders=_loader(2))
    assert trainer.current_epoch >= 1  # crossed an epoch end with a validation run
    assert logged[0] == {}  # the first batch end starts the clock
    for m in logged[1:]:
        assert m["tokens_per_sec"] == 32.0 and m["padded_tokens_per_sec"] == 40.0
        assert m["pad_fraction"] == pytest.approx(0.2, abs=1e-15)
        assert "mfu" not in m  # peak unknown: not logged


def test_token_throughput_batch_to_tokens_and_flops_per_token(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(tt_mod, "_now", clock)
    monkeypatch.setattr(tt_mod, "device_peak_flops", _fake_peak(1e3))
    cb = TokenThroughput(batch_to_tokens=lambda batch: (6, 10), flops_per_token=2.0)
    trainer = quiet_trainer(max_steps=3, callbacks=[cb])
    trainer.fit(TinyLM(clock, per_step=1.0), train_dataloaders=_loader())
    assert cb.metrics == pytest.approx(
        {"tokens_per_sec": 6.0, "padded_tokens_per_sec": 10.0, "pad_fraction": 0.4, "mfu": 2.0 * 6.0 / 1e3}
    )


def test_token_throughput_non_token_data_warns_and_trains():
    images = TensorDataset(torch.randn(16, 3, 32, 32), torch.randint(0, 10, (16,)))
    cb = TokenThroughput()
    trainer = quiet_trainer(max_steps=3, callbacks=[cb])
    with pytest.warns(UserWarning, match="holds no integer \\(batch, length\\) token tensor"):
        trainer.fit(DemoClassifier(width=8), train_dataloaders=DataLoader(images, batch_size=4))
    assert trainer.global_step == 3 and not cb.active and cb.metrics == {}
    assert not any(k.startswith("train/") for k in trainer.callback_metrics)


def test_token_throughput_failing_batch_to_tokens_never_breaks_training():
    def broken(batch: Any) -> int:
        raise KeyError("input_ids")

    cb = TokenThroughput(batch_to_tokens=broken)
    trainer = quiet_trainer(max_steps=2, callbacks=[cb])
    with pytest.warns(UserWarning, match="counting the batch's tokens failed \\(KeyError"):
        trainer.fit(TinyLM(), train_dataloaders=_loader())
    assert trainer.global_step == 2 and not cb.active


def test_token_throughput_resume(monkeypatch, tmp_path):
    """No state to restore: a resumed fit measures again from its own second batch, with the same rates."""
    clock = FakeClock()
    monkeypatch.setattr(tt_mod, "_now", clock)
    monkeypatch.setattr(tt_mod, "device_peak_flops", _fake_peak(1e6))
    trainer = quiet_trainer(max_steps=2, callbacks=[TokenThroughput(window_size=2)])
    trainer.fit(TinyLM(clock, per_step=0.5), train_dataloaders=_loader())
    trainer.save_checkpoint(tmp_path / "a.ckpt")
    cb = TokenThroughput(window_size=2)
    resumed = quiet_trainer(max_steps=5, callbacks=[cb])
    resumed.fit(TinyLM(clock, per_step=0.5), train_dataloaders=_loader(), ckpt_path=tmp_path / "a.ckpt")
    assert resumed.global_step == 5 and cb.metrics["tokens_per_sec"] == 16.0
    assert cb.metrics["pad_fraction"] == pytest.approx(0.2, abs=1e-15)
    assert TokenThroughput().state_dict() == {}


def test_token_throughput_registered():
    info = get_technique("token_throughput")
    assert info.callback is TokenThroughput and info.ways == (6, 7)
