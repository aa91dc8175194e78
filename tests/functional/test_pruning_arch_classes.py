"""Structured pruning on the architecture classes of issue 26: each class pruned in the mechanism or refused by name.

Every class has a minimal hand-written model (and, where it builds offline in seconds, the public one): branches that
run only in training, several output heads, encoder-decoders with cache objects in their outputs, channel shuffles
and token-mixing MLPs, tied embeddings and recurrent layers. A refusal must name the module and leave the model
exactly as it was (same structure, same tensors).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
import torch
from torch import nn

from lightning_speedups import SpeedupConfigError
from lightning_speedups.functional import prune_structured

tp = pytest.importorskip("torch_pruning")
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # torch-pruning warns about unwrapped parameters


def _snapshot(model: nn.Module) -> tuple[str, dict[str, torch.Tensor], list[int]]:
    return (
        str(model),
        {k: v.detach().clone() for k, v in model.state_dict().items()},
        [id(p) for p in model.parameters()],
    )


def _assert_unchanged(model: nn.Module, snap: tuple[str, dict[str, torch.Tensor], list[int]]) -> None:
    structure, state, ids = snap
    assert str(model) == structure
    now = model.state_dict()
    assert now.keys() == state.keys()
    assert all(torch.equal(now[k], v) for k, v in state.items())
    assert [id(p) for p in model.parameters()] == ids  # the same Parameter objects: optimizers stay valid


def _refused(model: nn.Module, x: Any, match: str, amount: float = 0.5) -> str:
    snap = _snapshot(model)
    with pytest.raises(SpeedupConfigError, match=match) as info:
        prune_structured(model, x, amount)
    _assert_unchanged(model, snap)
    return str(info.value)


def _block(i: int, o: int) -> nn.Module:
    return nn.Sequential(nn.Conv2d(i, o, 3, padding=1), nn.BatchNorm2d(o), nn.ReLU())


# ---------------------------------------------------------------- 1. branches that run only in training
class AuxNet(nn.Module):
    """An aux head that runs only in training (GoogLeNet/Inception ``aux_logits``); ``detach`` hides it from tracing."""

    def __init__(self, detach: bool = False) -> None:
        super().__init__()
        self.detach = detach
        self.stem = _block(3, 8)
        self.body = _block(8, 16)
        self.aux = nn.Sequential(
            nn.Conv2d(16, 8, 1), nn.ReLU(), nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.Linear(32, 5)
        )
        self.head = nn.Linear(16, 5)

    def forward(self, x: torch.Tensor) -> Any:
        x = self.body(self.stem(x))
        out = self.head(x.mean((2, 3)))
        if self.training:
            return out, self.aux(x.detach() if self.detach else x)
        return out


def test_training_only_branch_is_pruned_consistently():
    model = AuxNet().train()
    x = torch.randn(2, 3, 8, 8)
    summary = prune_structured(model, x, 0.5)
    assert model.body[0].out_channels == model.aux[0].in_channels == 8  # traced in train mode: the aux head follows
    assert model.aux[4].out_features == 5 and model.head.out_features == 5  # both heads' outputs protected
    assert "aux.4" not in summary.layers
    assert model.training
    logits, aux = model(x)  # the first training step runs
    assert logits.shape == aux.shape == (2, 5)


def test_training_only_branch_that_breaks_restores_the_model():
    model = AuxNet(detach=True).train()  # the aux input is detached: tracing cannot see that it must follow `body`
    _refused(model, torch.randn(2, 3, 8, 8), r"train mode fails in module 'aux\.0'")  # BatchNorm stats unchanged too
    assert model.training


def test_training_only_branch_fit_with_callback():
    import lightning as L
    import torch.nn.functional as F

    from lightning_speedups import StructuredPruning

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = AuxNet()
            self.example_input_array = torch.randn(2, 3, 8, 8)

        def forward(self, x: torch.Tensor) -> Any:
            return self.net(x)

        def training_step(self, batch: Any, _idx: int) -> torch.Tensor:
            x, y = batch
            logits, aux = self(x)
            return F.cross_entropy(logits, y) + 0.3 * F.cross_entropy(aux, y)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    data = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(torch.randn(8, 3, 8, 8), torch.randint(0, 5, (8,))), batch_size=4
    )
    module = Module()
    callback = StructuredPruning(amount=0.5)
    trainer = L.Trainer(
        max_epochs=1,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[callback],
    )
    trainer.fit(module, data)  # the first training step used to fail in the aux branch
    assert module.net.aux[0].in_channels == module.net.body[0].out_channels == 8
    assert trainer.global_step == 2


def test_googlenet_aux_logits_trains_after_pruning():
    torchvision = pytest.importorskip("torchvision")
    model = torchvision.models.googlenet(num_classes=5, aux_logits=True, init_weights=False).train()
    x = torch.randn(2, 3, 64, 64)
    summary = prune_structured(model, x, 0.5)
    assert summary.params_after < summary.params_before / 2 and model.aux1.conv.conv.in_channels < 512
    outputs = model(x)  # the first training step ran into a channel mismatch in the aux branch
    assert [tuple(t.shape) for t in outputs] == [(2, 5)] * 3


# ---------------------------------------------------------------- 2. outputs that are not one logits tensor
class TwoHeads(nn.Module):
    """A segmentation model with a dict output ``{'out', 'aux'}`` (torchvision's FCN/DeepLabV3 with ``aux_loss``)."""

    def __init__(self) -> None:
        super().__init__()
        self.low = _block(3, 8)
        self.high = _block(8, 16)
        self.classifier = nn.Conv2d(16, 4, 1)
        self.aux_classifier = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 4, 1))

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        low = self.low(x)
        return {"out": self.classifier(self.high(low)), "aux": self.aux_classifier(low)}


class TupleHeads(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 32)
        self.fc2 = nn.Linear(32, 16)
        self.logits = nn.Linear(16, 3)
        self.embedding = nn.Linear(16, 6)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = torch.relu(self.fc2(torch.relu(self.fc1(x))))
        return self.logits(h), self.embedding(h)


def test_dict_output_protects_every_head():
    model = TwoHeads().eval()
    x = torch.randn(2, 3, 8, 8)
    prune_structured(model, x, 0.5)
    assert model.classifier.out_channels == model.aux_classifier[2].out_channels == 4
    assert model.high[0].out_channels == 8  # the backbone was pruned
    out = model(x)
    assert out["out"].shape == out["aux"].shape == (2, 4, 8, 8)


def test_tuple_and_model_output_protect_every_head():
    model = TupleHeads()
    x = torch.randn(2, 8)
    prune_structured(model, x, 0.5)
    assert (model.logits.out_features, model.embedding.out_features, model.fc1.out_features) == (3, 6, 16)

    transformers = pytest.importorskip("transformers")

    @dataclass
    class Output(transformers.utils.ModelOutput):
        logits: torch.Tensor | None = None
        embedding: torch.Tensor | None = None

    class WithModelOutput(TupleHeads):
        def forward(self, x: torch.Tensor) -> Any:  # type: ignore[override]
            return Output(*super().forward(x))

    model = WithModelOutput()
    prune_structured(model, x, 0.5)
    out = model(x)
    assert out.logits.shape == (2, 3) and out.embedding.shape == (2, 6) and model.fc1.out_features == 16


# ---------------------------------------------------------------- 3. encoder-decoder and speech transformers
class KVCache:
    """Stands in for Hugging Face's cache objects in outputs: iterable over per-layer ``(key, value)`` tuples."""

    def __init__(self, layers: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        self.layers = layers

    def __iter__(self) -> Any:
        return iter(self.layers)


class Seq2Seq(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(20, 16)
        self.encoder = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
        self.decoder = nn.TransformerDecoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
        self.lm_head = nn.Linear(16, 20)

    def forward(self, input_ids: torch.Tensor, decoder_input_ids: torch.Tensor) -> dict[str, Any]:
        memory = self.encoder(self.embed(input_ids))
        logits = self.lm_head(self.decoder(self.embed(decoder_input_ids), memory))
        return {"logits": logits, "past_key_values": KVCache([(memory, memory)]), "encoder_last_hidden_state": memory}


def test_encoder_decoder_with_cache_output_prunes_feed_forward():
    model = Seq2Seq().eval()
    ids = torch.randint(0, 20, (2, 5))
    summary = prune_structured(model, {"input_ids": ids, "decoder_input_ids": ids}, 0.5)
    assert set(summary.layers) == {"encoder.linear1", "decoder.linear1"}
    assert model.encoder.linear1.out_features == model.decoder.linear1.out_features == 16
    assert model(ids, ids)["logits"].shape == (2, 5, 20)


def test_t5_and_whisper_prune_feed_forward():
    transformers = pytest.importorskip("transformers")
    t5 = transformers.T5ForConditionalGeneration(
        transformers.T5Config(
            vocab_size=64,
            d_model=16,
            d_kv=8,
            d_ff=32,
            num_layers=1,
            num_decoder_layers=1,
            num_heads=2,
            decoder_start_token_id=0,
        )
    ).eval()
    ids = torch.randint(0, 64, (2, 6))
    prune_structured(t5, {"input_ids": ids, "decoder_input_ids": ids}, 0.5)
    assert t5.encoder.block[0].layer[1].DenseReluDense.wi.out_features == 16
    assert t5(input_ids=ids, decoder_input_ids=ids).logits.shape == (2, 6, 64)

    whisper = transformers.WhisperForConditionalGeneration(
        transformers.WhisperConfig(
            vocab_size=64,
            num_mel_bins=8,
            encoder_layers=1,
            decoder_layers=1,
            d_model=16,
            encoder_attention_heads=2,
            decoder_attention_heads=2,
            encoder_ffn_dim=32,
            decoder_ffn_dim=32,
            max_source_positions=8,
            max_target_positions=16,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=2,
            decoder_start_token_id=1,
        )
    ).eval()
    inputs = {"input_features": torch.randn(2, 8, 16), "decoder_input_ids": torch.randint(0, 64, (2, 4))}
    prune_structured(whisper, inputs, 0.5)
    assert whisper.model.encoder.layers[0].fc1.out_features == whisper.model.decoder.layers[0].fc1.out_features == 16
    assert whisper(**inputs).logits.shape == (2, 4, 64)


# ---------------------------------------------------------------- 4. channel shuffle and token-mixing MLPs
class Shuffle(nn.Module):
    """ShuffleNet v2 units: split, branch, concatenate, channel shuffle."""

    def __init__(self) -> None:
        super().__init__()
        from torchvision.models.shufflenetv2 import InvertedResidual

        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.units = nn.Sequential(InvertedResidual(8, 16, 2), InvertedResidual(16, 16, 1))
        self.head = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.units(self.stem(x)).mean((2, 3)))


class MixerBlock(nn.Module):
    def __init__(self, tokens: int, dim: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.tok1 = nn.Linear(tokens, 32)
        self.tok2 = nn.Linear(32, tokens)
        self.norm2 = nn.LayerNorm(dim)
        self.ch1 = nn.Linear(dim, 32)
        self.ch2 = nn.Linear(32, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.tok2(torch.relu(self.tok1(self.norm1(x).transpose(1, 2)))).transpose(1, 2)  # mixes tokens
        return x + self.ch2(torch.relu(self.ch1(self.norm2(x))))


class Mixer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Conv2d(3, 24, 4, 4)
        self.block = MixerBlock(16, 24)
        self.head = nn.Linear(24, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.block(self.embed(x).flatten(2).transpose(1, 2)).mean(1))


def test_channel_shuffle_is_refused_by_name():
    pytest.importorskip("torchvision")
    message = _refused(Shuffle(), torch.randn(2, 3, 16, 16), r"torch-pruning failed at module 'units")
    assert "IndexError" in message and "model is unchanged" in message


def test_token_mixing_mlp_is_refused_by_name():
    message = _refused(Mixer(), torch.randn(2, 3, 16, 16), r"torch-pruning failed at module 'block\.tok")
    assert "(Linear)" in message and "IndexError" in message


def test_public_shufflenet_and_mixer_are_refused_by_name():
    torchvision = pytest.importorskip("torchvision")
    timm = pytest.importorskip("timm")
    _refused(
        torchvision.models.shufflenet_v2_x0_5(num_classes=10).eval(),
        torch.randn(2, 3, 32, 32),
        r"torch-pruning failed at module 'stage\d.*ZeroDivisionError",
    )
    mixer = timm.models.mlp_mixer.MlpMixer(num_classes=10, img_size=32, patch_size=8, num_blocks=1, embed_dim=24)
    _refused(mixer.eval(), torch.randn(2, 3, 32, 32), r"torch-pruning failed at module 'blocks\.0\.mlp_tokens")


# ---------------------------------------------------------------- 5. tied input/output embeddings
class TiedLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(50, 16)
        self.fc1 = nn.Linear(16, 32)
        self.fc2 = nn.Linear(32, 16)
        self.head = nn.Linear(16, 50, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.emb(x)
        return self.head(h + self.fc2(torch.relu(self.fc1(h))))


def test_tied_embeddings_are_pruned_together():
    model = TiedLM()
    x = torch.randint(0, 50, (2, 5))
    prune_structured(model, x, 0.5)
    assert model.head.weight is model.emb.weight  # still one parameter: training updates both ends
    assert model.emb.embedding_dim == 8 and model(x).shape == (2, 5, 50)
    assert len(list(model.parameters())) == 5


def test_tied_weights_pruned_apart_are_refused_by_name():
    class SharedSquare(nn.Module):  # one square weight used by two layers: their channels cannot agree
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Linear(8, 8)
            self.b = nn.Linear(8, 8)
            self.head = nn.Linear(8, 3)
            self.b.weight = self.a.weight

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(torch.relu(self.b(torch.relu(self.a(x)))))

    message = _refused(SharedSquare(), torch.randn(2, 8), r"would untie the parameter shared by 'a\.weight' \(Linear\)")
    assert "'b.weight' (Linear)" in message


def test_gpt2_tied_is_refused_by_name():
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(
        vocab_size=64,
        n_positions=16,
        n_embd=16,
        n_layer=1,
        n_head=2,
        tie_word_embeddings=True,
        bos_token_id=0,
        eos_token_id=0,
    )
    model = transformers.GPT2LMHeadModel(config).eval()
    message = _refused(model, {"input_ids": torch.randint(0, 64, (2, 6))}, r"torch-pruning failed at module")
    assert "'transformer.h.0.attn.c_attn' (Conv1D)" in message and "TypeError" in message


def test_dependency_loop_is_refused_with_model_unchanged():
    # Llama's rotary embedding splits and re-joins channels; torch-pruning's propagation never settles on it (it
    # looped for minutes), so a loop guard ends the analysis and the prune is refused
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    model = transformers.LlamaForCausalLM(config).eval()
    message = _refused(model, {"input_ids": torch.randint(0, 64, (2, 6))}, r"went round a dependency loop")
    assert "The model is unchanged" in message


# ---------------------------------------------------------------- 6. recurrent layers
class Recurrent(nn.Module):
    def __init__(self, cell: type[nn.RNNBase], pre: bool) -> None:
        super().__init__()
        self.pre = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 16)) if pre else nn.Linear(8, 16)
        self.rnn = cell(16, 16, batch_first=True)
        self.head = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.rnn(self.pre(x))[0][:, -1])


@pytest.mark.parametrize("cell", [nn.LSTM, nn.GRU])
def test_recurrent_refusal_names_the_module(cell):
    message = _refused(Recurrent(cell, pre=False), torch.randn(2, 5, 8), r"leaves no prunable layer")
    assert f"'rnn' ({cell.__name__})" in message


def test_recurrent_layers_keep_their_widths_and_the_rest_is_pruned():
    model = Recurrent(nn.GRU, pre=True)
    x = torch.randn(2, 5, 8)
    summary = prune_structured(model, x, 0.5)
    assert set(summary.layers) == {"pre.0"}
    assert model.pre[2].out_features == model.rnn.input_size == 16 and model(x).shape == (2, 3)


# ---------------------------------------------------------------- 7. any error inside torch-pruning
def test_dependency_error_is_refused_with_model_unchanged(monkeypatch):
    def boom(self: Any, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(tp.DependencyGraph, "build_dependency", boom)
    message = _refused(TupleHeads(), torch.randn(2, 8), r"torch-pruning failed")
    assert "RuntimeError: boom" in message
