"""autotune's model kinds: the time-to-accuracy methods enter the default plan only for the kinds their evidence covers
(conv today), with one note for the others; named in ``methods`` they are added whatever the kind, and the plan never
quotes another kind's numbers (issue 23). No timing asserted."""

from __future__ import annotations

import lightning as L
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_speedups.autotune import autotune
from lightning_speedups.autotune.kinds import EVIDENCE, KINDS, evidence_text, hurt_tasks, model_kind, proven_kinds
from lightning_speedups.autotune.methods import plan_methods
from lightning_speedups.callbacks.ema import EMA
from lightning_speedups.callbacks.fast_schedule import FastSchedule
from lightning_speedups.demo import DemoClassifier
from tests.test_autotune_methods import _loader as _image_loader


class _TokenClassifier(L.LightningModule):
    """Token ids -> class: an embedding, then a ``body`` ("transformer": nn.TransformerEncoder, "gru": nn.GRU)."""

    def __init__(self, body: str = "transformer") -> None:
        super().__init__()
        self.body_kind = body
        self.embed = nn.Embedding(50, 16)
        if body == "transformer":
            self.body = nn.TransformerEncoder(nn.TransformerEncoderLayer(16, 2, 32, batch_first=True), 1)
        else:
            self.body = nn.GRU(16, 16, batch_first=True)
        self.head = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.body(self.embed(x))
        h = h[0] if isinstance(h, tuple) else h
        return self.head(h.mean(1))

    def training_step(self, batch, batch_idx):  # noqa: ANN001, ANN201
        x = batch[0]
        y = batch[1]
        return nn.functional.cross_entropy(self(x), y)

    def configure_optimizers(self):  # noqa: ANN201
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def _tokens(n: int = 32, length: int = 12, batch_size: int = 8) -> DataLoader:
    g = torch.Generator().manual_seed(0)
    return DataLoader(
        TensorDataset(torch.randint(0, 50, (n, length), generator=g), torch.randint(0, 4, (n,), generator=g)),
        batch_size=batch_size,
    )


class _CausalSelfAttention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(8, 24)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        return nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)


class _Mixer(nn.Module):  # no attention in any name: only its forward calls SDPA
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.scaled_dot_product_attention(self.proj(x), x, x)


class PreTrainedModel(nn.Module):  # what a Hugging Face model derives from, by name
    pass


class _HFLike(PreTrainedModel):
    def __init__(self) -> None:
        super().__init__()
        self.dense = nn.Linear(4, 4)


@pytest.mark.parametrize(
    ("build", "kind"),
    [
        (lambda: DemoClassifier(width=4), "conv"),
        (lambda: _TokenClassifier("transformer"), "transformer"),
        (lambda: _TokenClassifier("gru"), "recurrent"),
        (lambda: nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)), "mlp"),
        (lambda: nn.Sequential(nn.Conv2d(3, 8, 3), nn.MultiheadAttention(8, 2)), "transformer"),
        (lambda: nn.Sequential(_CausalSelfAttention()), "transformer"),
        (lambda: nn.Sequential(_Mixer()), "transformer"),
        (lambda: _HFLike(), "transformer"),
        (lambda: nn.Sequential(nn.Conv2d(3, 8, 3), nn.LSTM(8, 8)), "recurrent"),
        (lambda: nn.Sequential(nn.Conv1d(3, 8, 3), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(6, 2)), "conv"),
        (lambda: nn.Sequential(nn.Conv3d(1, 4, 3), nn.ReLU()), "conv"),
        (lambda: nn.Sequential(nn.Linear(4, 16), nn.Unflatten(1, (4, 4)), nn.ConvTranspose1d(4, 2, 3)), "conv"),
        (lambda: nn.Sequential(nn.LazyConv1d(8, 3)), "conv"),
        (lambda: nn.Sequential(nn.Conv1d(3, 8, 3), nn.GRU(8, 8)), "recurrent"),
    ],
    ids=[
        "demo-cnn",
        "encoder",
        "gru",
        "mlp",
        "mha",
        "attn-name",
        "sdpa-call",
        "hf",
        "crnn",
        "conv1d",
        "conv3d",
        "conv-transpose1d",
        "lazy-conv1d",
        "crnn-1d",
    ],
)
def test_model_kind(build, kind):
    assert model_kind(build()) == kind and kind in KINDS


def test_a_1d_cnn_reads_as_conv_and_its_default_plan_follows_the_conv_evidence():
    # issue 50: the workload suite's 1-D CNN (Conv1d, BatchNorm1d, pooling, a linear head) read as "mlp"; as a conv
    # model it gets the conv kind's default (today neither method: a conv task slowed each) and the conv rows' note
    from benchmarks.workloads.signals import signal_cnn

    net = signal_cnn(width=4)
    assert model_kind(net, torch.zeros(2, 3, 64)) == "conv"
    kept, note = plan_methods(None, "conv")
    assert kept == [] and note is not None
    assert "ema made a conv task slower to its target (segment_unet)" in note
    assert "schedule made a conv task slower to its target (resnet18_cifar)" in note
    assert "no evidence for this model kind" not in note  # the conv rows apply: no "mlp" note any more


def test_a_method_is_default_only_where_it_helped_and_slowed_no_task_of_the_kind():
    # the EMA and the schedule helped digits and shapes (conv) but the EMA slowed the U-Net and the schedule resnet18
    # (both conv): do no harm takes each out of the conv default
    assert proven_kinds("ema") == () and proven_kinds("schedule") == ()
    assert {e.task for e in EVIDENCE} == {"digits", "shapes", "segment_unet", "denoise_dncnn", "resnet18_cifar"}
    assert {e.task for e in EVIDENCE if e.split == "held_out"} == {"denoise_dncnn"}
    assert hurt_tasks("ema", "conv") == ["segment_unet"] and hurt_tasks("schedule", "conv") == ["resnet18_cifar"]
    text = evidence_text("ema", "conv")
    assert "[6, 6, 7, 5] without it, [3, 4, 3, 3] with it" in text
    assert "segment_unet (slower with it), median seconds to val_miou 0.50" in text and "62.1 without it" in text
    other = evidence_text("ema", "transformer")
    assert other == "no bench evidence for transformer models (the default plan has it for no model kind)"
    assert evidence_text("schedule", "mlp").endswith("(the default plan has it for no model kind)")
    assert "resnet18_cifar (slower with it), median seconds to val_acc 0.70" in evidence_text("schedule", "conv")


def test_one_task_where_a_method_hurt_removes_its_kind_and_a_new_kind_joins_on_a_gain(monkeypatch):
    from lightning_speedups.autotune import kinds

    rows = (
        kinds.Evidence("ema", "mlp", "a", "m", "3", "2", "held_out"),
        kinds.Evidence("ema", "conv", "b", "m", "3", "2"),
        kinds.Evidence("ema", "conv", "c", "m", "3", "4", "held_out", helps=False),
    )
    monkeypatch.setattr(kinds, "EVIDENCE", rows)
    assert proven_kinds("ema") == ("mlp",) and proven_kinds("schedule") == ()
    assert plan_methods(None, "mlp") == (
        ["ema"],
        "schedule not added: no evidence for this model kind (mlp): "
        "schedule is in the default plan of no model kind; a few trial steps cannot "
        "time a gain in epochs. HINT: pass `methods=['ema', 'schedule']` to add it "
        "anyway.",
    )
    kept, note = plan_methods(None, "conv")
    assert kept == []
    assert note.startswith(
        "ema, schedule not added: no evidence for this model kind (conv): schedule is in the "
        "default plan of no model kind; ema made a conv task slower to its target (c), so no conv "
        "model gets it by default (do no harm);"
    )
    assert plan_methods(["ema"], "conv") == (["ema"], None)  # named: added, whatever the evidence


def _plan(model: L.LightningModule, loader: DataLoader, **kw):
    return autotune(model, loader, candidates=[], budget_s=5.0, cache=False, accelerator="cpu", max_epochs=2, **kw)


@pytest.mark.parametrize(("body", "kind"), [("transformer", "transformer"), ("gru", "recurrent")])
def test_no_method_by_default_for_a_model_kind_without_evidence(body, kind):
    plan = _plan(_TokenClassifier(body), _tokens())
    assert plan.choices == [] and plan.callbacks == [] and "ema" not in plan.settings
    notes = [n for n in plan.notes if "not added" in n]
    assert notes == [
        f"ema, schedule not added: no evidence for this model kind ({kind}): ema is in the default plan "
        "of no model kind, schedule is in the default plan of no model kind; a few trial steps cannot "
        "time a gain in epochs. HINT: pass `methods=['ema', 'schedule']` to add them anyway."
    ]
    text = plan.to_text()
    assert "[6, 6, 7, 5]" not in text and "digits" not in text and "shapes" not in text


def test_a_method_named_explicitly_is_added_for_any_kind_with_an_honest_note():
    plan = _plan(_TokenClassifier("transformer"), _tokens(), methods=["ema"])
    (choice,) = plan.choices
    assert choice.name == "ema" and [type(cb) for cb in plan.callbacks] == [EMA]
    assert (
        "no bench evidence for transformer models (the default plan has it for no model kind): added because "
        "`methods` names it" in choice.note
    )
    assert not any("not added" in n for n in plan.notes)
    text = plan.to_text()
    assert "[6, 6, 7, 5]" not in text and "digits" not in text


def test_a_conv_model_gets_the_methods_only_when_named():
    plan = _plan(DemoClassifier(width=4), _image_loader())
    assert plan.choices == [] and plan.callbacks == []
    (note,) = [n for n in plan.notes if "not added" in n]
    assert note.startswith(
        "ema, schedule not added: ema made a conv task slower to its target (segment_unet), so no "
        "conv model gets it by default (do no harm); schedule made a conv task slower to its target "
        "(resnet18_cifar)"
    )
    named = _plan(DemoClassifier(width=4), _image_loader(), methods=["ema", "schedule"])
    assert [type(cb) for cb in named.callbacks] == [EMA, FastSchedule]
    ema_note = named.choices[0].note
    assert "[3, 4, 3, 3]" in ema_note and "segment_unet (slower with it)" in ema_note
    assert ema_note.count("added because `methods` names it") == 1
    assert not any("not added" in n for n in named.notes)


# ---- kinds read from one forward when the source of `forward` cannot be read (issue 51)
def _windows(n: int = 16, length: int = 16) -> DataLoader:
    g = torch.Generator().manual_seed(0)
    seq = torch.randint(0, 64, (n, length + 1), generator=g)
    return DataLoader(TensorDataset(seq[:, :-1], seq[:, 1:]), batch_size=8)


def test_model_kind_of_decoder_lms():
    from tests.lm_models import LMModule, MiniGPT

    assert model_kind(MiniGPT()) == "transformer"  # its source calls scaled_dot_product_attention (and names `attn`)
    assert model_kind(LMModule("mini")) == "transformer"
    pytest.importorskip("transformers")
    assert model_kind(LMModule("gpt2")) == "transformer"  # a PreTrainedModel inside


def test_model_kind_from_one_forward_when_the_source_cannot_be_read():
    from tests.lm_models import exec_classes

    built = exec_classes()  # classes built by `exec`: inspect.getsource fails, no attention in any name
    gpt = built["ExecGPT"]()
    mlp = built["ExecMLP"]()
    batch = next(iter(_windows()))
    assert model_kind(gpt) == "mlp"  # nothing to read and no batch: the module rules only
    gpt.train()
    before = {k: v.clone() for k, v in gpt.state_dict().items()}
    assert model_kind(gpt, batch) == "transformer"  # matmul, softmax over scores, matmul: attention by hand
    assert gpt.training and all(torch.equal(v, before[k]) for k, v in gpt.state_dict().items())
    assert model_kind(mlp, torch.zeros(8, 8)) == "mlp"  # a softmax over 2-D outputs after linear layers
    namespace = {"nn": nn, "F": nn.functional}
    exec(  # noqa: S102 - a forward with no source, calling SDPA
        "class Sdpa(nn.Module):\n"
        "    def __init__(self):\n        super().__init__()\n        self.p = nn.Linear(8, 8)\n"
        "    def forward(self, x):\n        x = self.p(x)\n        return F.scaled_dot_product_attention(x, x, x)\n",
        namespace,
    )
    assert model_kind(namespace["Sdpa"](), torch.zeros(2, 4, 8)) == "transformer"
    assert model_kind(namespace["Sdpa"](), torch.zeros(2, 4, 3)) == "mlp"  # no form of the batch runs: no trace


def test_autotune_reads_the_kind_of_an_exec_built_gpt_from_its_first_batch():
    from tests.lm_models import exec_classes

    net = exec_classes()["ExecGPT"]

    class ExecLM(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = net()

        def forward(self, idx, targets=None):
            return self.model(idx, targets)

        def training_step(self, batch, batch_idx):
            return self(*batch)

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    plan = _plan(ExecLM(), _windows())
    (note,) = [n for n in plan.notes if "not added" in n]
    assert "no evidence for this model kind (transformer)" in note
