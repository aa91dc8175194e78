"""Muon for the hidden matrices, AdamW for the rest, as one optimizer (``OptimizerConfig("muon")``).

Which tensor goes where on models nobody here wrote (torchvision ResNet, timm ViT, Hugging Face GPT-2, an LSTM) and on
a minimal GPT with a tied ``lm_head``; that each part steps exactly as torch's own optimizer; that Lightning sees one
optimizer (schedulers, ``lr_mult`` groups, clipping, accumulation, fine-tuning groups, pruning rebuilds, resume,
``weights_only`` reload, DDP); and the refusals.
"""

from __future__ import annotations

import copy
from typing import Any

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

import lightning_speedups as ls
from lightning_speedups._errors import SpeedupConfigError
from lightning_speedups.callbacks.pruning import Pruning
from lightning_speedups.optim import OptimizerConfig, SchedulerConfig, SpeedupMixin, create_optimizer
from lightning_speedups.optim.muon import MuonWithAdamW, assign_muon, muon_from_optimizer, muon_param_groups
from tests.fsdp_cpu import CPUFSDPStrategy
from tests.helpers import RankReport, quiet_trainer

VOCAB = 64
BLOCK = 16


class Block(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.out = nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, 2, d // 2).permute(2, 0, 3, 1, 4)
        x = x + self.proj(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class TinyGPT(nn.Module):
    """A minimal GPT as people write it: the head named ``lm_head`` and tied to the token embedding."""

    def __init__(self, d: int = 32, layers: int = 2) -> None:
        super().__init__()
        self.wte = nn.Embedding(VOCAB, d)
        self.wpe = nn.Embedding(BLOCK, d)
        self.blocks = nn.ModuleList([Block(d) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, VOCAB, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))


class GPTModule(SpeedupMixin, L.LightningModule):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.model = TinyGPT()

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        (idx,) = batch
        logits = self.model(idx[:, :-1])
        return F.cross_entropy(logits.reshape(-1, VOCAB), idx[:, 1:].reshape(-1))


def _tokens(n: int = 32, batch_size: int = 4) -> DataLoader:
    g = torch.Generator().manual_seed(0)
    # a learnable stream: each token is the previous one plus 1 (mod VOCAB), from a random start
    start = torch.randint(0, VOCAB, (n, 1), generator=g)
    return DataLoader(TensorDataset((start + torch.arange(BLOCK + 1)) % VOCAB), batch_size=batch_size)


def _gpt(seed: int = 0, **config: Any) -> GPTModule:
    L.seed_everything(seed, verbose=False)
    config.setdefault("optimizer_config", OptimizerConfig("muon", lr=3e-3, weight_decay=0.1))
    return GPTModule(**config)


# ---------------------------------------------------------------------------------------------- which tensor where
def test_muon_assignment_minimal_gpt_with_tied_head() -> None:
    _, report = assign_muon(TinyGPT())
    assert sorted({n.split(".", 2)[2] for n in report.muon}) == ["fc.weight", "out.weight", "proj.weight", "qkv.weight"]
    assert len(report.muon) == 8
    assert report.adamw["wte.weight"] == "tied embedding"  # the tied head is the same tensor: one entry
    assert "lm_head.weight" not in report.adamw and "lm_head.weight" not in report.muon
    assert report.adamw["wpe.weight"] == "embedding"
    assert report.adamw["blocks.0.ln1.weight"] == "not 2-D" and report.adamw["blocks.1.qkv.bias"] == "not 2-D"
    text = report.to_text()
    assert text == (
        "Muon: 8 matrices (blocks.*.qkv.weight, +3 more); AdamW: 20 (1 tied embedding, 1 embedding, 18 not 2-D); "
        "convs on AdamW"
    )
    assert "adamw wte.weight  (tied embedding)" in report.details().splitlines()


def test_muon_assignment_untied_head_by_name_and_last_linear() -> None:
    gpt = TinyGPT()
    gpt.lm_head.weight = nn.Parameter(torch.randn(VOCAB, 32))
    _, report = assign_muon(gpt)
    assert report.adamw["lm_head.weight"] == "head" and report.adamw["wte.weight"] == "embedding"
    mlp = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 3))
    _, report = assign_muon(mlp)  # no head by name: the last linear layer is the head
    assert report.muon == ["0.weight", "2.weight"] and report.adamw["4.weight"] == "head"


def test_muon_assignment_torchvision_resnet_convolutions() -> None:
    from torchvision.models import resnet18

    net = resnet18(num_classes=10)
    with pytest.raises(SpeedupConfigError, match=r"`name`='muon' found no hidden matrix.*conv': 'muon'"):
        assign_muon(net)  # every weight is a conv kernel, a norm or the head: nothing for Muon with conv="adamw"
    kinds, report = assign_muon(net, conv="muon")
    assert report.adamw["conv1.weight"] == "input conv" and report.adamw["fc.weight"] == "head"
    assert "layer1.0.conv1.weight" in report.muon and "layer2.0.downsample.0.weight" in report.muon
    assert len(report.muon) == 19 and kinds[id(net.layer1[0].conv1.weight)] == "conv"
    assert report.adamw["bn1.weight"] == "not 2-D"


def test_muon_assignment_lstm() -> None:
    net = nn.ModuleDict({"emb": nn.Embedding(VOCAB, 8), "rnn": nn.LSTM(8, 16, num_layers=2), "fc": nn.Linear(16, 2)})
    _, report = assign_muon(net)
    assert sorted(report.muon) == sorted(f"rnn.weight_{k}_l{i}" for k in ("ih", "hh") for i in range(2))
    assert report.adamw["emb.weight"] == "embedding" and report.adamw["fc.weight"] == "head"
    assert report.adamw["rnn.bias_ih_l0"] == "not 2-D"


def test_muon_assignment_hf_gpt2_conv1d_and_tied_head() -> None:
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=VOCAB, n_positions=BLOCK)
    net = transformers.GPT2LMHeadModel(cfg)
    _, report = assign_muon(net)
    # HF's Conv1D holds (in, out) matrices: Muon takes them like nn.Linear's
    assert sorted({n.split(".", 3)[3] for n in report.muon}) == [
        "attn.c_attn.weight",
        "attn.c_proj.weight",
        "mlp.c_fc.weight",
        "mlp.c_proj.weight",
    ]
    assert report.adamw["transformer.wte.weight"] == "tied embedding"
    assert report.adamw["transformer.wpe.weight"] == "embedding"
    assert all(why == "not 2-D" for n, why in report.adamw.items() if "ln_" in n)


def test_muon_assignment_timm_vit() -> None:
    timm = pytest.importorskip("timm")
    net = timm.create_model(
        "vit_tiny_patch16_224", pretrained=False, num_classes=10, img_size=32, patch_size=8, depth=2
    )
    _, report = assign_muon(net)
    assert sorted({n.split(".", 2)[2] for n in report.muon}) == [
        "attn.proj.weight",
        "attn.qkv.weight",
        "mlp.fc1.weight",
        "mlp.fc2.weight",
    ]
    assert report.adamw["patch_embed.proj.weight"] == "conv" and report.adamw["head.weight"] == "head"
    assert report.adamw["cls_token"] == "not 2-D" and report.adamw["pos_embed"] == "not 2-D"


# ------------------------------------------------------------------------------------------ the update itself
def test_muon_parts_step_as_torchs_own_optimizers() -> None:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 3))
    ref = copy.deepcopy(net)
    groups, _ = muon_param_groups(net, [{"params": list(net.parameters())}])
    hybrid = MuonWithAdamW(groups, lr=0.02, weight_decay=0.1, warmup_steps=0, ns_dtype="bfloat16")
    hidden = [ref[0].weight, ref[2].weight]
    rest = [p for p in ref.parameters() if all(p is not h for h in hidden)]
    muon = torch.optim.Muon(hidden, lr=0.02, weight_decay=0.1, adjust_lr_fn="match_rms_adamw")
    adamw = torch.optim.AdamW(rest, lr=0.02, weight_decay=0.1)
    for _ in range(3):
        x = torch.randn(5, 6)
        for model in (net, ref):
            model.zero_grad()
            model(x).square().mean().backward()
        hybrid.step()
        muon.step()
        adamw.step()
    for a, b in zip(net.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(a, b)


def test_muon_conv_kernels_step_as_their_matrix() -> None:
    torch.manual_seed(0)
    conv = nn.Conv2d(4, 6, 3)
    matrix = nn.Parameter(conv.weight.detach().reshape(6, -1).clone())
    hybrid = MuonWithAdamW([{"params": [conv.weight], "use_muon": True}], lr=0.01, warmup_steps=0, ns_dtype="bfloat16")
    assert hybrid.param_groups[0]["muon_kind"] == "conv"
    muon = torch.optim.Muon([matrix], lr=0.01, adjust_lr_fn="match_rms_adamw")
    for _ in range(3):
        grad = torch.randn(6, 4, 3, 3)
        conv.weight.grad = grad.clone()
        matrix.grad = grad.reshape(6, -1).clone()
        hybrid.step()
        muon.step()
    torch.testing.assert_close(conv.weight.detach().reshape(6, -1), matrix.detach(), atol=1e-5, rtol=1e-4)


def test_muon_float32_newton_schulz_is_the_same_update_more_precisely() -> None:
    """The fp32 iterations (for CPUs without bf16 units) give torch's bf16 update up to bf16's rounding."""
    torch.manual_seed(0)
    weights = {dtype: nn.Parameter(torch.randn(16, 48)) for dtype in ("bfloat16", "float32")}
    weights["float32"].data.copy_(weights["bfloat16"].data)
    opts = {
        dtype: MuonWithAdamW([{"params": [w], "use_muon": True}], lr=0.01, warmup_steps=0, ns_dtype=dtype)
        for dtype, w in weights.items()
    }
    for _ in range(3):
        grad = torch.randn(16, 48)
        for dtype, w in weights.items():
            w.grad = grad.clone()
            opts[dtype].step()
    moved = (weights["float32"] - weights["bfloat16"]).abs().max()
    assert 0 < moved < 2e-3  # differs (its own path), by bf16 rounding only


def test_muon_warmup_ramps_every_group_and_keeps_the_scheduled_lr() -> None:
    w = nn.Parameter(torch.zeros(4, 4))
    b = nn.Parameter(torch.zeros(4))
    opt = MuonWithAdamW([{"params": [w], "use_muon": True}, {"params": [b]}], lr=0.1, weight_decay=0, warmup_steps=3)
    steps = []
    for _ in range(5):
        before = b.detach().clone()
        b.grad = torch.ones(4)
        w.grad = torch.eye(4)
        opt.step()
        steps.append(float((before - b.detach()).abs().max()))
        assert [g["lr"] for g in opt.param_groups] == [0.1, 0.1]  # a scheduler's value is left as it set it
    # AdamW's first steps move by about lr: ramped 1/4, 2/4, 3/4 of it, then the full lr
    assert steps == pytest.approx([0.025, 0.05, 0.075, 0.1, 0.1], rel=1e-3)
    assert [g["steps_taken"] for g in opt.param_groups] == [5, 5]


def test_muon_from_a_users_optimizer_keeps_its_groups() -> None:
    net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    user = torch.optim.AdamW(
        [{"params": net[0].parameters(), "lr": 1e-3}, {"params": list(net[2:].parameters())}],
        lr=3e-3,
        betas=(0.8, 0.95),
        weight_decay=0.05,
    )
    muon = muon_from_optimizer(user, net)
    assert [(g["lr"], g["use_muon"], len(g["params"])) for g in muon.param_groups] == [
        (1e-3, False, 1),
        (1e-3, True, 1),
        (3e-3, False, 3),
        (3e-3, True, 1),
    ]
    assert muon.defaults["betas"] == (0.8, 0.95) and muon.param_groups[0]["weight_decay"] == 0.05
    assert muon.assignment.muon == ["0.weight", "2.weight"]


# ---------------------------------------------------------------------------------------------- in a Lightning fit
def test_muon_fit_with_scheduler_lr_mult_clipping_and_accumulation() -> None:
    opt = OptimizerConfig("muon", lr=3e-3, weight_decay=0.1, lr_multipliers={"model.blocks.0": 0.5})
    model = _gpt(optimizer_config=opt, scheduler_config=SchedulerConfig("linear_warmup_cosine", warmup=2))
    losses: list[float] = []

    class Losses(L.Callback):
        def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, *args: Any) -> None:
            losses.append(float(outputs["loss"]))

    trainer = quiet_trainer(max_steps=8, gradient_clip_val=1.0, accumulate_grad_batches=2, callbacks=[Losses()])
    trainer.fit(model, _tokens(64))
    (optimizer,) = trainer.optimizers
    assert isinstance(optimizer, MuonWithAdamW) and len(trainer.lr_scheduler_configs) == 1
    mults = {g["name"]: g["lr_mult"] for g in optimizer.param_groups}
    assert mults["model.blocks.0/muon"] == 0.5 and mults["default/muon"] == 1.0
    assert all("momentum_buffer" in optimizer.state[p] for p in model.model.blocks[1].qkv.parameters() if p.ndim == 2)
    assert optimizer.param_groups[0]["steps_taken"] == 8
    assert sum(losses[-4:]) < sum(losses[:4])


def test_muon_with_finetuning_groups_pruning_rebuild_and_ema() -> None:
    class Net(SpeedupMixin, L.LightningModule):
        def __init__(self) -> None:
            super().__init__(optimizer_config=OptimizerConfig("muon", lr=3e-3, weight_decay=0.01))
            self.backbone = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU())
            self.head = nn.Linear(32, 4)
            self.example_input_array = torch.zeros(2, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(self.backbone(x))

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            return F.cross_entropy(self(x), y)

    g = torch.Generator().manual_seed(0)
    data = DataLoader(TensorDataset(torch.randn(32, 8, generator=g), torch.randint(0, 4, (32,), generator=g)), 8)
    L.seed_everything(0, verbose=False)
    net = Net()
    callbacks = [
        ls.FineTuneFreezing(unfreeze_at_epoch=1, unfreeze_every=1, lr_decay=0.5, verbose=False),
        Pruning(amount=0.5, start_epoch=2),
        ls.EMA(decay=0.9),
    ]
    trainer = quiet_trainer(max_epochs=3, callbacks=callbacks)
    trainer.fit(net, data)
    (optimizer,) = trainer.optimizers
    assert isinstance(optimizer, MuonWithAdamW)
    assert net.backbone[0].out_features == 16  # pruned structurally, the optimizer rebuilt around it
    assert all(p.requires_grad for p in net.parameters())
    muon_params = {id(p) for g in optimizer.param_groups if g["use_muon"] for p in g["params"]}
    assert muon_params == {id(net.backbone[0].weight), id(net.backbone[2].weight)}
    assert len({g["lr"] for g in optimizer.param_groups}) > 1  # fine-tuning's discriminative learning rates


def test_muon_resume_mid_epoch_equals_uninterrupted_and_loads_weights_only(tmp_path) -> None:
    # one batch repeated: a plain DataLoader restarts its epoch on a mid-epoch resume, and here that cannot change
    # what the steps see, so any difference is the optimizer's
    (batch,) = next(iter(_tokens(4)))
    data = DataLoader(TensorDataset(batch.repeat(16, 1)), batch_size=4)

    def fit(ckpt_path: str | None = None) -> GPTModule:
        model = _gpt(scheduler_config=SchedulerConfig("linear_warmup_cosine", warmup=2))
        every = ModelCheckpoint(dirpath=tmp_path, filename="{step}", every_n_train_steps=3, save_top_k=-1)
        trainer = quiet_trainer(max_steps=7, enable_checkpointing=True, callbacks=[every])
        trainer.fit(model, data, ckpt_path=ckpt_path)  # 4 batches an epoch: step 3 is mid-epoch
        return model

    full = fit()
    ckpt = tmp_path / "step=3.ckpt"
    state = torch.load(ckpt, weights_only=True)
    (saved,) = state["optimizer_states"]
    assert {g["muon_kind"] for g in saved["param_groups"]} == {"adamw", "matrix"}
    assert saved["param_groups"][0]["steps_taken"] == 3
    resumed = fit(str(ckpt))
    for (key, a), b in zip(full.state_dict().items(), resumed.state_dict().values(), strict=True):
        torch.testing.assert_close(b, a, msg=key)


# ------------------------------------------------------------------------------------------------------ refusals
def test_muon_misconfiguration() -> None:
    cnn = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4, 2))
    with pytest.raises(SpeedupConfigError, match=r"`name`='muon' found no hidden matrix to orthogonalise in Sequent"):
        create_optimizer(nn.Sequential(nn.Conv2d(3, 4, 3), nn.Conv2d(4, 2, 3)), OptimizerConfig("muon"))
    with pytest.raises(SpeedupConfigError, match=r"`conv`='kernel' is not supported.*'adamw', 'muon'"):
        create_optimizer(cnn, OptimizerConfig("muon", kwargs={"conv": "kernel"}))
    with pytest.raises(SpeedupConfigError, match=r"`name`='muon' needs the module, not a list of parameters"):
        create_optimizer(list(nn.Linear(2, 2).parameters()), OptimizerConfig("muon"))
    with pytest.raises(SpeedupConfigError, match=r"`adjust_lr_fn`='rms'.*'match_rms_adamw', 'original'"):
        create_optimizer(TinyGPT(), OptimizerConfig("muon", kwargs={"adjust_lr_fn": "rms"}))
    with pytest.raises(SpeedupConfigError, match=r"`ns_dtype`='half' is not supported.*'auto', 'bfloat16', 'float32'"):
        create_optimizer(TinyGPT(), OptimizerConfig("muon", kwargs={"ns_dtype": "half"}))
    with pytest.raises(SpeedupConfigError, match=r"`warmup_steps`=-1 is out of range"):
        create_optimizer(TinyGPT(), OptimizerConfig("muon", kwargs={"warmup_steps": -1}))
    with pytest.raises(SpeedupConfigError, match=r"`use_muon`=True on a group 'x' whose tensors have \[1\] dim"):
        MuonWithAdamW([{"params": [nn.Parameter(torch.zeros(3))], "use_muon": True, "name": "x"}])
    with pytest.raises(SpeedupConfigError, match=r"`name`='muons' is not a registered optimizer.*'muon'"):
        OptimizerConfig("muons")


def test_muon_refuses_a_sharded_strategy_before_any_step() -> None:
    model = _gpt()
    trainer = quiet_trainer(max_steps=1, strategy=CPUFSDPStrategy())
    model.trainer = trainer
    with pytest.raises(SpeedupConfigError, match=r"`strategy`=CPUFSDPStrategy is not supported by the 'muon' opt"):
        model.configure_optimizers()


def _hybrid(trainer: L.Trainer) -> bool:
    return isinstance(trainer.optimizers[0], MuonWithAdamW)


@pytest.mark.ddp
def test_muon_ddp_ranks_agree(tmp_path) -> None:
    model = _gpt()
    callbacks = [RankReport(tmp_path, hybrid=_hybrid)]
    trainer = quiet_trainer(max_steps=4, devices=2, strategy="ddp_spawn", callbacks=callbacks)
    trainer.fit(model, _tokens(64))
    reports = RankReport.read(tmp_path)
    assert all(r["hybrid"] for r in reports)
    assert reports[0]["checksum"] == pytest.approx(reports[1]["checksum"], rel=1e-9)
