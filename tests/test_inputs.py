"""The one way to run a model on an example input (``lightning_speedups._inputs``): the call rule and the modes."""

from __future__ import annotations

from collections import UserDict

import pytest
import torch
from torch import nn

from lightning_speedups._heads import CONV_LINEAR, is_conv_or_linear
from lightning_speedups._inputs import (
    call_model,
    eval_mode,
    example_from_batch,
    failing_module,
    forward_error,
    train_mode,
)


class _Args(nn.Module):
    def forward(self, *args: object, **kwargs: object) -> tuple[tuple[object, ...], dict[str, object]]:
        return args, kwargs


def test_call_model_mapping_kwargs_tuple_args_anything_else_one_argument():
    x = torch.zeros(2)
    y = torch.ones(2)
    model = _Args()
    assert call_model(model, {"a": x}) == ((), {"a": x})
    assert call_model(model, UserDict(a=x)) == ((), {"a": x})  # a Mapping that is no dict (HF BatchEncoding)
    assert call_model(model, (x, y)) == ((x, y), {})
    args, kwargs = call_model(model, [x, y])  # a list is one argument (a detection model's list of images)
    assert len(args) == 1 and args[0] == [x, y] and kwargs == {}
    assert call_model(model, x)[0] == (x,)


def test_forward_error_and_example_from_batch_use_the_same_rule():
    linear = nn.Linear(3, 1)
    assert forward_error(linear, (torch.zeros(2, 3),)) is None
    assert forward_error(linear, [torch.zeros(2, 3), torch.zeros(2, 3)]) is not None  # a list: one argument
    assert example_from_batch(linear, [torch.zeros(8, 3), torch.zeros(8)]).shape == (2, 3)


def test_train_mode_puts_back_buffers_rng_and_flags():
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Dropout(0.5))
    model.eval()
    model[2].train()  # a per-module flag that model.train() would not restore
    before = {k: v.clone() for k, v in model.state_dict().items()}
    torch.manual_seed(0)
    expected = torch.rand(1)
    torch.manual_seed(0)
    with train_mode(model):
        assert all(m.training for m in model.modules())
        model(torch.randn(8, 4))  # moves the BatchNorm statistics and draws dropout masks
    assert torch.equal(torch.rand(1), expected), "the RNG state was not put back"
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items()), "buffers were not put back"
    assert [m.training for m in model.modules()] == [False, False, False, True]


def test_eval_mode_restores_each_flag_even_on_error():
    model = nn.Sequential(nn.Linear(2, 2), nn.Dropout())
    model[1].eval()
    with pytest.raises(RuntimeError), eval_mode(model):
        assert not any(m.training for m in model.modules())
        raise RuntimeError("inside")
    assert [m.training for m in model.modules()] == [True, True, False]


def test_conv_linear_is_the_one_layer_definition():
    assert set(CONV_LINEAR) == {nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.Linear}
    assert is_conv_or_linear(nn.Conv3d(1, 1, 1)) and is_conv_or_linear(nn.Linear(1, 1))
    assert not is_conv_or_linear(nn.ConvTranspose2d(1, 1, 1)) and not is_conv_or_linear(nn.LayerNorm(2))


class _Blocks(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Linear(3, 4)
        self.blocks = nn.Sequential(nn.Sequential(nn.ReLU(), nn.Linear(5, 2)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks[0].forward(self.stem(x))  # forward called directly: no module hook would see it


def _raised(fn: object, *args: object) -> BaseException:
    try:
        fn(*args)  # type: ignore[operator]
    except Exception as err:  # noqa: BLE001
        return err
    raise AssertionError("no error")


def test_failing_module_names_the_innermost_module_that_raised():
    model = _Blocks()
    assert failing_module(model, _raised(model, torch.zeros(1, 3))) == "blocks.0.1"
    assert failing_module(model, _raised(call_model, model, (torch.zeros(1, 3), 1))) == ""  # the model itself
    assert failing_module(model, _raised(int, "x")) is None  # no frame ran in the model
    # frames that are not a module's own name modules through `frame_modules` (several: their common parent)
    stem, head = model.stem, model.blocks[0][1]

    def library(layers: list[nn.Module]) -> None:
        raise ValueError(len(layers))

    def named(frame, names):  # type: ignore[no-untyped-def]
        return [m for m in frame.f_locals.get("layers", []) if id(m) in names]

    assert failing_module(model, _raised(library, [head]), named) == "blocks.0.1"
    assert failing_module(model, _raised(library, [stem, head]), named) == ""
    assert failing_module(model, _raised(library, [model.blocks[0][0], head]), named) == "blocks.0"
