"""TorchCompile. Fast tests use backend="eager" (dynamo traces for real, no codegen); one slow test runs inductor."""

from __future__ import annotations

from typing import Any

import lightning as L
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_speedups._errors import SpeedupConfigError
from lightning_speedups.callbacks.compile import TorchCompile
from lightning_speedups.demo import DemoClassifier, DemoMLP
from lightning_speedups.functional.compile import compiled_modules, is_compiled, uncompile_model
from tests.helpers import quiet_trainer


def _loader(n: int = 64) -> DataLoader:
    g = torch.Generator().manual_seed(0)
    ds = TensorDataset(torch.randn(n, 3, 32, 32, generator=g), torch.randint(0, 10, (n,), generator=g))
    return DataLoader(ds, batch_size=16)


def _failing_backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
    raise RuntimeError("simulated compiler crash")


class NoForward(L.LightningModule):
    """No `forward`: the default targets are the children with parameters."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, 16), nn.ReLU())
        self.head = nn.Linear(16, 10)
        self.loss_fn = nn.CrossEntropyLoss()

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return self.loss_fn(self.head(self.encoder(x)), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


class BypassesForward(NoForward):
    """Defines `forward`, but `training_step` calls the submodules directly: compiling `forward` does nothing."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(x))


class WrappedByUser(DemoClassifier):
    """The user wrapped the backbone with torch.compile themselves: its keys carry `_orig_mod.`."""

    def __init__(self) -> None:
        super().__init__(width=8)
        self.backbone = torch.compile(self.backbone, backend="eager")  # type: ignore[assignment]


def test_compile_misconfiguration():
    with pytest.raises(SpeedupConfigError, match="`mode`='turbo' is not supported"):
        TorchCompile(mode="turbo")
    with pytest.raises(SpeedupConfigError, match="`backend`='nope' is not supported"):
        TorchCompile(backend="nope")
    with pytest.raises(SpeedupConfigError, match="`compile_attr`=\\[\\] must be a submodule name"):
        TorchCompile(compile_attr=[])
    with pytest.raises(SpeedupConfigError, match="`attrs` names 'encoder', which is not a submodule"):
        quiet_trainer(max_steps=1, callbacks=[TorchCompile(backend="eager", compile_attr="encoder")]).fit(
            DemoClassifier(width=8), _loader()
        )

    class Empty(NoForward):
        def __init__(self) -> None:
            L.LightningModule.__init__(self)
            self.w = nn.Parameter(torch.zeros(1))

    with pytest.raises(SpeedupConfigError, match="found nothing to compile"):
        quiet_trainer(max_steps=1, callbacks=[TorchCompile(backend="eager")]).fit(Empty(), _loader())


def test_compile_fit_checkpoint_reload_eager_backend():
    model = DemoClassifier(width=8)
    callback = TorchCompile(backend="eager")
    trainer = quiet_trainer(max_steps=2, limit_val_batches=1, val_check_interval=2, callbacks=[callback])
    trainer.fit(model, _loader(), _loader(16))
    assert callback.summary is not None and callback.summary.compiled == ("",)
    assert callback.compiled_calls == 3  # 2 training steps + 1 validation step went through the compiled call
    assert is_compiled(model)
    trainer.save_checkpoint("compiled.ckpt")
    keys = list(torch.load("compiled.ckpt", weights_only=True)["state_dict"])
    assert not any("_orig_mod" in k for k in keys) and keys == list(DemoClassifier(width=8).state_dict())

    plain = DemoClassifier.load_from_checkpoint("compiled.ckpt")  # strict load into an uncompiled model
    assert not is_compiled(plain)
    model.eval()
    plain.eval()
    x = torch.randn(4, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(plain(x), model(x))


def test_compile_resume_from_plain_checkpoint():
    """Vice versa: a checkpoint of an uncompiled run resumes under TorchCompile and matches an uninterrupted run."""

    def fit(epochs: int, callbacks: list, ckpt_path: str | None = None, save: str | None = None) -> NoForward:
        torch.manual_seed(0)
        model = NoForward()
        trainer = quiet_trainer(max_epochs=epochs, callbacks=callbacks)
        trainer.fit(model, _loader(32), ckpt_path=ckpt_path)
        if save:
            trainer.save_checkpoint(save)
        return model

    full = fit(2, [])
    fit(1, [], save="plain.ckpt")
    resumed = fit(2, [TorchCompile(backend="eager")], ckpt_path="plain.ckpt")
    assert set(compiled_modules(resumed)) == {"encoder", "head"}  # no forward: the children were compiled
    for (name, a), b in zip(full.named_parameters(), resumed.parameters()):
        torch.testing.assert_close(b, a, msg=name)


def test_compile_user_wrapped_module_keys():
    """A model that wraps a submodule in torch.compile itself (Lightning #17415/#20233)."""
    model = WrappedByUser()
    assert any("_orig_mod." in k for k in model.state_dict())
    trainer = quiet_trainer(max_steps=1, callbacks=[TorchCompile(backend="eager", compile_attr="head")])
    trainer.fit(model, _loader())
    trainer.save_checkpoint("wrapped.ckpt")
    # saved without the prefix: loads strictly into the plain model
    plain = DemoClassifier.load_from_checkpoint("wrapped.ckpt")
    torch.testing.assert_close(plain.backbone[0][0].weight, model.backbone._orig_mod[0][0].weight)

    # and a plain checkpoint resumes into the wrapped model while the callback is attached
    fresh = WrappedByUser()
    quiet_trainer(max_steps=2, callbacks=[TorchCompile(backend="eager", compile_attr="head")]).fit(
        fresh, _loader(), ckpt_path="wrapped.ckpt"
    )
    assert fresh.trainer.global_step == 2


def test_compile_attr_and_unused_warning():
    model = BypassesForward()
    with pytest.warns(UserWarning, match="none of the compiled modules was called"):
        quiet_trainer(max_steps=1, callbacks=[TorchCompile(backend="eager")]).fit(model, _loader())

    model = BypassesForward()
    callback = TorchCompile(backend="eager", compile_attr=["encoder"])
    quiet_trainer(max_steps=2, callbacks=[callback]).fit(model, _loader())
    assert list(compiled_modules(model)) == ["encoder"] and callback.compiled_calls == 2


def test_compile_fallback_fit():
    model = DemoMLP(hidden=(16,))
    callback = TorchCompile(backend=_failing_backend, fallback=True)
    with pytest.warns(UserWarning, match="running it eagerly"):
        quiet_trainer(max_steps=2, callbacks=[callback]).fit(model, _loader())
    assert model.trainer.global_step == 2 and not is_compiled(model)

    with pytest.raises(Exception, match="simulated compiler crash"):
        quiet_trainer(max_steps=2, callbacks=[TorchCompile(backend=_failing_backend)]).fit(
            DemoMLP(hidden=(16,)), _loader()
        )


@pytest.mark.slow
def test_compile_inductor_fit_checkpoint_reload():
    """One real inductor compile (a tiny MLP, train mode only): fit, checkpoint, reload into a plain model."""
    torch.manual_seed(0)
    model = DemoMLP(hidden=(16,))
    callback = TorchCompile()  # inductor, mode="default"
    trainer = quiet_trainer(max_steps=2, limit_val_batches=0, callbacks=[callback])
    trainer.fit(model, _loader())
    assert callback.compiled_calls == 2 and compiled_modules(model)[""].first_call_seconds is not None
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] >= 1
    trainer.save_checkpoint("inductor.ckpt")
    plain = DemoMLP.load_from_checkpoint("inductor.ckpt")
    x = torch.randn(16, 3, 32, 32)  # same shape and mode as training: reuses the compiled graph
    compiled_out = model(x)
    assert not any("_orig_mod" in k for k in torch.load("inductor.ckpt", weights_only=True)["state_dict"])
    torch.testing.assert_close(plain(x), compiled_out, atol=1e-5, rtol=1e-4)
    uncompile_model(model)
    torch.testing.assert_close(plain(x), model(x))


def test_compile_leaves_lightning_compiled_model_alone():
    """`trainer.fit(torch.compile(model))` is Lightning's own path: the callback must not compile a second time."""
    model = DemoMLP(hidden=(16,))
    with pytest.warns(UserWarning, match="already compiles its steps"):
        quiet_trainer(max_steps=1, callbacks=[TorchCompile(backend="eager")]).fit(
            torch.compile(model, backend="eager"), _loader()
        )
    assert not compiled_modules(model)
