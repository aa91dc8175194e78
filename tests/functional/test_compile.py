"""compile_model and key helpers. Everything here uses backend="eager": dynamo traces for real, no inductor codegen."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from lightning_speedups._errors import SpeedupConfigError
from lightning_speedups.demo import DemoClassifier
from lightning_speedups.functional.compile import (
    CompileConfig,
    align_compiled_keys,
    compile_model,
    compiled_modules,
    is_compiled,
    strip_compile_prefix,
    uncompile_model,
)


def _failing_backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
    raise RuntimeError("simulated compiler crash")


def test_compile_misconfiguration():
    with pytest.raises(SpeedupConfigError, match="`mode`='fast' is not supported"):
        CompileConfig(mode="fast")
    with pytest.raises(SpeedupConfigError, match="`backend`='inductr' is not supported"):
        CompileConfig(backend="inductr")
    with pytest.raises(SpeedupConfigError, match="only applies to `backend`='inductor'"):
        CompileConfig(mode="max-autotune", backend="eager")
    with pytest.raises(SpeedupConfigError, match="`dynamic`='auto' is not supported"):
        CompileConfig(dynamic="auto")  # type: ignore[arg-type]
    with pytest.raises(SpeedupConfigError, match="`fullgraph`=1 is not supported"):
        CompileConfig(fullgraph=1)  # type: ignore[arg-type]
    with pytest.raises(SpeedupConfigError, match="`fallback`=None is not supported"):
        CompileConfig(fallback=None)  # type: ignore[arg-type]
    with pytest.raises(SpeedupConfigError, match="`backend`=3 is not callable. Allowed values: a backend name"):
        CompileConfig(backend=3)  # type: ignore[arg-type]
    model = DemoClassifier(width=8)
    with pytest.raises(SpeedupConfigError, match="`attrs` names 'encoder', which is not a submodule"):
        compile_model(model, attrs="encoder", backend="eager")
    with pytest.raises(SpeedupConfigError, match="overlap"):
        compile_model(model, attrs=["backbone", "backbone.0"], backend="eager")
    with pytest.raises(SpeedupConfigError, match="names no module"):
        compile_model(model, attrs=[], backend="eager")
    with pytest.raises(SpeedupConfigError, match="either `config` or keyword arguments"):
        compile_model(model, config=CompileConfig(backend="eager"), mode="default")
    assert not is_compiled(model)  # nothing half-done


def test_compile_functional():
    model = DemoClassifier(width=8)
    plain_keys = list(model.state_dict())
    x = torch.randn(4, 3, 32, 32)
    expected = model(x)

    summary = compile_model(model, backend="eager")

    assert summary.compiled == ("",) and summary.backend == "eager" and summary.mode == "default"
    assert is_compiled(model) and list(compiled_modules(model)) == [""]
    assert list(model.state_dict()) == plain_keys  # in place: no `_orig_mod.` prefix
    out = model(x)
    torch.testing.assert_close(out, expected)
    out.sum().backward()
    assert model.head.weight.grad is not None
    call = compiled_modules(model)[""]
    assert call.calls == 1 and call.first_call_seconds is not None
    # dynamo really traced the forward
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] >= 1
    # already compiled: left as it is
    compile_model(model, backend="eager")
    assert compiled_modules(model)[""] is call
    assert uncompile_model(model) == [""] and not is_compiled(model)


def test_compile_submodules():
    model = DemoClassifier(width=8)
    summary = compile_model(model, attrs=["backbone", "head"], backend="eager")
    assert summary.compiled == ("backbone", "head")
    assert set(compiled_modules(model)) == {"backbone", "head"}
    model(torch.randn(2, 3, 32, 32))
    assert all(c.calls == 1 for c in compiled_modules(model).values())


def test_compile_fallback_to_eager():
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    x = torch.randn(3, 4)
    expected = model(x)
    compile_model(model, backend=_failing_backend, fallback=True)
    with pytest.warns(UserWarning, match="failed .*running it eagerly"):
        out = model(x)
    torch.testing.assert_close(out, expected)
    assert not is_compiled(model)  # later calls run eagerly without retrying

    strict = nn.Sequential(nn.Linear(4, 4))
    compile_model(strict, backend=_failing_backend)
    with pytest.raises(Exception, match="simulated compiler crash"):
        strict(x)


def test_compile_fallback_reraises_genuine_errors():
    model = nn.Linear(4, 4)
    compile_model(model, backend="eager", fallback=True)
    with pytest.raises(RuntimeError, match="shapes cannot be multiplied"):
        model(torch.randn(2, 5))  # wrong shape fails in eager too: a real bug, not a compile problem


def test_compiled_checkpoint_keys():
    """`torch.compile(module)` adds `_orig_mod.` to keys (Lightning #17415); in-place compile does not."""
    wrapped = nn.Sequential(torch.compile(nn.Linear(2, 2), backend="eager"), nn.ReLU())
    plain = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
    inplace = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
    compile_model(inplace, backend="eager")
    assert list(wrapped.state_dict()) == ["0._orig_mod.weight", "0._orig_mod.bias"]
    assert list(inplace.state_dict()) == list(plain.state_dict()) == ["0.weight", "0.bias"]

    assert list(strip_compile_prefix(wrapped.state_dict())) == ["0.weight", "0.bias"]
    with pytest.raises(RuntimeError, match="Missing key"):
        plain.load_state_dict(wrapped.state_dict())
    plain.load_state_dict(align_compiled_keys(wrapped.state_dict(), plain))  # compiled -> plain
    wrapped.load_state_dict(align_compiled_keys(inplace.state_dict(), wrapped))  # plain -> compiled
    torch.testing.assert_close(wrapped[0].weight, inplace[0].weight)
    # unknown keys are kept, so strict loading still reports them
    assert "extra" in align_compiled_keys({"extra": 1}, plain)


def test_strip_compile_prefix_keeps_module_versions():
    wrapper = nn.Module()
    wrapper.net = torch.compile(nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2)))
    state = strip_compile_prefix(wrapper.state_dict())
    # BatchNorm reads its version from `_metadata` on load; the renamed prefixes keep it
    assert state._metadata["net.1"]["version"] == 2 and not any("_orig_mod" in k for k in state._metadata)
    fresh = nn.Module()
    fresh.net = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2))
    fresh.load_state_dict(state)
