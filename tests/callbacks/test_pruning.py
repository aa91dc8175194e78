"""Pruning callbacks: fit (one-shot, gradual, masks), resume, reload, DDP, misconfiguration, the deprecated alias."""

from __future__ import annotations

import sys
import warnings

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from lightning_speedups._errors import SpeedupConfigError
from lightning_speedups.callbacks.pruning import MaskPruning, Pruning, StructuredPruning, pruning_schedule
from lightning_speedups.demo import DemoClassifier
from lightning_speedups.functional.pruning import load_pruned, masked_modules, weight_mask
from tests.helpers import quiet_trainer

pytest.importorskip("torch_pruning")


def _loader(n: int = 16) -> DataLoader:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 3, 32, 32, generator=g)
    y = torch.randint(0, 10, (n,), generator=g)
    return DataLoader(TensorDataset(x, y), batch_size=4)


def _fit(
    cb: StructuredPruning | MaskPruning, max_epochs: int, model: DemoClassifier | None = None, ckpt_path=None, **kw
):
    L.seed_everything(0)
    model = model or DemoClassifier(width=8)
    trainer = quiet_trainer(max_epochs=max_epochs, callbacks=[cb], limit_train_batches=2, limit_val_batches=0, **kw)
    trainer.fit(model, _loader(), ckpt_path=ckpt_path)
    return model, trainer


def _assert_optimizer_live(trainer: L.Trainer, model: torch.nn.Module) -> None:
    live = {id(p) for p in model.parameters()}
    opt = trainer.optimizers[0]
    assert {id(p) for g in opt.param_groups for p in g["params"]} == live
    assert all(id(p) in live for p in opt.state)


def test_pruning_schedule_cubic():
    sched = pruning_schedule(0.6, 1, 4, 4)
    assert [e for e, _ in sched] == [1, 2, 3, 4]
    amounts = [a for _, a in sched]
    assert amounts[-1] == pytest.approx(0.6) and amounts == sorted(amounts)
    assert amounts[0] - 0 > amounts[-1] - amounts[-2]  # cubic: big steps first
    assert pruning_schedule(0.5, 3, 3, 1) == [(3, 0.5)]


def test_pruning_fit_one_shot():
    cb = StructuredPruning(amount=0.5, start_epoch=0)
    model, trainer = _fit(cb, max_epochs=1)
    assert model.head.in_features == 16 and model.backbone[0][0].out_channels == 4
    _assert_optimizer_live(trainer, model)
    metrics = trainer.callback_metrics
    assert 0.6 < float(metrics["pruning/sparsity"]) < 0.8  # half the channels: ~3/4 of the conv weights
    assert float(metrics["pruning/params"]) == sum(p.numel() for p in model.parameters())
    assert float(metrics["pruning/macs"]) > 0


def test_pruning_fit_gradual_resume_reload(tmp_path):
    # uninterrupted: 2 steps at epochs 0 and 2 (cubic targets 0.4375, 0.5 of the dense channels, no drift)
    ref_cb = StructuredPruning(amount=0.5, start_epoch=0, end_epoch=2, steps=2)
    ref, ref_trainer = _fit(ref_cb, max_epochs=3)
    assert ref_cb.steps_done == 2 and ref.backbone[0][0].out_channels == 4 and ref.backbone[6][0].out_channels == 16
    _assert_optimizer_live(ref_trainer, ref)
    final = tmp_path / "final.ckpt"
    ref_trainer.save_checkpoint(final)

    # interrupted after epoch 1 (one step done), then resumed with a fresh model and callback
    first, first_trainer = _fit(StructuredPruning(amount=0.5, start_epoch=0, end_epoch=2, steps=2), max_epochs=2)
    assert first.backbone[6][0].out_channels == 18  # int(32 * (1 - 0.4375))
    mid = tmp_path / "mid.ckpt"
    first_trainer.save_checkpoint(mid)
    resumed_cb = StructuredPruning(amount=0.5, start_epoch=0, end_epoch=2, steps=2)
    resumed, _ = _fit(resumed_cb, max_epochs=3, ckpt_path=mid)
    assert resumed_cb.steps_done == 2
    for (name, a), b in zip(ref.state_dict().items(), resumed.state_dict().values()):
        torch.testing.assert_close(a, b, msg=name)

    # reload the final checkpoint into fresh models: strict Lightning load, weights_only, plain-module loader
    x = torch.randn(2, 3, 32, 32)
    expected = ref.eval()(x)
    for loaded in (
        DemoClassifier.load_from_checkpoint(final),
        DemoClassifier.load_from_checkpoint(final, weights_only=True),
        load_pruned(DemoClassifier(width=8), final),
    ):
        torch.testing.assert_close(loaded.eval()(x), expected)


def test_pruning_fit_unstructured(tmp_path):
    cb = MaskPruning(amount=0.5, start_epoch=0, end_epoch=1, steps=2, make_permanent=False)
    model, trainer = _fit(cb, max_epochs=2)
    masked = list(masked_modules(model).values())
    assert len(masked) == 5 and weight_mask(model.head) is None  # classifier ignored
    zeros = sum(int((weight_mask(m) == 0).sum()) for m in masked)
    total = sum(weight_mask(m).numel() for m in masked)
    assert zeros == round(0.5 * total)  # exact global sparsity
    trainer.save_checkpoint(tmp_path / "u.ckpt")
    ckpt = torch.load(tmp_path / "u.ckpt", weights_only=True)
    assert not [k for k in ckpt["state_dict"] if k.endswith(("_orig", "_mask"))]
    fresh = DemoClassifier.load_from_checkpoint(tmp_path / "u.ckpt")  # strict: clean keys
    assert int((fresh.backbone[0][0].weight == 0).sum()) == int((weight_mask(masked[0]) == 0).sum())

    permanent = MaskPruning(amount=0.5, start_epoch=0)
    model, _ = _fit(permanent, max_epochs=1)
    assert not list(masked_modules(model).values())  # masks folded in at the end
    assert float(model.backbone[0][0].weight.eq(0).float().mean()) > 0


class _SaveState(L.Callback):
    def __init__(self, out_dir: str) -> None:
        self.out_dir = out_dir

    def on_train_end(self, trainer, pl_module):
        opt = trainer.optimizers[0]
        live = {id(p) for p in pl_module.parameters()}
        stale = sum(id(p) not in live for g in opt.param_groups for p in g["params"])
        torch.save({"state": pl_module.state_dict(), "stale": stale}, f"{self.out_dir}/rank{trainer.global_rank}.pt")


@pytest.mark.ddp
def test_pruning_ddp(tmp_path):
    cb = StructuredPruning(amount=0.5, start_epoch=0, end_epoch=1, steps=2)
    model = DemoClassifier(width=8)
    trainer = quiet_trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp_spawn",
        max_epochs=2,
        limit_train_batches=2,
        limit_val_batches=0,
        callbacks=[cb, _SaveState(str(tmp_path))],
    )
    trainer.fit(model, _loader())
    r0 = torch.load(tmp_path / "rank0.pt", weights_only=True)
    r1 = torch.load(tmp_path / "rank1.pt", weights_only=True)
    assert r0["stale"] == r1["stale"] == 0
    assert r0["state"]["head.weight"].shape == (10, 16)
    assert r0["state"].keys() == r1["state"].keys()
    for name in r0["state"]:
        if "running" in name or "num_batches" in name:  # BN statistics are per rank without SyncBatchNorm
            assert r0["state"][name].shape == r1["state"][name].shape
            continue
        torch.testing.assert_close(r0["state"][name], r1["state"][name], msg=name)


def test_pruning_misconfiguration(monkeypatch):
    with pytest.raises(SpeedupConfigError, match="`amount`=1.0 is out of range"):
        StructuredPruning(amount=1.0)
    with pytest.raises(SpeedupConfigError, match="`amount`=5 is out of range"):
        StructuredPruning(amount=5)
    with pytest.raises(SpeedupConfigError, match="`end_epoch`=1 is out of range. Allowed values: an integer >= 2"):
        StructuredPruning(start_epoch=2, end_epoch=1)
    with pytest.raises(SpeedupConfigError, match="`start_epoch`=-1 is out of range. Allowed values: an integer >= 0"):
        StructuredPruning(start_epoch=-1)
    with pytest.raises(SpeedupConfigError, match="`steps`=4 is out of range. Allowed values: an integer in \\[1, 3\\]"):
        StructuredPruning(start_epoch=0, end_epoch=2, steps=4)
    with pytest.raises(SpeedupConfigError, match="`importance`='fisher' is not supported"):
        StructuredPruning(importance="fisher")
    with pytest.raises(SpeedupConfigError, match="`importance`='bn_scale' is not supported"):
        MaskPruning(importance="bn_scale")
    with pytest.raises(SpeedupConfigError, match="'taylor' with `start_epoch`=0 has no gradients"):
        StructuredPruning(importance="taylor")
    with monkeypatch.context() as m:
        m.setitem(sys.modules, "torch_pruning", None)
        with pytest.raises(SpeedupConfigError, match="lightning-speedups\\[pruning\\]"):
            StructuredPruning()
        MaskPruning()  # masks need only torch

    def setup_error(cb: StructuredPruning | MaskPruning, model: DemoClassifier | None = None) -> None:
        trainer = quiet_trainer(max_steps=1, callbacks=[cb], limit_val_batches=0)
        trainer.fit(model or DemoClassifier(width=8), _loader(4))

    with pytest.raises(SpeedupConfigError, match="`ignored_layers` names 'classifier', which is not a submodule"):
        setup_error(StructuredPruning(ignored_layers=["classifier"]))
    with pytest.raises(SpeedupConfigError, match="leaves no prunable layer"):
        setup_error(StructuredPruning(ignored_layers=["backbone", "head"]))
    with pytest.raises(SpeedupConfigError, match="leaves no conv/linear layer of DemoClassifier to prune"):
        setup_error(MaskPruning(ignored_layers=["backbone", "head"]))
    with pytest.raises(SpeedupConfigError, match="would remove all 2 channels of layer 'backbone.1.0'"):
        setup_error(StructuredPruning(amount=0.6), DemoClassifier(width=2))
    no_inputs = DemoClassifier(width=8)
    no_inputs.example_input_array = None
    bad_batches = DataLoader(TensorDataset(torch.randn(8, 7)), batch_size=4)  # nothing in it fits the conv net
    trainer = quiet_trainer(max_steps=1, callbacks=[StructuredPruning()], limit_val_batches=0)
    with pytest.raises(SpeedupConfigError, match="no `example_input_array`, and no part of the first training batch"):
        trainer.fit(no_inputs, bad_batches)
    assert no_inputs.backbone[0][0].out_channels == 8 and trainer.global_step == 0  # refused before any change


def test_pruning_example_input_from_first_batch():
    model = DemoClassifier(width=8)
    model.example_input_array = None
    cb = StructuredPruning(amount=0.5)
    trainer = quiet_trainer(max_steps=1, callbacks=[cb], limit_val_batches=0)
    trainer.fit(model, _loader(8))
    assert cb.steps_done == 1 and model.backbone[0][0].out_channels == 4
    assert cb._batch_inputs.shape == (2, 3, 32, 32)  # two samples of the first batch


def test_pruning_structured_with_compile_refused_at_setup():
    from lightning_speedups import TorchCompile

    model = DemoClassifier(width=8)
    trainer = quiet_trainer(
        max_steps=1, callbacks=[StructuredPruning(), TorchCompile(backend="eager")], limit_val_batches=0
    )
    with pytest.raises(SpeedupConfigError, match="with `TorchCompile` is refused"):
        trainer.fit(model, _loader(4))
    assert model.backbone[0][0].out_channels == 8 and trainer.global_step == 0


def test_pruning_alias_deprecated_builds_the_new_classes():
    with pytest.warns(DeprecationWarning, match=r"`Pruning\(mode='structured'\)` is deprecated.*`StructuredPruning"):
        structured = Pruning(amount=0.4, start_epoch=1, end_epoch=2, steps=2, round_to=8, make_permanent=False)
    assert type(structured) is StructuredPruning and structured.round_to == 8 and structured.schedule[0][0] == 1
    with pytest.warns(DeprecationWarning, match="use `MaskPruning"):
        masks = Pruning(mode="unstructured", amount=0.4, make_permanent=False, round_to=8)
    assert type(masks) is MaskPruning and masks.make_permanent is False
    # the state key of the class `Pruning` was, so that checkpoints load across the alias and the new classes
    assert structured.state_key == "Pruning{'mode': 'structured', 'amount': 0.4}"
    assert masks.state_key == "Pruning{'mode': 'unstructured', 'amount': 0.4}"
    with pytest.raises(SpeedupConfigError, match="`mode`='magic' is not supported"):
        Pruning(mode="magic")
    with pytest.raises(SpeedupConfigError, match="`importance`='bn_scale' is not supported"):
        Pruning(mode="unstructured", importance="bn_scale")


@pytest.mark.parametrize("mode", ["structured", "unstructured"])
def test_pruning_alias_checkpoint_resumes_in_the_new_class(tmp_path, mode):
    kwargs = {"amount": 0.5, "start_epoch": 0, "end_epoch": 2, "steps": 2}
    new = StructuredPruning if mode == "structured" else MaskPruning
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        _, old_trainer = _fit(Pruning(mode=mode, **kwargs), max_epochs=2)
    old_trainer.save_checkpoint(tmp_path / "old.ckpt")
    state = torch.load(tmp_path / "old.ckpt", weights_only=True)["callbacks"][
        f"Pruning{{'mode': {mode!r}, 'amount': 0.5}}"
    ]
    assert state["steps_done"] == 1
    resumed_cb = new(**kwargs)
    loaded: list[dict] = []
    load = resumed_cb.load_state_dict
    resumed_cb.load_state_dict = lambda sd: (loaded.append(sd), load(sd))[1]  # type: ignore[method-assign]
    resumed, _ = _fit(resumed_cb, max_epochs=3, ckpt_path=tmp_path / "old.ckpt")
    assert loaded and loaded[0]["steps_done"] == 1  # the state `Pruning` saved, found under its key
    assert resumed_cb.steps_done == 2 and resumed_cb.applied == pytest.approx(0.5)
    ref_cb = new(**kwargs)
    ref, _ = _fit(ref_cb, max_epochs=3)
    for (name, a), b in zip(ref.state_dict().items(), resumed.state_dict().values()):
        torch.testing.assert_close(a, b, msg=name)
