"""Callbacks under FSDP that really shards: Lightning's ``FSDPStrategy`` over 2 CPU ranks (gloo, spawn).

Lightning refuses ``strategy="fsdp"`` on a CPU; :class:`tests.fsdp_cpu.CPUFSDPStrategy` is the same strategy with
``device_id=cpu``, so with 2 ranks every flat parameter is split between them (``FULL_SHARD``). Techniques that
cannot follow a sharded model refuse it in ``setup()``, naming the strategy, before any step; the others train,
and their checkpoints reload into a fresh model and resume (spawned ranks, one fit after another). The refusals are
also checked in-process, on a Trainer that is built but not fitted.
"""

from __future__ import annotations

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import lightning_speedups as ls
from tests.fsdp_cpu import CPUFSDPStrategy
from tests.helpers import quiet_trainer

pytestmark = pytest.mark.ddp


class Net(L.LightningModule):
    """A plain module: own optimizer, an ``lr`` attribute for the LR finder, a backbone and a head."""

    def __init__(self) -> None:
        super().__init__()
        self.lr = 0.05
        self.backbone = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Conv2d(8, 8, 3), nn.ReLU())
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(8 * 4 * 4, 4))
        self.example_input_array = torch.zeros(2, 3, 8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(x))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.cross_entropy(self(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)  # stateful: Lightning 2.6 cannot resume
        # a stateless optimizer (plain SGD) under FSDP (FSDPStrategy.load_checkpoint indexes its empty state)

    def train_dataloader(self) -> DataLoader:
        g = torch.Generator().manual_seed(0)
        x = torch.randn(32, 3, 8, 8, generator=g)
        y = torch.randint(0, 4, (32,), generator=g)
        return DataLoader(TensorDataset(x, y), batch_size=4)


class Shards(L.Callback):
    """On every rank: the wrapped model holds fewer parameters than the model has (FULL_SHARD split them)."""

    def __init__(self, total: int) -> None:
        self.total = total

    def on_train_start(self, trainer, pl_module):
        held = sum(p.numel() for p in trainer.strategy.model.parameters())
        assert 0 < held < self.total, (held, self.total)


REFUSERS = {
    "EMA": lambda: ls.EMA(),
    "MaskPruning": lambda: ls.MaskPruning(amount=0.5, start_epoch=0, end_epoch=1),
    "structured pruning": lambda: ls.StructuredPruning(amount=0.5, start_epoch=0, end_epoch=1),
    "QuantizationAwareTraining": lambda: ls.QuantizationAwareTraining(),
    "ThroughputBatchSizeFinder": lambda: ls.ThroughputBatchSizeFinder(),
    "LRFinder": lambda: ls.LRFinder(),
}


@pytest.mark.parametrize("name", list(REFUSERS))
def test_sharded_strategy_refused_in_setup_naming_it(name):
    """In-process: the Trainer is built with the strategy (no ranks spawned) and the callback's setup() refuses."""
    if name == "QuantizationAwareTraining":
        pytest.importorskip("torchao.quantization.qat")
    trainer = quiet_trainer(devices=2, strategy=CPUFSDPStrategy())
    model = Net()
    callback = REFUSERS[name]()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ls.SpeedupConfigError, match=r"`strategy`=CPUFSDPStrategy is not supported by") as err:
        callback.setup(trainer, model, "fit")
    assert name in str(err.value) and "Allowed values" in str(err.value)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())  # nothing half-applied


def test_fsdp_mask_pruning_refused_before_any_step(tmp_path):
    """The real 2-rank run: the refusal comes from setup() on the ranks (it crashed inside FSDP's flat parameters)."""
    trainer = quiet_trainer(
        devices=2,
        strategy=CPUFSDPStrategy(),
        max_epochs=1,
        default_root_dir=tmp_path,
        callbacks=[REFUSERS["MaskPruning"]()],
    )
    with pytest.raises(Exception, match=r"not supported by MaskPruning"):
        trainer.fit(Net())
    assert trainer.global_step == 0


def _unfreezing_fit(root, model: Net, ckpt_path=None) -> None:
    total = sum(p.numel() for p in model.parameters())
    ckpt = ModelCheckpoint(dirpath=root, filename="{epoch}", save_top_k=-1)
    trainer = quiet_trainer(
        devices=2,
        strategy=CPUFSDPStrategy(),
        max_epochs=2,
        enable_checkpointing=True,
        callbacks=[ls.FineTuneFreezing(backbone="backbone", unfreeze_at_epoch=1, verbose=False), ckpt, Shards(total)],
    )
    trainer.fit(model, ckpt_path=ckpt_path)


def test_fsdp_gradual_unfreezing_trains_shards_reloads_and_resumes(tmp_path):
    """FineTuneFreezing under FULL_SHARD: the frozen backbone stays put in epoch 0 and trains once unfrozen; the
    main process gets the gathered full weights; the checkpoint loads into a fresh model with weights_only; a run
    resumed from epoch 0's checkpoint (another initialisation: all must come from the checkpoint) ends with the
    uninterrupted run's weights."""
    L.seed_everything(0)
    model = Net()
    init = {k: v.clone() for k, v in model.state_dict().items()}
    _unfreezing_fit(tmp_path / "run", model)
    state = model.state_dict()
    assert state.keys() == init.keys() and all(state[k].shape == v.shape for k, v in init.items())
    assert not torch.equal(state["backbone.0.weight"], init["backbone.0.weight"])  # unfrozen in epoch 1
    assert not torch.equal(state["head.1.weight"], init["head.1.weight"])
    fresh = ls.load_checkpoint(Net(), tmp_path / "run" / "epoch=1.ckpt")
    for k, v in fresh.state_dict().items():
        torch.testing.assert_close(v, state[k], msg=k)
    saved = torch.load(tmp_path / "run" / "epoch=0.ckpt", weights_only=True)["state_dict"]
    torch.testing.assert_close(saved["backbone.0.weight"], init["backbone.0.weight"])  # frozen through epoch 0

    L.seed_everything(1)
    resumed = Net()
    L.seed_everything(0)  # the global seed also seeds Lightning's DistributedSampler: the same data order
    _unfreezing_fit(tmp_path / "resume", resumed, ckpt_path=str(tmp_path / "run" / "epoch=0.ckpt"))
    for k, v in resumed.state_dict().items():
        torch.testing.assert_close(v, state[k], msg=k)


def test_fsdp_matrix_tool_plans_every_single_technique_and_writes_a_table():
    """``tools/fsdp_matrix.py`` (the survey behind the docs' FSDP list): its cells and its table, without a fit."""
    from tests.zoo.techniques import TECHNIQUES
    from tools.fsdp_matrix import ARCHS, SKIP, cells, markdown

    planned = cells()
    singles = [t for t in TECHNIQUES if "+" not in t and t not in SKIP]
    assert planned == [(a, t) for a in ARCHS for t in singles]
    table = markdown([{"arch": "bert", "tech": "ema", "outcome": "refused", "message": "a | b"}])
    assert "| bert | ema | refused | a \\| b |" in table
