"""ChannelsLastTrial: channels_last timed against NCHW on the fit's own steps, on a fake clock the steps advance."""

from __future__ import annotations

import copy
import json
from typing import Any

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import Callback
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import lightning_speedups.callbacks.precision_trial as pt
from lightning_speedups._errors import SpeedupConfigError
from lightning_speedups.callbacks.channels_last_trial import NCHW, NHWC, ChannelsLastTrial
from lightning_speedups.callbacks.precision_trial import BF16, PrecisionTrial
from lightning_speedups.functional.channels_last import is_channels_last
from tests.helpers import quiet_trainer

_NOW = {"t": 0.0}


def fake_clock() -> float:
    return _NOW["t"]


class Conv(L.LightningModule):
    """A small conv classifier whose steps cost ``nchw_cost`` or ``nhwc_cost`` fake seconds by the layout of the
    weights and input it sees (times ``bf16_factor`` under bf16 autocast), and record the layout and autocast."""

    def __init__(self, nhwc_cost: float = 0.5, nchw_cost: float = 1.0, bf16_factor: float = 1.0) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1),
            nn.BatchNorm2d(8),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(8, 2),
        )
        self.nhwc_cost = nhwc_cost
        self.nchw_cost = nchw_cost
        self.bf16_factor = bf16_factor
        self.train_layout: list[bool] = []
        self.train_autocast: list[bool] = []
        self.val_layout: list[bool] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        nhwc = is_channels_last(x) and is_channels_last(self.net[0].weight)
        assert nhwc or (x.is_contiguous() and self.net[0].weight.is_contiguous()), "mixed layouts in one step"
        (self.train_layout if self.training else self.val_layout).append(nhwc)
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.cross_entropy(self(x), y)
        bf16 = torch.is_autocast_enabled("cpu")
        self.train_autocast.append(bf16)
        cost = self.nhwc_cost if self.train_layout[-1] else self.nchw_cost
        _NOW["t"] += cost * (self.bf16_factor if bf16 else 1.0)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self(batch[0])

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=1e-2)


def _loader(n: int = 64) -> DataLoader:
    g = torch.Generator().manual_seed(0)
    return DataLoader(TensorDataset(torch.randn(n, 3, 8, 8, generator=g), torch.randint(0, 2, (n,), generator=g)), 4)


def _fit(
    model: L.LightningModule, callbacks: list[Callback], max_steps: int, ckpt_path: str | None = None, **kwargs: Any
) -> L.Trainer:
    trainer = quiet_trainer(max_steps=max_steps, callbacks=callbacks, limit_val_batches=1, **kwargs)
    trainer.fit(model, _loader(), _loader(8), ckpt_path=ckpt_path)
    return trainer


def test_channels_last_trial_misconfiguration():
    with pytest.raises(SpeedupConfigError, match=r"`margin`=-0\.1"):
        ChannelsLastTrial(margin=-0.1)
    with pytest.raises(SpeedupConfigError, match=r"`max_rounds`=2"):
        ChannelsLastTrial(max_rounds=2)
    with pytest.raises(SpeedupConfigError, match=r"`max_cost`=0"):
        ChannelsLastTrial(max_cost=0.0)


def test_channels_last_trial_keeps_a_faster_layout():
    decisions: list[tuple[str | None, int]] = []
    model = Conv(nhwc_cost=0.5)
    trial = ChannelsLastTrial(clock=fake_clock, on_decision=lambda t: decisions.append((t.kept, t.rounds)))
    trainer = _fit(model, [trial], 20)
    assert trial.kept == NHWC and trial.rounds == 3 and trial.ratio[1] == pytest.approx(2.0)
    assert decisions == [(NHWC, 3)] and "kept channels_last: 2.00x faster" in trial.note
    # untimed NCHW and NHWC steps, then 3 rounds in alternating order, then channels_last for the rest of the fit
    assert model.train_layout[:8] == [False, True, False, True, True, False, False, True]
    assert all(model.train_layout[8:]) and len(model.train_layout) == 20
    assert model.val_layout and all(model.val_layout)
    # the optimizer's moments follow the weights' layout, so its kernels read matching strides
    state = trainer.optimizers[0].state[model.net[0].weight]
    assert is_channels_last(state["exp_avg"]) and is_channels_last(state["exp_avg_sq"])


class _SgdConv(Conv):
    def configure_optimizers(self) -> torch.optim.Optimizer:  # Adam's g / sqrt(v) would magnify rounding
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)


def test_channels_last_trial_trains_the_same_model_as_the_plain_fit():
    torch.manual_seed(0)
    plain = _SgdConv(nhwc_cost=0.5)
    tried = copy.deepcopy(plain)
    _fit(plain, [], 12)
    _fit(tried, [ChannelsLastTrial(clock=fake_clock)], 12)
    for a, b in zip(plain.parameters(), tried.parameters()):  # the layout changes no value: both train alike
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_channels_last_trial_keeps_nchw_when_no_faster():
    model = Conv(nhwc_cost=1.0)
    trial = ChannelsLastTrial(clock=fake_clock)
    _fit(model, [trial], 16)
    assert trial.kept == NCHW and trial.rounds == 3 and "not 1.05x beyond noise" in trial.note
    assert not any(model.train_layout[8:]) and not any(model.val_layout)
    assert model.net[0].weight.is_contiguous()  # back in NCHW after its last channels_last step


def test_channels_last_trial_says_so_when_the_fit_ends_before_it_decides():
    model = Conv(nhwc_cost=1.0)
    trial = ChannelsLastTrial(clock=fake_clock)
    _fit(model, [trial], 5)  # two untimed steps and a round and a half
    assert trial.kept is None
    assert trial.note == "undecided: the fit ended after 1 of at most 12 rounds; a resumed fit goes on with them"


def test_channels_last_trial_stops_a_slow_layout_within_its_cost():
    model = Conv(nhwc_cost=10.0)
    trial = ChannelsLastTrial(max_cost=0.02, clock=fake_clock)
    _fit(model, [trial], 100)
    assert trial.kept == NCHW and trial.rounds == 1 and "`max_cost`=0.02" in trial.note
    assert sum(model.train_layout) == 2


def test_channels_last_trial_times_nchw_on_a_model_already_in_channels_last():
    from lightning_speedups.functional.channels_last import apply_channels_last

    model = Conv(nhwc_cost=1.0)
    trial = ChannelsLastTrial(clock=fake_clock)
    apply_channels_last(model)  # the user converted it before the fit: the NCHW steps must still be NCHW
    _fit(model, [trial], 16)
    assert model.train_layout[:8] == [False, True, False, True, True, False, False, True]
    assert trial.kept == NCHW and model.net[0].weight.is_contiguous()


def test_channels_last_trial_spends_no_step_on_a_model_without_conv():
    class Dense(Conv):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, 2))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.train_layout.append(is_channels_last(x) and not x.is_contiguous())
            return self.net(x)

    model = Dense()
    trial = ChannelsLastTrial(clock=fake_clock)
    _fit(model, [trial], 6)
    assert trial.kept == NCHW and trial.rounds == 0 and "no 2-D convolution" in trial.note
    assert not any(model.train_layout)


def test_channels_last_trial_waits_for_the_precision_trial(monkeypatch):
    monkeypatch.setattr(pt, "cpu_bf16_units", lambda: "AVX512-BF16")
    model = Conv(nhwc_cost=0.5, bf16_factor=0.5)
    precision = PrecisionTrial(clock=fake_clock)
    layout = ChannelsLastTrial(clock=fake_clock)
    _fit(model, [precision, layout], 24)
    assert precision.kept == BF16 and layout.kept == NHWC
    # 8 steps of the precision trial in NCHW, then the layout trial's 8 steps all under the kept bf16
    assert not any(model.train_layout[:8]) and all(model.train_autocast[8:])
    assert model.train_layout[8:16] == [False, True, False, True, True, False, False, True]


def test_channels_last_trial_resume(tmp_path):
    full_model = Conv()
    full = ChannelsLastTrial(clock=fake_clock)
    _fit(full_model, [full], 12)
    half_model = Conv()
    half = ChannelsLastTrial(clock=fake_clock)
    trainer = _fit(half_model, [half], 6)  # two untimed steps and two rounds: mid-trial
    trainer.save_checkpoint(tmp_path / "mid.ckpt")
    saved = torch.load(tmp_path / "mid.ckpt", weights_only=True)  # plain data, NCHW weights
    assert next(iter(saved["callbacks"].values()))["kept"] is None and half.rounds == 2
    assert all(t.is_contiguous() for t in saved["state_dict"].values())
    model = Conv()
    resumed = ChannelsLastTrial(clock=fake_clock)
    trainer = _fit(model, [resumed], 12, ckpt_path=str(tmp_path / "mid.ckpt"))
    assert resumed.kept == full.kept == NHWC and resumed.rounds == full.rounds == 3
    assert model.train_layout == [False, True, False, True, True, True]
    trainer.save_checkpoint(tmp_path / "done.ckpt")
    told: list[ChannelsLastTrial] = []
    model = Conv()
    after = ChannelsLastTrial(clock=fake_clock, on_decision=told.append)
    trainer = _fit(model, [after], 16, ckpt_path=str(tmp_path / "done.ckpt"))
    assert after.kept == NHWC and all(model.train_layout) and told == []  # the decision holds, told once only
    state = trainer.optimizers[0].state[model.net[0].weight]  # the restored moments follow the restored layout
    assert is_channels_last(state["exp_avg"])
    fresh = Conv()  # the checkpoint loads into a plain model
    fresh.load_state_dict(torch.load(tmp_path / "done.ckpt", weights_only=True)["state_dict"])


class _RankConv(Conv):
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        # channels_last faster on rank 0 and slower on rank 1: rank 0 must decide for both
        self.nhwc_cost = 0.5 if self.global_rank == 0 else 2.0
        return super().training_step(batch, batch_idx)


class _Report(Callback):
    def __init__(self, path: Any) -> None:
        self.path = path

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        trial = next(c for c in trainer.callbacks if isinstance(c, ChannelsLastTrial))
        report = {"kept": trial.kept, "layout": pl_module.train_layout}
        (self.path / f"rank{trainer.global_rank}.json").write_text(json.dumps(report))


@pytest.mark.ddp
def test_channels_last_trial_ddp(tmp_path):
    trainer = quiet_trainer(
        max_steps=12,
        limit_val_batches=0,
        devices=2,
        strategy="ddp_spawn",
        callbacks=[ChannelsLastTrial(clock=fake_clock), _Report(tmp_path)],
    )
    trainer.fit(_RankConv(), _loader())
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert [r["kept"] for r in reports] == [NHWC, NHWC]
    assert reports[0]["layout"] == reports[1]["layout"] and all(reports[0]["layout"][8:])


def test_a_resumed_channels_last_fit_gives_the_optimizer_state_the_weights_layout(tmp_path):
    # fused AdamW on CPU reads a state whose strides differ from its parameter's wrongly: a checkpoint of an NCHW run
    # resumed under ChannelsLast must not train on scrambled moments
    from lightning_speedups.callbacks.channels_last import ChannelsLast

    class Fused(Conv):
        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.AdamW(self.parameters(), lr=1e-2, fused=True)

    torch.manual_seed(0)
    trainer = _fit(Fused(), [], 4)
    trainer.save_checkpoint(tmp_path / "nchw.ckpt")
    model = Fused()
    trainer = _fit(model, [ChannelsLast()], 6, ckpt_path=str(tmp_path / "nchw.ckpt"))
    state = trainer.optimizers[0].state[model.net[0].weight]
    assert is_channels_last(model.net[0].weight) and is_channels_last(state["exp_avg"])
