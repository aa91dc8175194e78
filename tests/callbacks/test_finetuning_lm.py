"""FineTuneFreezing on decoder LMs (issue 51): a minimal GPT (tied ``lm_head``, loss in ``forward(idx, targets)``) and
a tiny Hugging Face GPT-2 train their head (the tied token embedding with it) first, then unfreeze gradually; the
plan says what happens to the shared tensor; resume matches the uninterrupted run; no head is refused with the names
tried."""

from __future__ import annotations

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn

from lightning_speedups._errors import SpeedupConfigError
from lightning_speedups._heads import HEAD_NAMES
from lightning_speedups.callbacks.finetuning import FineTuneFreezing
from lightning_speedups.optim import SpeedupMixin
from tests.helpers import quiet_trainer
from tests.lm_models import LMModule, exec_classes


class _Frozen(L.Callback):
    """Which parameters train at each epoch's first batch, and each param group's lr."""

    def __init__(self) -> None:
        self.trainable: dict[int, set[str]] = {}
        self.lrs: dict[int, dict[str, float]] = {}

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if batch_idx == 0:
            self.trainable[trainer.current_epoch] = {n for n, p in pl_module.named_parameters() if p.requires_grad}
            names = {id(p): n for n, p in pl_module.named_parameters()}
            self.lrs[trainer.current_epoch] = {
                names[id(p)]: g["lr"] for opt in trainer.optimizers for g in opt.param_groups for p in g["params"]
            }


def _fit(module: L.LightningModule, root=None, ckpt_path=None, **cb_kw):
    cb = FineTuneFreezing(unfreeze_at_epoch=1, unfreeze_every=1, lr_decay=0.5, verbose=False, **cb_kw)
    rec = _Frozen()
    ckpt = [ModelCheckpoint(dirpath=root, filename="{epoch}", save_top_k=-1)] if root is not None else []
    trainer = quiet_trainer(
        max_epochs=3,
        callbacks=[cb, rec, *ckpt],
        limit_train_batches=2,
        enable_checkpointing=root is not None,
        default_root_dir=root,
    )
    trainer.fit(module, ckpt_path=ckpt_path)
    return cb, rec


class _MixinLM(SpeedupMixin, LMModule):
    def __init__(self, net: str = "mini") -> None:
        super().__init__(net, optimizer_config={"name": "adamw", "lr": 1e-3})


@pytest.mark.parametrize("net", ["mini", "gpt2"])
@pytest.mark.parametrize("mixin", [False, True], ids=["plain", "mixin"])
def test_finetune_fit_lm_tied_head(net, mixin, tmp_path):
    if net == "gpt2":
        pytest.importorskip("transformers")
    L.seed_everything(0)
    module = _MixinLM(net) if mixin else LMModule(net)
    cb, rec = _fit(module, tmp_path / "run")
    tied = "model.transformer.wte.weight"  # named_parameters() names the shared tensor by its first holder
    assert rec.trainable[0] == {tied}  # the head is the token embedding: it trains from the first epoch
    assert {"model.transformer.h.1.attn.c_attn.weight", tied} <= rec.trainable[1]
    assert "model.transformer.h.0.attn.c_attn.weight" not in rec.trainable[1]
    assert len(rec.trainable[2]) == len(dict(module.named_parameters())) - 1  # only wpe (the last group) frozen
    assert all(tied not in g.params for g in cb.groups) and "model.transformer.wte" not in cb.groups[-1].prefixes
    lrs = rec.lrs[2]
    assert lrs[tied] == pytest.approx(1e-3)  # the head's lr, not the embedding group's factor
    assert lrs["model.transformer.h.1.attn.c_attn.weight"] == pytest.approx(5e-4)
    assert lrs["model.transformer.h.0.attn.c_attn.weight"] == pytest.approx(2.5e-4)
    text = cb.plan_text()
    assert text.startswith("FineTuneFreezing plan: head: `model.lm_head` (found by its name)")
    assert "`model.lm_head` shares its weight with the embedding `model.transformer.wte`" in text
    assert "trains with the head from the first epoch" in text
    assert "model.transformer.h.1+model.transformer.ln_f: 14 tensors, unfrozen at epoch 1 (lr x0.5)" in text


@pytest.mark.parametrize("net", ["mini", "gpt2"])
def test_finetune_resume_lm(net, tmp_path):
    if net == "gpt2":
        pytest.importorskip("transformers")
    L.seed_everything(0)
    module = LMModule(net)
    _fit(module, tmp_path / "run")
    final = {k: v.clone() for k, v in module.state_dict().items()}
    L.seed_everything(1)
    resumed = LMModule(net)
    _, rec = _fit(resumed, tmp_path / "resume", ckpt_path=tmp_path / "run" / "epoch=1.ckpt")
    assert "model.transformer.h.0.attn.c_attn.weight" in rec.trainable[2]
    for k, v in resumed.state_dict().items():
        torch.testing.assert_close(v, final[k], msg=f"{k} differs from the uninterrupted run")


def test_finetune_head_by_width_from_the_first_batch():
    class ExecLM(LMModule):  # a GPT built by exec: its head is named `out` and not tied
        def __init__(self) -> None:
            super().__init__()
            self.model = exec_classes()["ExecGPT"]()

        def forward(self, idx, targets=None):
            return self.model(idx, targets)

        def training_step(self, batch, batch_idx):
            return self(*batch)

    cb, rec = _fit(ExecLM())
    assert cb.notes == ["head: `model.out` (the last linear layer with the output's width)"]
    assert rec.trainable[0] == {"model.out.weight", "model.out.bias"}
    assert [g.name for g in cb.groups] == ["model.mix.1", "model.mix.0", "model.tok"]


class _NoHeadLM(L.LightningModule):
    def __init__(self, layers: int = 2) -> None:
        super().__init__()
        self.features = nn.Linear(4, 4) if layers == 2 else nn.Identity()
        self.proj = nn.Linear(4, 2)

    def forward(self, x):
        return self.proj(self.features(x))


def test_finetune_lm_misconfiguration():
    trainer = quiet_trainer(max_epochs=2)
    with pytest.raises(SpeedupConfigError) as err:
        FineTuneFreezing().setup(trainer, _NoHeadLM(), "fit")  # no example input: names and ties only
    msg = str(err.value)
    assert "could not find the output head of _NoHeadLM" in msg and all(repr(n) in msg for n in HEAD_NAMES)
    assert "FineTuneFreezing(backbone=...)" in msg
    one_layer = _NoHeadLM(layers=1)
    one_layer.example_input_array = torch.zeros(1, 4)
    with pytest.raises(
        SpeedupConfigError,
        match="the head `proj` \\(the last linear layer with the output's width\\) "
        "holds every parameter of _NoHeadLM: there is no backbone to freeze",
    ):
        FineTuneFreezing().setup(trainer, one_layer, "fit")
    FineTuneFreezing(backbone="features").setup(trainer, _NoHeadLM(), "fit")  # saying what to freeze works


def test_finetune_explicit_backbone_keeps_the_tied_tensor_with_the_head():
    module = LMModule("mini")
    cb = FineTuneFreezing(backbone="model.transformer", verbose=False)  # holds the embedding the head is tied to
    cb.setup(quiet_trainer(max_epochs=2), module, "fit")
    assert {n for n, p in module.named_parameters() if p.requires_grad} == {"model.transformer.wte.weight"}
    assert "so the embedding `model.transformer.wte` trains too" in cb.plan_text()
