"""FineTuneFreezing: a backbone "pretrained" here on digits 0-4 is fine-tuned on digits 5-9."""

from __future__ import annotations

import copy
import glob
import os

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_speedups._errors import SpeedupConfigError
from lightning_speedups.callbacks.finetuning import FineTuneFreezing
from lightning_speedups.demo import DemoClassifier, DigitsDataModule
from lightning_speedups.demo.data import DIGITS_MEAN, DIGITS_STD
from lightning_speedups.functional.finetuning import replace_head
from lightning_speedups.optim import OptimizerConfig, SchedulerConfig, SpeedupMixin
from tests.functional.test_finetuning import FAMILIES
from tests.helpers import quiet_trainer

NEW_TASK = [5, 6, 7, 8, 9]


def _loader(classes: list[int], n: int = 256, batch_size: int = 32) -> DataLoader:
    """Fixed-order, augmentation-free digits: the same batches in every run (and after a resume)."""
    dm = DigitsDataModule(classes=classes, augment=False)
    dm.setup("fit")
    x = (dm.train_images[:n].float() / 255.0 - DIGITS_MEAN) / DIGITS_STD
    return DataLoader(TensorDataset(x, dm.train_labels[:n]), batch_size=batch_size, shuffle=False)


@pytest.fixture(scope="module")
def pretrained() -> dict[str, torch.Tensor]:
    """A DemoClassifier trained on digits 0-4: the 'pretrained' weights fine-tuned below."""
    L.seed_everything(0, verbose=False)
    model = DemoClassifier(num_classes=5, width=8, optimizer_config={"lr": 3e-3})
    quiet_trainer(max_epochs=1, limit_val_batches=0).fit(model, _loader([0, 1, 2, 3, 4], n=256))
    return copy.deepcopy(model.state_dict())


def _model(pretrained: dict[str, torch.Tensor], **kwargs) -> DemoClassifier:
    model = DemoClassifier(num_classes=5, width=8, **kwargs)
    model.load_state_dict(pretrained)
    replace_head(model, 5)  # fresh head for digits 5-9
    return model


def _backbone(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.backbone.state_dict().items()}


def test_finetune_frozen_phase(pretrained):
    model = _model(pretrained)
    before = _backbone(model)
    head_before = model.head.weight.detach().clone()
    cb = FineTuneFreezing(unfreeze_at_epoch=None)
    trainer = quiet_trainer(max_epochs=2, limit_train_batches=4, limit_val_batches=1, callbacks=[cb])
    trainer.fit(model, _loader(NEW_TASK), _loader(NEW_TASK, n=64))
    after = _backbone(model)
    assert before.keys() == after.keys()
    for k in before:  # weights and BN running stats (incl. num_batches_tracked): bitwise unchanged
        assert torch.equal(before[k], after[k]), k
    assert not torch.equal(head_before, model.head.weight)


def test_finetune_fit_train_bn_and_head_only(pretrained):
    model = _model(pretrained)
    before = _backbone(model)
    cb = FineTuneFreezing(unfreeze_at_epoch=None, train_bn=True)
    quiet_trainer(max_epochs=1, limit_train_batches=3, limit_val_batches=0, callbacks=[cb]).fit(
        model, _loader(NEW_TASK)
    )
    after = _backbone(model)
    assert torch.equal(before["0.0.weight"], after["0.0.weight"])  # conv frozen
    assert not torch.equal(before["0.1.weight"], after["0.1.weight"])  # BN affine trains
    assert not torch.equal(before["0.1.running_mean"], after["0.1.running_mean"])  # BN stats update
    assert cb.unfrozen == []


class _Recorder(L.Callback):
    """Per epoch: which backbone blocks are trainable and the lr of each parameter's group."""

    def __init__(self) -> None:
        self.trainable: list[set[str]] = []
        self.lrs: list[dict[str, float]] = []

    def on_train_epoch_start(self, trainer, pl_module):
        named = pl_module.backbone.named_parameters()
        self.trainable.append({n.rsplit(".", 2)[0] for n, p in named if p.requires_grad})
        opt = trainer.optimizers[0]
        lr_of = {id(p): g["lr"] for g in opt.param_groups for p in g["params"]}
        self.lrs.append({n: lr_of[id(p)] for n, p in pl_module.named_parameters()})


def test_finetune_gradual_schedule(pretrained):
    model = _model(pretrained, optimizer_config={"name": "adamw", "lr": 1e-3, "weight_decay": 0.01})
    before = _backbone(model)
    cb = FineTuneFreezing(unfreeze_at_epoch=1, unfreeze_every=1, lr_decay=0.5)
    rec = _Recorder()
    trainer = quiet_trainer(max_epochs=4, limit_train_batches=2, limit_val_batches=0, callbacks=[cb, rec])
    trainer.fit(model, _loader(NEW_TASK))
    # groups are the conv blocks, top first; one more every epoch from epoch 1 (recorder runs after the callback)
    assert [g.name for g in cb.groups] == ["backbone.6", "backbone.4", "backbone.3", "backbone.1", "backbone.0"]
    assert rec.trainable == [set(), {"6"}, {"6", "4"}, {"6", "4", "3"}]
    for epoch_lrs in rec.lrs:  # every group exists from the start, each with its discriminative lr
        assert epoch_lrs["head.weight"] == pytest.approx(1e-3)
        for depth, block in enumerate(["6", "4", "3", "1", "0"], 1):
            assert epoch_lrs[f"backbone.{block}.0.weight"] == pytest.approx(1e-3 * 0.5**depth)
            assert epoch_lrs[f"backbone.{block}.1.bias"] == pytest.approx(1e-3 * 0.5**depth)
    after = _backbone(model)
    assert all(torch.equal(before[k], after[k]) for k in before if k.startswith(("0.", "1.")))  # never unfrozen
    assert not torch.equal(before["3.0.weight"], after["3.0.weight"])
    assert trainer.callback_metrics["finetune/unfrozen_groups"] == 3


def test_finetune_explicit_schedule(pretrained):
    model = _model(pretrained)
    cb = FineTuneFreezing(schedule={1: ["backbone.6"], 3: ["backbone.4", "backbone.3"]})
    rec = _Recorder()
    quiet_trainer(max_epochs=4, limit_train_batches=1, limit_val_batches=0, callbacks=[cb, rec]).fit(
        model, _loader(NEW_TASK)
    )
    assert rec.trainable == [set(), {"6"}, {"6"}, {"6", "4", "3"}]
    assert cb.groups[-1].name == "(never unfrozen)" and cb.groups[-1].epoch is None
    assert not any(p.requires_grad for p in model.backbone[0].parameters())


class _PlainModule(L.LightningModule):
    """No SpeedupMixin: torch SGD + OneCycleLR over all parameters (one group), split by the callback."""

    def __init__(self, state: dict[str, torch.Tensor], filter_frozen: bool = False) -> None:
        super().__init__()
        self.net = DemoClassifier(num_classes=5, width=8)
        self.net.load_state_dict(state)
        self.filter_frozen = filter_frozen

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.cross_entropy(self(x), y)

    def configure_optimizers(self):
        params = [p for p in self.parameters() if p.requires_grad or not self.filter_frozen]
        opt = torch.optim.SGD(params, lr=0.1, momentum=0.9)
        steps = self.trainer.estimated_stepping_batches
        sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=steps)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def _fit_plain(state, tmp, max_epochs, ckpt_path=None, **trainer_kw):
    model = _PlainModule(state)
    cb = FineTuneFreezing(unfreeze_at_epoch=2, unfreeze_every=1, lr_decay=0.5)
    mc = ModelCheckpoint(dirpath=tmp, filename="{epoch}", save_top_k=-1, every_n_epochs=1)
    trainer = quiet_trainer(
        max_epochs=max_epochs,
        limit_train_batches=3,
        limit_val_batches=0,
        enable_checkpointing=True,
        callbacks=[cb, mc],
        **trainer_kw,
    )
    trainer.fit(model, _loader(NEW_TASK), ckpt_path=ckpt_path)
    return model, trainer, cb


@pytest.fixture(scope="module")
def uninterrupted(pretrained, tmp_path_factory):
    L.seed_everything(0, verbose=False)
    tmp = tmp_path_factory.mktemp("ft_ckpts")
    model, trainer, cb = _fit_plain(pretrained, tmp, max_epochs=5)
    lrs = [g["lr"] for g in trainer.optimizers[0].param_groups]
    return model.state_dict(), lrs, cb.unfrozen, tmp


@pytest.mark.parametrize("resume_after_epoch", [0, 1, 2], ids=["before", "at", "after"])
def test_finetune_resume(pretrained, uninterrupted, resume_after_epoch, tmp_path):
    """Resume before (epoch 1), at (epoch 2 unfreezes) and after (epoch 3) the first unfreeze epoch."""
    final, lrs, unfrozen, ckpt_dir = uninterrupted
    ckpt = os.path.join(ckpt_dir, f"epoch={resume_after_epoch}.ckpt")
    assert torch.load(ckpt, weights_only=False)["epoch"] == resume_after_epoch
    fresh = {k: torch.randn_like(v) if v.is_floating_point() else v for k, v in pretrained.items()}
    model, trainer, cb = _fit_plain(fresh, tmp_path, max_epochs=5, ckpt_path=ckpt)
    assert cb.unfrozen == unfrozen == ["net.backbone.6", "net.backbone.4", "net.backbone.3"]
    # split groups (head + 5 layer groups) with OneCycle lrs at the same step as the uninterrupted run
    assert len(trainer.optimizers[0].param_groups) == 6
    assert [g["lr"] for g in trainer.optimizers[0].param_groups] == pytest.approx(lrs)
    for k, v in model.state_dict().items():
        torch.testing.assert_close(v, final[k], msg=k)


def test_finetune_optimizer_without_frozen_params(pretrained):
    model = _PlainModule(pretrained, filter_frozen=True)
    trainer = quiet_trainer(max_epochs=2, limit_train_batches=1, limit_val_batches=0, callbacks=[FineTuneFreezing()])
    with pytest.raises(SpeedupConfigError, match="in no optimizer param group"):
        trainer.fit(model, _loader(NEW_TASK, n=32))
    assert trainer.global_step == 0


class _SaveWeights(L.Callback):
    def __init__(self, out_dir: str) -> None:
        self.out_dir = out_dir

    def on_train_end(self, trainer, pl_module):
        state = {k: v.detach().cpu().clone() for k, v in pl_module.state_dict().items()}
        torch.save(state, os.path.join(self.out_dir, f"rank{trainer.global_rank}.pt"))


@pytest.mark.ddp
def test_finetune_ddp(pretrained, tmp_path):
    model = _model(pretrained)
    cb = FineTuneFreezing(unfreeze_at_epoch=1, unfreeze_every=1, lr_decay=0.5)
    trainer = quiet_trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp_spawn",
        max_epochs=3,
        limit_train_batches=3,
        limit_val_batches=0,
        callbacks=[cb, _SaveWeights(str(tmp_path))],
    )
    trainer.fit(model, _loader(NEW_TASK))
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1))
    params = [n for n, _ in model.named_parameters()]
    for k in params:  # each rank saw different batches: equal weights mean the gradients were synchronised
        assert torch.equal(r0[k], r1[k]), k
    for k in ("backbone.0.1.running_mean", "backbone.3.1.running_var"):  # frozen BN: eval mode on every rank
        assert torch.equal(r0[k], r1[k]), k
    base = {k: v for k, v in _model(pretrained).state_dict().items()}
    assert not torch.equal(r0["backbone.4.0.weight"], base["backbone.4.0.weight"])  # unfrozen at epoch 2: trained
    assert torch.equal(r0["backbone.3.0.weight"], base["backbone.3.0.weight"])  # still frozen
    assert torch.equal(r0["backbone.0.1.running_mean"], base["backbone.0.1.running_mean"])
    assert len(glob.glob(str(tmp_path / "rank*.pt"))) == 2


class _Wrapped(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        from torchvision.models import resnet18

        self.model = resnet18(num_classes=5)


class _NoHead(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Linear(4, 4)
        self.out = nn.Linear(4, 2)


def test_finetune_misconfiguration():
    with pytest.raises(SpeedupConfigError, match="`backbone`=3 is not supported"):
        FineTuneFreezing(backbone=3)
    with pytest.raises(SpeedupConfigError, match="`backbone`=\\[\\] is not supported"):
        FineTuneFreezing(backbone=[])
    with pytest.raises(SpeedupConfigError, match="`unfreeze_at_epoch`=-1 is out of range.*an integer >= 0 or None"):
        FineTuneFreezing(unfreeze_at_epoch=-1)
    with pytest.raises(SpeedupConfigError, match=r"`unfreeze_at_epoch`=1.5 is not an integer \(a float\)"):
        FineTuneFreezing(unfreeze_at_epoch=1.5)
    with pytest.raises(SpeedupConfigError, match="`unfreeze_every`=0 is out of range"):
        FineTuneFreezing(unfreeze_every=0)
    with pytest.raises(SpeedupConfigError, match="`lr_decay`=0 is out of range"):
        FineTuneFreezing(lr_decay=0)
    with pytest.raises(SpeedupConfigError, match="`lr_decay`=1.5 is out of range"):
        FineTuneFreezing(lr_decay=1.5)
    with pytest.raises(SpeedupConfigError, match="`train_bn`='yes' is not supported. Allowed values: True, False"):
        FineTuneFreezing(train_bn="yes")
    with pytest.raises(SpeedupConfigError, match="`schedule`=\\{\\} is not supported.*a non-empty dict"):
        FineTuneFreezing(schedule={})
    with pytest.raises(SpeedupConfigError, match="`schedule` epochs are out of order"):
        FineTuneFreezing(schedule={3: ["backbone.6"], 1: ["backbone.4"]})
    with pytest.raises(SpeedupConfigError, match="`schedule key -1`=-1 is out of range"):
        FineTuneFreezing(schedule={-1: ["backbone.6"]})
    with pytest.raises(SpeedupConfigError, match="`schedule\\[2\\]`=\\[\\] is not supported"):
        FineTuneFreezing(schedule={2: []})
    with pytest.raises(SpeedupConfigError, match="`schedule` and `unfreeze_every` were both given"):
        FineTuneFreezing(schedule={2: ["backbone.6"]}, unfreeze_every=1)
    with pytest.raises(SpeedupConfigError, match="`unfreeze_at_epoch`=3 conflicts with `schedule`"):
        FineTuneFreezing(schedule={2: ["backbone.6"]}, unfreeze_at_epoch=3)

    trainer = quiet_trainer(max_epochs=3)

    def setup(cb, model):
        cb.setup(trainer, model, "fit")

    demo = DemoClassifier(width=8)
    with pytest.raises(SpeedupConfigError, match="'backbon', which is not a submodule.*Close matches: 'backbone'"):
        setup(FineTuneFreezing(backbone="backbon"), demo)
    with pytest.raises(SpeedupConfigError, match="`schedule\\[1\\]` names 'backbone.66'.*Close matches: 'backbone.6'"):
        setup(FineTuneFreezing(schedule={1: ["backbone.66"]}), demo)
    with pytest.raises(SpeedupConfigError, match="`schedule\\[1\\]` names \\['head'\\], which are not part of the"):
        setup(FineTuneFreezing(schedule={1: ["head"]}), demo)
    with pytest.raises(SpeedupConfigError, match="`schedule\\[2\\]`=\\['backbone.6.0'\\] unfreezes no parameter"):
        setup(FineTuneFreezing(schedule={1: ["backbone.6"], 2: ["backbone.6.0"]}), demo)
    with pytest.raises(SpeedupConfigError, match="`backbone`='model' contains the head 'model.fc'"):
        setup(FineTuneFreezing(backbone="model"), _Wrapped())
    with pytest.raises(SpeedupConfigError, match="`backbone` callable returned a module that is not a submodule"):
        setup(FineTuneFreezing(backbone=lambda m: nn.Linear(2, 2)), demo)
    with pytest.raises(SpeedupConfigError, match="could not find the output head of _NoHead"):
        setup(FineTuneFreezing(), _NoHead())
    with pytest.raises(SpeedupConfigError, match="Nothing to train"):
        setup(FineTuneFreezing(backbone=["features", "out"]), _NoHead())


def test_finetune_backbone_specs():
    """Attribute name, list of names and callable all resolve to the same frozen set; auto-detect finds model.fc."""
    trainer = quiet_trainer(max_epochs=3)
    sets = []
    for spec in ("backbone", ["backbone"], lambda m: m.backbone, None):
        model = DemoClassifier(width=8)
        FineTuneFreezing(backbone=spec).setup(trainer, model, "fit")
        sets.append(sorted(n for n, p in model.named_parameters() if not p.requires_grad))
    assert sets[0] == sets[1] == sets[2] == sets[3] and len(sets[0]) == 15
    wrapped = _Wrapped()
    cb = FineTuneFreezing(unfreeze_every=2)
    cb.setup(trainer, wrapped, "fit")
    assert [g.name for g in cb.groups] == [
        "model.layer4",
        "model.layer3",
        "model.layer2",
        "model.layer1",
        "model.conv1+model.bn1",
    ]
    assert [g.epoch for g in cb.groups] == [1, 3, 5, 7, 9]
    assert [n for n, p in wrapped.named_parameters() if p.requires_grad] == ["model.fc.weight", "model.fc.bias"]


# ---- public architectures (issue 12 item 8): groups follow the blocks, lr_decay is real layer-wise decay
class _NetModule(L.LightningModule):
    """A user's plain module: ``self.net = <public model>``, its own SGD (+ OneCycle) over all parameters."""

    def __init__(self, net: nn.Module, tokens: bool = False, onecycle: bool = False) -> None:
        super().__init__()
        self.net = net
        self.tokens = tokens
        self.onecycle = onecycle

    def training_step(self, batch, batch_idx):
        x, y = batch
        out = self.net(input_ids=x).logits if self.tokens else self.net(x)
        return nn.functional.cross_entropy(out, y)

    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)
        if not self.onecycle:
            return opt
        steps = self.trainer.estimated_stepping_batches
        sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=steps)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


class _MixinNetModule(SpeedupMixin, _NetModule):
    """The same through SpeedupMixin: ``configure_optimizers`` from the configs (sgd -> fused kernel on CPU)."""

    def __init__(self, net: nn.Module, tokens: bool = False, onecycle: bool = False) -> None:
        super().__init__(
            net,
            tokens,
            onecycle,
            optimizer_config=OptimizerConfig("sgd", lr=0.1, momentum=0.9),
            scheduler_config=SchedulerConfig("onecycle") if onecycle else None,
        )

    configure_optimizers = SpeedupMixin.configure_optimizers


def _net_data(tokens: bool) -> DataLoader:
    g = torch.Generator().manual_seed(0)
    x = torch.randint(1, 100, (8, 12), generator=g) if tokens else torch.randn(8, 3, 32, 32, generator=g)
    return DataLoader(TensorDataset(x, torch.randint(0, 2, (8,), generator=g)), batch_size=4, shuffle=False)


class _GroupRecorder(L.Callback):
    """Per epoch: trainable parameter names and each parameter's lr."""

    def __init__(self) -> None:
        self.trainable: list[set[str]] = []
        self.lrs: list[dict[str, float]] = []

    def on_train_epoch_start(self, trainer, pl_module):
        self.trainable.append({n for n, p in pl_module.named_parameters() if p.requires_grad})
        lr_of = {id(p): g["lr"] for g in trainer.optimizers[0].param_groups for p in g["params"]}
        self.lrs.append({n: lr_of[id(p)] for n, p in pl_module.named_parameters()})


_CASES = [pytest.param(f, "plain", id=f"{f}-plain") for f in FAMILIES if f != "tv_vit_1_layer"]
_CASES += [pytest.param(f, "mixin", id=f"{f}-mixin") for f in ("tv_vit", "bert", "swin")]


@pytest.mark.parametrize(("family", "path"), _CASES)
def test_finetune_lr_decay_follows_blocks(family, path):
    build, expected = FAMILIES[family]
    tokens = family == "bert"
    model = (_NetModule if path == "plain" else _MixinNetModule)(build(), tokens=tokens)
    cb = FineTuneFreezing(unfreeze_at_epoch=1, unfreeze_every=1, lr_decay=0.65, verbose=False)
    rec = _GroupRecorder()
    trainer = quiet_trainer(max_epochs=3, limit_train_batches=1, limit_val_batches=0, callbacks=[cb, rec])
    trainer.fit(model, _net_data(tokens))
    top_first = [["net." + n for n in g] for g in reversed(expected)]
    assert [g.prefixes for g in cb.groups] == top_first
    assert [g.depth for g in cb.groups] == list(range(1, 1 + len(expected)))
    head = {n for n, _ in model.named_parameters() if not any(n in g.params for g in cb.groups)}
    assert head and all(
        n.startswith(("net.heads", "net.head", "net.classifier", "net.fc", "net.bert.pooler")) for n in head
    )
    for epoch, (lrs, trainable) in enumerate(zip(rec.lrs, rec.trainable, strict=True)):
        assert all(lrs[n] == pytest.approx(0.1) for n in head)
        for g in cb.groups:  # group k from the top trains at lr x 0.65^k, from the first step on
            assert [lrs[n] for n in g.params] == pytest.approx([0.1 * 0.65**g.depth] * len(g.params)), g.name
        unfrozen = [p for g in cb.groups[:epoch] for p in g.params]  # one more block every epoch, top first
        assert trainable == head | set(unfrozen)


@pytest.mark.filterwarnings("ignore:The dirpath has changed")
@pytest.mark.parametrize("path", ["plain", "mixin"])
def test_finetune_resume_vit(path, tmp_path):
    """A wrapped ViT, OneCycle, lr_decay, one encoder layer a epoch: resume after epoch 1 equals the whole run."""
    build = FAMILIES["tv_vit"][0]

    def fit(ckpt_dir, ckpt_path=None):
        L.seed_everything(0, verbose=False)
        model = (_NetModule if path == "plain" else _MixinNetModule)(build(), onecycle=True)
        cb = FineTuneFreezing(unfreeze_at_epoch=1, unfreeze_every=1, lr_decay=0.65, verbose=False)
        mc = ModelCheckpoint(dirpath=ckpt_dir, filename="{epoch}", save_top_k=-1)
        trainer = quiet_trainer(max_epochs=4, limit_val_batches=0, enable_checkpointing=True, callbacks=[cb, mc])
        trainer.fit(model, _net_data(False), ckpt_path=ckpt_path)
        return model, trainer, cb

    full, full_trainer, _ = fit(tmp_path / "full")
    resumed, trainer, cb = fit(tmp_path / "resumed", str(tmp_path / "full" / "epoch=1.ckpt"))
    assert len(cb.unfrozen) == 3 and len(trainer.optimizers[0].param_groups) >= 5  # head + 4 layer groups
    assert [g["lr"] for g in trainer.optimizers[0].param_groups] == pytest.approx(
        [g["lr"] for g in full_trainer.optimizers[0].param_groups]
    )
    for (key, a), b in zip(full.state_dict().items(), resumed.state_dict().values(), strict=True):
        torch.testing.assert_close(b, a, msg=key)


def test_finetune_explicit_schedule_with_block_names():
    model = _NetModule(FAMILIES["tv_vit"][0]())
    cb = FineTuneFreezing(
        schedule={
            1: ["net.encoder.layers.encoder_layer_2", "net.encoder.ln"],
            2: ["net.encoder.layers.encoder_layer_1"],
        }
    )
    cb.setup(quiet_trainer(max_epochs=3), model, "fit")
    assert [g.name for g in cb.groups][:2] == [
        "net.encoder.layers.encoder_layer_2+net.encoder.ln",
        "net.encoder.layers.encoder_layer_1",
    ]
    assert cb.groups[-1].epoch is None and "net.class_token" in cb.groups[-1].params  # the rest stays frozen
