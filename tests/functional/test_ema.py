from __future__ import annotations

import pickle

import pytest
import torch
from torch import nn

from lightning_speedups._errors import SpeedupConfigError
from lightning_speedups.demo import DemoClassifier
from lightning_speedups.functional.ema import EMAUpdate, create_ema_model, ema_decay, swap_ema_weights


def test_ema_functional():
    torch.manual_seed(0)
    net = nn.Linear(3, 2)
    ema = create_ema_model(net, decay=0.5, warmup=False)
    history = []
    for _ in range(4):
        with torch.no_grad():
            net.weight.add_(torch.randn_like(net.weight))
        ema.update_parameters(net)
        history.append(net.weight.detach().clone())
    expected = history[0]
    for w in history[1:]:
        expected = 0.5 * expected + 0.5 * w
    torch.testing.assert_close(ema.module.weight, expected)
    assert int(ema.n_averaged) == 4


def test_ema_warmup_decay_follows_num_updates():
    assert [ema_decay(n, 0.99) for n in (0, 1, 10)] == pytest.approx([0.1, 2 / 11, 11 / 20])
    assert ema_decay(10_000, 0.99) == 0.99 and ema_decay(3, 0.99, warmup=False) == 0.99
    net = nn.Linear(2, 1, bias=False)
    ema = create_ema_model(net, decay=0.99, warmup=True)
    with torch.no_grad():
        net.weight.zero_()
        ema.update_parameters(net)  # n = 0: copy
        net.weight.fill_(1.0)
        ema.update_parameters(net)  # n = 1: decay 2/11
    torch.testing.assert_close(ema.module.weight, torch.full_like(net.weight, 1 - 2 / 11))


def test_ema_buffers_averaged():
    model = DemoClassifier(width=4)
    ema = create_ema_model(model, decay=0.5, warmup=False)
    bn = model.backbone[0][1]
    ema.update_parameters(model)
    with torch.no_grad():
        bn.running_mean.fill_(2.0)
    ema.update_parameters(model)
    torch.testing.assert_close(ema.module.backbone[0][1].running_mean, torch.full_like(bn.running_mean, 1.0))


def test_ema_update_pickles_and_swap_restores():
    update = pickle.loads(pickle.dumps(EMAUpdate(0.9, warmup=False)))  # ddp_spawn pickles the callback
    assert (update.decay, update.warmup) == (0.9, False)
    net = nn.Linear(2, 2)
    ema = create_ema_model(net, decay=0.9)
    ema.update_parameters(net)
    with torch.no_grad():
        ema.module.weight.fill_(3.0)
    raw = net.weight.detach().clone()
    with swap_ema_weights(net, ema) as swapped:
        assert swapped is net and torch.all(net.weight == 3.0)
    torch.testing.assert_close(net.weight, raw)
    assert torch.all(ema.module.weight == 3.0)


def test_ema_functional_misconfiguration():
    with pytest.raises(SpeedupConfigError, match=r"`decay`=1.0 is out of range.*a number in \[0.0, 1.0\)"):
        create_ema_model(nn.Linear(1, 1), decay=1.0)
    with pytest.raises(SpeedupConfigError, match=r"`warmup`='yes' is not supported. Allowed values: True, False"):
        EMAUpdate(0.9, warmup="yes")  # type: ignore[arg-type]


def test_create_ema_model_follows_a_lazy_module_materialized_after_the_copy():
    net = nn.Sequential(nn.LazyLinear(3))
    ema = create_ema_model(net, decay=0.5, warmup=False)  # copied while the weight is still uninitialized
    net(torch.randn(4, 5))  # the first forward pass materializes it
    with torch.no_grad():
        ema.update_parameters(net)  # first update: a copy
        net[0].weight.add_(1.0)
        ema.update_parameters(net)
    torch.testing.assert_close(ema.module[0].weight, net[0].weight - 0.5)


def test_a_buffer_holding_infinities_is_copied_not_averaged_into_nan():
    """A lerp between two infinities is NaN: averaged, the clip bounds would make every output NaN."""
    from tools.arch_sweep_models import ClippedLinear  # the sweep's stand-in of Gemma 4's clipped linear

    net = ClippedLinear(3, 3)
    ema = create_ema_model(net, decay=0.5, warmup=False)
    for _ in range(3):
        with torch.no_grad():
            net.weight.add_(1.0)
        ema.update_parameters(net)
    assert ema.module.input_min.item() == -float("inf") and ema.module.input_max.item() == float("inf")
    torch.testing.assert_close(ema.module.weight, net.weight - 0.75)  # the weights are still averaged: 1/2 + 1/4
    assert torch.isfinite(ema.module(torch.randn(2, 3))).all()
    clone = pickle.loads(pickle.dumps(ema.multi_avg_fn))  # ddp_spawn: the per-tensor record starts afresh
    assert clone._copied == {} and (clone.decay, clone.warmup) == (0.5, False)
