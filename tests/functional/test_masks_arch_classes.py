"""Mask pruning on architecture classes beyond conv/linear: recurrent layers, weight-norm parametrizations, and
modules that need the state dict's version metadata (issue 26). Each class has a minimal hand-written model; the
public model of the class (Wav2Vec2's weight-normed positional conv) is built from a tiny config, offline."""

from __future__ import annotations

import copy

import lightning as L
import pytest
import torch
from torch import nn
from torch.nn.utils import parametrize
from torch.nn.utils.parametrizations import weight_norm
from torch.utils.data import DataLoader, TensorDataset

from lightning_speedups import _compat, load_checkpoint
from lightning_speedups._errors import SpeedupConfigError
from lightning_speedups.callbacks.pruning import MaskPruning
from lightning_speedups.functional.pruning.common import sparsity_report
from lightning_speedups.functional.pruning.masks import (
    attach_mask,
    clean_pruned_state_dict,
    make_pruning_permanent,
    named_masks,
    resolve_mask_key,
    weight_mask,
)
from lightning_speedups.functional.pruning.records import load_pruned, save_pruned
from lightning_speedups.functional.pruning.unstructured import maskable_names, prune_unstructured
from lightning_speedups.functional.qat import prepare_qat, qat_record
from tests.helpers import quiet_trainer


# ---------------------------------------------------------------------------------------------------- models
class RecurrentNet(nn.Module):
    """A recurrent encoder and a linear classifier (the classifier is left dense by default)."""

    def __init__(self, cell: type[nn.RNNBase] = nn.LSTM, **kw) -> None:
        super().__init__()
        self.rnn = cell(6, 8, batch_first=True, **kw)
        self.head = nn.Linear(8 * (2 if kw.get("bidirectional") else 1), 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.rnn(x)[0][:, -1])


class WeightNormedConv(nn.Module):
    """A weight-normed Conv1d over the kernel dimension, as Wav2Vec2's positional convolution."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = weight_norm(nn.Conv1d(4, 6, 3, padding=1), name="weight", dim=2)
        self.head = nn.Linear(6, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.conv(x).mean(-1))


class Versioned(nn.Module):
    """A module that refuses a state dict without its version, as some library modules do."""

    _version = 2

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x).relu()

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, *args, **kwargs):
        version = local_metadata.get("version")
        if version not in (1, 2):
            raise RuntimeError(f"version should be set to 1 or 2 instead of {version}")
        super()._load_from_state_dict(state_dict, prefix, local_metadata, *args, **kwargs)


def _versioned_net() -> nn.Module:
    return nn.Sequential(Versioned(), nn.BatchNorm1d(4), nn.Linear(4, 2))


# ---------------------------------------------------------------------------------------------------- recurrent
@pytest.mark.parametrize(
    ("cell", "kw"), [(nn.LSTM, {}), (nn.GRU, {"num_layers": 2}), (nn.RNN, {"bidirectional": True})]
)
def test_masks_recurrent_weights_are_what_forward_uses(cell, kw):
    torch.manual_seed(0)
    model = RecurrentNet(cell, **kw)
    x = torch.randn(3, 5, 6)
    dense = model(x).detach()
    summary = prune_unstructured(model, 0.5)
    names = maskable_names(model.rnn)
    assert set(summary.layers) == {f"rnn.{n}" for n in names} and weight_mask(model.head) is None
    assert summary.sparsity > 0.3  # recurrent weights are most of the model
    report = sparsity_report(model)  # the public report counts the masked recurrent tensors as forward sees them
    assert {f"rnn.{n}" for n in names} <= set(report.layers) and report.sparsity > 0.3
    # the forward uses the masked weights: an RNN rebuilt from the masked values gives the same output
    plain = cell(6, 8, batch_first=True, **kw)
    with torch.no_grad():
        for n, p in plain.named_parameters():
            p.copy_(getattr(model.rnn, n))
    out = model(x)
    torch.testing.assert_close(out, model.head(plain(x)[0][:, -1]))
    assert not torch.allclose(out, dense)
    # and gradients reach the original Parameter only where the mask keeps the weight
    out.sum().backward()
    original = model.rnn.parametrizations[names[0]].original
    assert bool((original.grad[weight_mask(model.rnn, names[0]) == 0] == 0).all())
    assert float(original.grad.abs().sum()) > 0


def test_masks_recurrent_reload_and_permanent(tmp_path):
    torch.manual_seed(0)
    model = RecurrentNet(nn.LSTM, proj_size=4)
    model.head = nn.Linear(4, 3)
    prune_unstructured(model, 0.4, scope="layer")
    assert "rnn.weight_hr_l0" in named_masks(model)
    module, name = resolve_mask_key(model, "rnn.weight_hh_l0")
    assert module is model.rnn and name == "weight_hh_l0"
    x = torch.randn(2, 5, 6)
    expected = model(x).detach()
    save_pruned(model, tmp_path / "rnn.pt")
    fresh = RecurrentNet(nn.LSTM, proj_size=4)
    fresh.head = nn.Linear(4, 3)
    torch.testing.assert_close(load_pruned(fresh, tmp_path / "rnn.pt")(x), expected)
    params = {id(p) for p in model.parameters()}
    assert make_pruning_permanent(model) == 3
    assert not parametrize.is_parametrized(model.rnn) and {id(p) for p in model.parameters()} == params
    out = model(x)
    torch.testing.assert_close(out, expected)
    out.sum().backward()  # after folding, gradients reach the plain Parameters the forward uses again
    assert model.rnn.weight_hh_l0.grad is not None


class _RecurrentModule(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = RecurrentNet(nn.GRU)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.cross_entropy(self(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        g = torch.Generator().manual_seed(0)
        data = TensorDataset(torch.randn(16, 5, 6, generator=g), torch.randint(0, 3, (16,), generator=g))
        return DataLoader(data, batch_size=4)


def _fit_recurrent(max_epochs: int, ckpt_path=None, **trainer_kw):
    L.seed_everything(0, verbose=False)
    model = _RecurrentModule()
    cb = MaskPruning(amount=0.5, start_epoch=0, end_epoch=1, steps=2, make_permanent=False)
    trainer = quiet_trainer(max_epochs=max_epochs, limit_train_batches=2, callbacks=[cb], **trainer_kw)
    trainer.fit(model, ckpt_path=ckpt_path)
    return model, trainer


def test_masks_recurrent_fit_resume(tmp_path):
    model, trainer = _fit_recurrent(1)
    assert {k for k in named_masks(model)} >= {"net.rnn.weight_ih_l0", "net.rnn.weight_hh_l0"}
    trainer.save_checkpoint(tmp_path / "e1.ckpt")
    state = torch.load(tmp_path / "e1.ckpt", weights_only=True)["state_dict"]
    assert "net.rnn.weight_hh_l0" in state and not any("parametrizations" in k for k in state)
    resumed, _ = _fit_recurrent(2, ckpt_path=tmp_path / "e1.ckpt")
    straight, _ = _fit_recurrent(2)
    # masked-out raw values differ (the checkpoint holds them folded to 0); every weight the forward uses is equal
    clean_resumed, clean_straight = (clean_pruned_state_dict(m.state_dict()) for m in (resumed, straight))
    assert set(clean_resumed) == set(clean_straight)
    for name, value in clean_resumed.items():
        torch.testing.assert_close(value, clean_straight[name], msg=name)
    assert named_masks(resumed).keys() == named_masks(straight).keys()
    x = torch.randn(2, 5, 6)
    fresh = load_checkpoint(_RecurrentModule(), tmp_path / "e1.ckpt")
    torch.testing.assert_close(fresh(x), model(x))


# ---------------------------------------------------------------------------------------------------- weight norm
def test_masks_weight_norm_stack_clean_permanent(tmp_path):
    torch.manual_seed(0)
    model = WeightNormedConv()
    dense_params = sum(p.numel() for p in model.parameters())
    prune_unstructured(model, 0.5)
    plist = model.conv.parametrizations.weight
    assert _compat.is_weight_norm(plist[0]) and weight_mask(model.conv) is not None  # stacked after the norm
    numel, zeros = sparsity_report(model).layers["conv.weight"]  # counted once, mask and norm applied
    assert zeros >= numel // 2 - 1
    x = torch.randn(2, 4, 7)
    expected = model(x).detach()
    state = clean_pruned_state_dict(model.state_dict())
    assert set(state) == set(WeightNormedConv().state_dict())  # the un-masked, weight-normed model's keys
    fresh = WeightNormedConv()
    fresh.load_state_dict(state)
    torch.testing.assert_close(fresh(x), expected)
    save_pruned(model, tmp_path / "wn.pt")
    torch.testing.assert_close(load_pruned(WeightNormedConv(), tmp_path / "wn.pt")(x), expected)
    assert make_pruning_permanent(model) == 1
    assert len(plist) == 1 and _compat.is_weight_norm(plist[0])  # only the mask removed
    assert sum(p.numel() for p in model.parameters()) == dense_params
    torch.testing.assert_close(model(x), expected)


class _WeightNormModule(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = WeightNormedConv()

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        return self(batch[0]).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)

    def train_dataloader(self):
        return DataLoader(TensorDataset(torch.randn(8, 4, 7, generator=torch.Generator().manual_seed(0))), batch_size=4)


def test_masks_weight_norm_fit_reload_resume(tmp_path):
    L.seed_everything(0, verbose=False)
    model = _WeightNormModule()
    dense_params = sum(p.numel() for p in model.parameters())
    cb = MaskPruning(amount=0.5, start_epoch=0, make_permanent=False)
    trainer = quiet_trainer(max_epochs=1, limit_train_batches=2, callbacks=[cb])
    trainer.fit(model)
    trainer.save_checkpoint(tmp_path / "wn.ckpt")
    x = torch.randn(2, 4, 7)
    torch.testing.assert_close(load_checkpoint(_WeightNormModule(), tmp_path / "wn.ckpt")(x), model(x))
    resumed = _WeightNormModule()
    cb = MaskPruning(amount=0.5, start_epoch=0)  # folds the mask in at the end
    quiet_trainer(max_epochs=2, limit_train_batches=2, callbacks=[cb]).fit(resumed, ckpt_path=tmp_path / "wn.ckpt")
    assert not named_masks(resumed) and _compat.is_weight_norm(resumed.net.conv.parametrizations.weight[0])
    assert sum(p.numel() for p in resumed.parameters()) == dense_params
    assert int((resumed.net.conv.weight == 0).sum()) >= resumed.net.conv.weight.numel() // 2
    # the same as not stopping: the checkpoint carries each masked weight norm's raw (g, v) for the resume
    L.seed_everything(0, verbose=False)
    straight = _WeightNormModule()
    cb = MaskPruning(amount=0.5, start_epoch=0)
    quiet_trainer(max_epochs=2, limit_train_batches=2, callbacks=[cb]).fit(straight)
    assert torch.equal(resumed.net.conv.weight, straight.net.conv.weight)


def test_masks_compat_is_weight_norm():
    conv = weight_norm(nn.Conv1d(2, 2, 1))
    assert _compat.is_weight_norm(conv.parametrizations.weight[0]), "update _compat.is_weight_norm for this torch"
    assert not _compat.is_weight_norm(nn.Identity())


def test_masks_weight_norm_group_fully_masked():
    torch.manual_seed(0)
    conv = weight_norm(nn.Conv1d(2, 3, 3), dim=2)
    mask = torch.ones(3, 2, 3)
    mask[:, :, 1] = 0  # empties the whole norm group of kernel position 1
    attach_mask(conv, mask)
    expected = conv.weight.detach().clone()
    fresh = weight_norm(nn.Conv1d(2, 3, 3), dim=2)
    fresh.load_state_dict(clean_pruned_state_dict(conv.state_dict()))
    torch.testing.assert_close(fresh.weight, expected)  # zeros, not NaN
    make_pruning_permanent(conv)
    torch.testing.assert_close(conv.weight, expected)


def test_masks_other_parametrization_refused_by_name():
    model = nn.Sequential(nn.utils.parametrizations.spectral_norm(nn.Linear(4, 4)), nn.Linear(4, 2))
    before = copy.deepcopy(model.state_dict())
    with pytest.raises(SpeedupConfigError, match=r"`0` \(ParametrizedLinear\).*_SpectralNorm.*HINT: pass ignored"):
        prune_unstructured(model, 0.5)
    assert not named_masks(model) and all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_masks_weight_norm_wav2vec2_positional_conv(tmp_path):
    transformers = pytest.importorskip("transformers")
    config = transformers.Wav2Vec2Config(
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=16,
        conv_dim=(8, 8),
        conv_stride=(5, 2),
        conv_kernel=(10, 3),
        num_conv_pos_embeddings=8,
        num_conv_pos_embedding_groups=2,
    )

    def build():
        torch.manual_seed(0)
        return transformers.Wav2Vec2Model(config).eval()

    model = build()
    dense_params = sum(p.numel() for p in model.parameters())
    prune_unstructured(model, 0.3, ignored_layers=[])
    assert "encoder.pos_conv_embed.conv" in named_masks(model)
    x = torch.randn(2, 400)
    expected = model(x).last_hidden_state.detach()
    save_pruned(model, tmp_path / "w2v.pt")
    torch.testing.assert_close(load_pruned(build(), tmp_path / "w2v.pt")(x).last_hidden_state, expected)
    make_pruning_permanent(model)
    assert sum(p.numel() for p in model.parameters()) == dense_params  # the weight norm is kept
    torch.testing.assert_close(model(x).last_hidden_state, expected)


# ---------------------------------------------------------------------------------------------------- metadata
def test_masks_clean_state_dict_keeps_version_metadata(tmp_path):
    model = _versioned_net()
    prune_unstructured(model, 0.5)
    state = clean_pruned_state_dict(model.state_dict())
    assert state._metadata["0"]["version"] == 2 and state._metadata["1"]["version"] == 2
    assert not any("parametrizations" in k for k in state._metadata)
    _versioned_net().load_state_dict(state)  # the module reads its version
    save_pruned(model, tmp_path / "v.pt")
    x = torch.randn(3, 4)
    torch.testing.assert_close(load_pruned(_versioned_net(), tmp_path / "v.pt").eval()(x), model.eval()(x))


def test_masks_qat_checkpoint_keeps_version_metadata(tmp_path):
    pytest.importorskip("torchao")
    model = _versioned_net()
    prepare_qat(model)
    torch.save({"state_dict": model.state_dict(), "lightning_speedups": {"qat": qat_record(model)}}, tmp_path / "q.pt")
    fresh = load_checkpoint(_versioned_net(), tmp_path / "q.pt")
    assert qat_record(fresh) == qat_record(model)


class _VersionedModule(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = _versioned_net()

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        return self(batch[0]).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def train_dataloader(self):
        return DataLoader(TensorDataset(torch.randn(8, 4)), batch_size=4)


def test_masks_pruning_checkpoint_keeps_version_metadata(tmp_path):
    L.seed_everything(0, verbose=False)
    cb = MaskPruning(amount=0.5, start_epoch=0, make_permanent=False)
    model = _VersionedModule()
    trainer = quiet_trainer(max_epochs=1, limit_train_batches=2, callbacks=[cb])
    trainer.fit(model)
    trainer.save_checkpoint(tmp_path / "v.ckpt")
    fresh = load_checkpoint(_VersionedModule(), tmp_path / "v.ckpt")
    x = torch.randn(3, 4)
    torch.testing.assert_close(fresh.eval()(x), model.eval()(x))
    resume = MaskPruning(amount=0.5, start_epoch=0, make_permanent=False)
    trainer = quiet_trainer(max_epochs=2, limit_train_batches=2, callbacks=[resume])
    trainer.fit(_VersionedModule(), ckpt_path=tmp_path / "v.ckpt")  # the strict resume load reads the versions
