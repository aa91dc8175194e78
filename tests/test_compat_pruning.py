"""The framework internals the checkpoint, pruning and spawn paths rely on (``lightning_speedups._compat``).

Each test fails with a message naming the private name that an upgrade moved, instead of a failure deep inside a
callback.
"""

from __future__ import annotations

import inspect

import lightning as L
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_speedups import _compat
from tests.helpers import quiet_trainer


class _Tiny(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(3, 2)

    def training_step(self, batch, batch_idx):
        return self.layer(batch[0]).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _loader() -> DataLoader:
    return DataLoader(TensorDataset(torch.randn(4, 3)), batch_size=2)


def test_compat_strategy_load_model_state_dict_is_the_weights_path(tmp_path):
    sig = inspect.signature(L.pytorch.strategies.Strategy.load_model_state_dict)
    assert list(sig.parameters)[:2] == ["self", "checkpoint"], (
        "Strategy.load_model_state_dict(checkpoint, strict) changed: before_model_weights_load must be updated"
    )
    trainer = quiet_trainer(max_steps=1)
    trainer.fit(_Tiny(), _loader())
    trainer.save_checkpoint(tmp_path / "a.ckpt")
    seen: list[int] = []

    class Hook(L.Callback):
        def setup(self, trainer, pl_module, stage):
            _compat.before_model_weights_load(trainer.strategy, "t", lambda ckpt: seen.append(ckpt["global_step"]))

    quiet_trainer(max_steps=2, callbacks=[Hook()]).fit(_Tiny(), _loader(), ckpt_path=tmp_path / "a.ckpt")
    assert seen == [1], "Lightning no longer restores the weights through Strategy.load_model_state_dict"


def test_compat_keyed_strategy_patch_replaces_by_key_and_removes_itself():
    class Strategy:
        def load_model_state_dict(self, checkpoint, strict=True):
            return ("loaded", checkpoint["n"])

    strategy = Strategy()
    seen: list[str] = []
    _compat.before_model_weights_load(strategy, "a", lambda ckpt: seen.append("a0"))
    _compat.before_model_weights_load(strategy, "a", lambda ckpt: seen.append("a1"))  # same key: replaced
    _compat.before_model_weights_load(strategy, "b", lambda ckpt: seen.append("b"))
    assert strategy.load_model_state_dict({"n": 3}) == ("loaded", 3) and seen == ["a1", "b"]
    _compat.before_model_weights_load(strategy, "a", None)
    assert "load_model_state_dict" in vars(strategy)  # "b" is left
    _compat.before_model_weights_load(strategy, "b", None)
    assert not [k for k in vars(strategy) if "load_model_state_dict" in k], "the patch did not remove itself"
    _compat.before_model_weights_load(strategy, "b", None)  # removing again is a no-op


def test_compat_tp_allow_every_group_is_asked_and_put_back():
    tp = pytest.importorskip("torch_pruning")
    model = nn.Sequential(nn.Linear(4, 2), nn.ReLU(), nn.Linear(2, 2))
    pruner = tp.pruner.BasePruner(
        model, torch.zeros(1, 4), importance=tp.importance.MagnitudeImportance(p=1), ignored_layers=[model[2]]
    )
    dg = pruner.DG
    group = dg.get_pruning_group(model[0], tp.prune_linear_out_channels, idxs=[0, 1])
    assert not dg.check_pruning_group(group), "check_pruning_group no longer refuses a group that empties a layer"
    with _compat.tp_allow_every_group(dg):
        assert dg.check_pruning_group(group)
    assert "check_pruning_group" not in vars(dg) and not dg.check_pruning_group(group)


def test_compat_fit_train_dataloader_from_setup():
    found: list[object] = []

    class Grab(L.Callback):
        def setup(self, trainer, pl_module, stage):
            found.append(_compat.fit_train_dataloader(trainer))

    loader = _loader()
    quiet_trainer(max_steps=1, callbacks=[Grab()]).fit(_Tiny(), loader)
    assert found == [loader], "trainer.fit_loop._data_source.dataloader() no longer returns the fit's loaders"


def test_compat_spawn_launcher_names():
    from lightning.pytorch.strategies.launchers.multiprocessing import _MultiProcessingLauncher

    assert hasattr(_MultiProcessingLauncher, "_collect_rank_zero_results"), (
        "_MultiProcessingLauncher._collect_rank_zero_results moved: spawn_drop_returned_weights must be updated"
    )
    trainer = quiet_trainer(devices=2, strategy="ddp_spawn")
    assert _compat.is_spawn_launcher(trainer)
    assert not _compat.is_spawn_launcher(quiet_trainer())


def test_compat_torch_pruning_internals():
    tp = pytest.importorskip("torch_pruning")
    helpers = pytest.importorskip("torch_pruning._helpers")
    assert hasattr(helpers, "_HybridIndex"), "torch_pruning._helpers._HybridIndex moved: tp_index_budget must follow"
    base = tp.pruner.function.BasePruningFunc
    assert hasattr(base, "_prune_parameter_and_grad"), "BasePruningFunc._prune_parameter_and_grad moved"
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    x = torch.zeros(1, 4)
    with pytest.raises(_compat.GraphBudgetExceeded), _compat.tp_index_budget(3):
        tp.DependencyGraph().build_dependency(model, example_inputs=x).get_pruning_group(
            model[0], tp.prune_linear_out_channels, list(range(8))
        )
    sliced: list[tuple[int, int]] = []
    with _compat.tp_on_param_slice(lambda old, new, idx, dim: sliced.append((old.shape[dim], new.shape[dim]))):
        pruner = tp.pruner.BasePruner(
            model, x, importance=tp.importance.MagnitudeImportance(p=1), pruning_ratio=0.5, ignored_layers=[model[2]]
        )
        assert _compat.tp_scope_channels(pruner) == {}  # raises with the reason when the dict is gone
        pruner.step()
        assert _compat.tp_scope_channels(pruner), "BasePruner no longer records the initial channels per scope"
    assert (8, 4) in sliced, "torch-pruning no longer slices parameters through _prune_parameter_and_grad"


def test_compat_ddp_and_optimizer_setup_names():
    from lightning.pytorch.strategies import DDPStrategy

    for name in ("_setup_model", "_register_ddp_hooks"):
        assert callable(getattr(DDPStrategy, name, None)), f"DDPStrategy.{name} moved: ddp_wrap_again must follow"
    model = _Tiny()
    quiet_trainer(max_steps=1).fit(model, _loader())  # attached to a trainer, as during a fit
    optimizers, configs = _compat.init_optimizers_and_schedulers(model)
    assert len(optimizers) == 1 and configs == [], "_init_optimizers_and_lr_schedulers changed its return value"


def test_tp_group_loop_guard_counts_repeats_and_restores():
    import torch_pruning as tp

    from lightning_speedups._compat import GraphLoop, tp_group_loop_guard

    original = tp.dependency.group.Group.add_dep
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    dg = tp.DependencyGraph().build_dependency(model, example_inputs=torch.zeros(1, 4))
    group = dg.get_pruning_group(model[0], tp.prune_linear_out_channels, idxs=[0])
    dep, idxs = group[0]
    with tp_group_loop_guard(max_repeats=2):
        loop = tp.dependency.group.Group()
        loop.add_dep(dep, idxs)
        loop.add_dep(dep, idxs)
        with pytest.raises(GraphLoop, match="more than 2 times"):
            loop.add_dep(dep, idxs)
    assert tp.dependency.group.Group.add_dep is original, "Group.add_dep was not restored"
