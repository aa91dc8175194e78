"""SequenceBatching: misconfiguration, fit per strategy, auto, packing checks, resume mid-epoch, DDP on CPU."""

from __future__ import annotations

import importlib.util

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

from lightning_speedups import SequenceBatching, SpeedupConfigError
from lightning_speedups.data import SequenceLoader, packed_attention_mask, pad_collate


class Tokens(Dataset):
    """Long-tailed token samples ``{"input_ids", "label"}``; the label is the first token's parity."""

    def __init__(self, n: int = 96, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        lengths = (torch.distributions.LogNormal(2.5, 0.7).sample((n,)).clamp(2, 120)).long().tolist()
        self.samples = [torch.randint(1, 50, (k,), generator=g) for k in lengths]

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.samples[i], "label": int(self.samples[i][0] % 2)}


class TinyLM(L.LightningModule):
    """A causal SDPA model that keeps packed documents apart when ``respect_boundaries``; records its batches."""

    def __init__(self, respect_boundaries: bool = True) -> None:
        super().__init__()
        self.respect = respect_boundaries
        self.embed = nn.Embedding(64, 16)
        self.pos = nn.Embedding(256, 16)
        self.qkv = nn.Linear(16, 48)
        self.out = nn.Linear(16, 64)
        self.seen: list[list[int]] = []

    def forward(self, input_ids, position_ids=None, attention_mask=None):
        if position_ids is None:
            position_ids = torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(input_ids)
        x = self.embed(input_ids) + self.pos(position_ids)
        q, k, v = self.qkv(x).unsqueeze(1).chunk(3, dim=-1)
        if self.respect:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=packed_attention_mask(position_ids))
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.squeeze(1))

    def training_step(self, batch, batch_idx):
        ids = batch["input_ids"]
        self.seen.append(ids.sum(1).tolist())
        logits = self(ids, batch.get("position_ids"))
        labels = batch.get("labels", ids.masked_fill(batch.get("attention_mask", torch.ones_like(ids)) == 0, -100))
        return F.cross_entropy(logits[:, :-1].reshape(-1, 64), labels[:, 1:].reshape(-1), ignore_index=-100)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def _trainer(callbacks, **kwargs) -> L.Trainer:
    args = dict(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        max_epochs=1,
    )
    args.update(kwargs)
    return L.Trainer(callbacks=callbacks, **args)


def _loader(data=None, batch_size=8, **kwargs) -> DataLoader:
    return DataLoader(data or Tokens(), batch_size=batch_size, shuffle=True, collate_fn=pad_collate(), **kwargs)


def test_sequence_batching_misconfiguration():
    with pytest.raises(SpeedupConfigError, match="`strategy`='fastest' is not supported"):
        SequenceBatching("fastest")
    with pytest.raises(SpeedupConfigError, match="`block_size`=None with `strategy`='packed'"):
        SequenceBatching("packed")
    for arg in ("batch_size", "max_tokens", "block_size", "rows", "multiple_of"):
        with pytest.raises(SpeedupConfigError, match=f"`{arg}`=0 is out of range"):
            SequenceBatching("length_grouped", **{arg: 0})


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"strategy": "token_budget", "max_tokens": 16}, r"`max_tokens`=16 is below sample \d+, of length \d+"),
        ({"strategy": "length_grouped", "lengths": [3, 4]}, "`lengths` has 2 entries but the dataset has 96"),
    ],
)
def test_sequence_batching_setup_errors(kwargs, match):
    model = TinyLM()
    with pytest.raises(SpeedupConfigError, match=match):
        _trainer([SequenceBatching(**kwargs)], max_steps=1).fit(model, _loader())
    assert model.seen == []  # refused before any step


def test_sequence_batching_refuses_image_data():
    images = torch.utils.data.TensorDataset(torch.rand(16, 3, 8, 8), torch.zeros(16, dtype=torch.long))
    with pytest.raises(SpeedupConfigError, match="holds no token tensor"):
        _trainer([SequenceBatching("length_grouped")], max_steps=1).fit(TinyLM(), DataLoader(images, batch_size=4))


def test_sequence_batching_refuses_custom_sampler():
    data = Tokens()
    loader = DataLoader(
        data, batch_size=4, sampler=torch.utils.data.WeightedRandomSampler([1.0] * 96, 96), collate_fn=pad_collate()
    )
    with pytest.raises(SpeedupConfigError, match="custom sampler \\(WeightedRandomSampler\\)"):
        _trainer([SequenceBatching("length_grouped")], max_steps=1).fit(TinyLM(), loader)


def test_sequence_batching_packing_refused_for_a_model_whose_attention_crosses_documents():
    model = TinyLM(respect_boundaries=False)
    with pytest.raises(SpeedupConfigError, match="`TinyLM` gives different outputs.*crosses documents"):
        _trainer([SequenceBatching("packed", block_size=64)], max_steps=1).fit(model, _loader())
    assert model.seen == []


def test_sequence_batching_packing_refused_without_position_ids():
    class NoPositions(TinyLM):
        def forward(self, input_ids):
            return super().forward(input_ids)

    with pytest.raises(SpeedupConfigError, match="`NoPositions.forward` takes no `position_ids`"):
        _trainer([SequenceBatching("packed", block_size=64)], max_steps=1).fit(NoPositions(), _loader())


@pytest.mark.parametrize("strategy", ["length_grouped", "token_budget", "packed"])
def test_sequence_batching_fit(strategy):
    model = TinyLM()
    cb = SequenceBatching(strategy, block_size=64, multiple_of=1)
    trainer = _trainer([cb])
    trainer.fit(model, _loader())
    assert cb.chosen == strategy and isinstance(cb.loader, SequenceLoader)
    assert len(model.seen) == len(cb.loader) > 0
    if strategy == "packed":
        assert all(len(row) >= 1 for row in model.seen)
    else:  # every sample trained exactly once in the epoch
        assert sum(len(b) for b in model.seen) == 96


def test_sequence_batching_auto_measures_and_keeps_a_candidate():
    cb = SequenceBatching("auto", block_size=64)
    trainer = _trainer([cb], max_steps=2)
    trainer.fit(TinyLM(), _loader())
    assert set(cb.estimates) == {"original", "length_grouped", "packed"}  # never the token budget: not speed only
    assert cb.chosen == min(cb.estimates, key=lambda k: cb.estimates[k] * (1.0 if k == "original" else 1.05))


def test_sequence_batching_reads_module_loaders():
    class WithData(TinyLM):
        def train_dataloader(self):
            return _loader()

    model = WithData()
    cb = SequenceBatching("length_grouped")
    _trainer([cb], max_steps=3).fit(model)
    assert cb.chosen == "length_grouped" and len(model.seen) == 3


def _run(tmp_path, max_steps, ckpt=None, save_every=None):
    L.seed_everything(0)
    model = TinyLM()
    callbacks = [SequenceBatching("token_budget", seed=3)]
    if save_every:
        callbacks.append(
            L.pytorch.callbacks.ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=save_every, save_top_k=-1)
        )
    trainer = _trainer(callbacks, max_steps=max_steps, max_epochs=3, enable_checkpointing=bool(save_every))
    trainer.fit(model, _loader(), ckpt_path=ckpt)
    return model


def test_sequence_batching_resume_mid_epoch(tmp_path):
    full = _run(tmp_path / "a", max_steps=30)
    steps_per_epoch = len(full.seen) // 3 + 1
    stop = steps_per_epoch + 4  # in the middle of the second epoch
    first = _run(tmp_path / "b", max_steps=stop, save_every=stop)
    ckpt = next((tmp_path / "b").glob("*.ckpt"))
    state = torch.load(ckpt, weights_only=True)
    assert any("SequenceBatching" in k for k in state["callbacks"])  # plain data, loads with weights_only
    resumed = _run(tmp_path / "c", max_steps=30, ckpt=str(ckpt))
    assert first.seen + resumed.seen == full.seen


class _RecordRank(L.Callback):
    """Writes each rank's trained sample indices (by token sum) and padded token counts to a file."""

    def __init__(self, path) -> None:
        self.path = path

    def on_train_end(self, trainer, pl_module):
        torch.save(
            {"seen": pl_module.seen, "chosen": trainer.callbacks[0].chosen}, f"{self.path}/rank{trainer.global_rank}.pt"
        )


def test_sequence_batching_ddp_two_ranks(tmp_path):
    cb = SequenceBatching("auto")
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp_spawn",
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[cb, _RecordRank(tmp_path)],
    )
    trainer.fit(TinyLM(), _loader())
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(2)]
    assert ranks[0]["chosen"] == ranks[1]["chosen"]  # rank 0 decided for both
    assert len(ranks[0]["seen"]) == len(ranks[1]["seen"]) > 0  # the same number of steps on both ranks
    # together the ranks cover the epoch (a completed last step may repeat a few samples)
    assert sum(len(b) for r in ranks for b in r["seen"]) >= 96


def _tiny_bert(transformers):
    """A tiny BertForSequenceClassification from a config (offline): vocabulary 64, one layer, two labels."""
    config = transformers.BertConfig(
        vocab_size=64,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
        num_labels=2,
    )
    return transformers.BertForSequenceClassification(config)


def test_sequence_batching_hugging_face_bert_dynamic_padding():
    """A public architecture nobody here wrote: a tiny BERT (offline config) in a plain LightningModule."""
    transformers = pytest.importorskip("transformers")

    class Bert(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = _tiny_bert(transformers)
            self.shapes: list[tuple[int, int]] = []

        def training_step(self, batch, batch_idx):
            self.shapes.append(tuple(batch["input_ids"].shape))
            ids = batch["input_ids"]
            mask = batch["attention_mask"]
            return self.model(input_ids=ids, attention_mask=mask, labels=batch["label"]).loss

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    model = Bert()
    cb = SequenceBatching("length_grouped", multiple_of=8)
    _trainer([cb], max_steps=6).fit(model, _loader(batch_size=16))
    assert len(model.shapes) == 6
    assert all(b <= 16 and length % 8 == 0 and length <= 120 for b, length in model.shapes)
    assert len({length for _, length in model.shapes}) > 1  # each batch padded to its own longest sample


def test_sequence_batching_hugging_face_tokenizer_output_and_data_collator():
    """The common Hugging Face pipeline: samples as the tokenizer returns them (lists of ints) and
    ``DataCollatorWithPadding``, whose ``BatchEncoding`` the step may read as attributes. Before, every strategy
    refused the samples ("holds no token tensor")."""
    transformers = pytest.importorskip("transformers")
    tokenizers = pytest.importorskip("tokenizers")
    words = [f"w{i}" for i in range(60)]
    vocab = {"[PAD]": 0, "[UNK]": 1, **{w: i + 2 for i, w in enumerate(words)}}
    backend = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="[PAD]", unk_token="[UNK]")
    texts = [" ".join(words[(i * 7 + j) % 60] for j in range(len(ids))) for i, ids in enumerate(Tokens().samples)]
    samples = [{**tokenizer(t), "labels": i % 2} for i, t in enumerate(texts)]
    assert isinstance(samples[0]["input_ids"], list)

    class Bert(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = _tiny_bert(transformers)
            self.widths: list[int] = []

        def training_step(self, batch, batch_idx):
            self.widths.append(batch.input_ids.shape[1])  # attribute access: the BatchEncoding reached the step
            return self.model(**batch).loss

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    loader = DataLoader(
        samples, batch_size=16, shuffle=True, collate_fn=transformers.DataCollatorWithPadding(tokenizer)
    )
    model = Bert()
    cb = SequenceBatching("length_grouped")
    _trainer([cb], max_steps=4).fit(model, loader)
    assert cb._own_collate == (
        "`collate_fn` does more than pad: its batch is a BatchEncoding where padding gives a dict"
    )
    assert len(model.widths) == 4 and len(set(model.widths)) > 1
    with pytest.raises(SpeedupConfigError, match="`strategy`='packed' cannot be used"):
        _trainer([SequenceBatching("packed", block_size=64)], max_steps=1).fit(Bert(), loader)


def test_auto_with_a_loader_that_cannot_batch_its_samples_picks_among_the_new_batchings(caplog):
    # token ids as lists of different lengths and no collate_fn: default_collate cannot batch them, so the user's
    # loader has no epoch to time (before: auto raised default_collate's RuntimeError from its own timing)
    samples = [{"input_ids": ids.tolist()} for ids in Tokens().samples]
    cb = SequenceBatching("auto", multiple_of=1)
    with caplog.at_level("INFO"):
        _trainer([cb], max_steps=3).fit(TinyLM(), DataLoader(samples, batch_size=8, shuffle=True))
    assert cb.chosen == "length_grouped" and set(cb.estimates) == {"length_grouped"}
    assert "your loader was not timed: it cannot batch these samples (RuntimeError: " in caplog.text


def _masking_collate(samples):
    """A masked-LM collate in the manner of HF's DataCollatorForLanguageModeling: pads, then masks with the RNG."""
    batch = pad_collate(multiple_of=1)(samples)
    ids = batch["input_ids"]
    picked = (torch.rand(ids.shape) < 0.15) & (batch["attention_mask"] == 1)
    return {
        "input_ids": ids.masked_fill(picked, 63),
        "attention_mask": batch["attention_mask"],
        "labels": ids.masked_fill(~picked, -100),
    }


def _to_dataset_max(samples):
    """A pad-only collate of the common kind: every batch padded to one fixed width (here 128), with -1."""
    ids = torch.full((len(samples), 128), -1, dtype=torch.long)
    for row, s in enumerate(samples):
        ids[row, : len(s["input_ids"])] = s["input_ids"]
    return {"input_ids": ids, "label": torch.tensor([s["label"] for s in samples])}


def test_a_collate_that_only_pads_is_replaced_and_one_that_does_more_is_kept():
    from lightning_speedups.callbacks._sequence_choice import own_collate_reason

    assert own_collate_reason(_loader()) is None
    assert own_collate_reason(DataLoader(Tokens(), batch_size=8, collate_fn=_to_dataset_max)) is None
    assert own_collate_reason(DataLoader(Tokens(), batch_size=8)) is None  # default_collate: nothing to keep
    masking = DataLoader(Tokens(), batch_size=8, collate_fn=_masking_collate)
    state = torch.get_rng_state()
    why = own_collate_reason(masking)
    assert why == "`collate_fn` does more than pad: its batch adds keys ['labels']"
    assert torch.equal(torch.get_rng_state(), state)  # the check drew the collate's random numbers on a fork

    def shifted(samples):  # the same keys, other token values (a remapping the user's step relies on)
        batch = pad_collate(multiple_of=1)(samples)
        return {**batch, "input_ids": batch["input_ids"] + 1}

    why = own_collate_reason(DataLoader(Tokens(), batch_size=8, collate_fn=shifted))
    assert why == "`collate_fn` does more than pad: its batch['input_ids'] has other values than a padded batch's"

    class WithWords(Tokens):  # a field of ragged lists, which only the user's own collate can batch
        def __getitem__(self, i: int) -> dict:
            return {**super().__getitem__(i), "words": ["w"] * (i % 3 + 1)}

    def theirs(samples):
        return {
            **pad_collate(multiple_of=1)([{"input_ids": s["input_ids"]} for s in samples]),
            "words": [s["words"] for s in samples],
        }

    why = own_collate_reason(DataLoader(WithWords(), batch_size=8, collate_fn=theirs))
    assert why.startswith("`collate_fn` does more than pad: padding alone cannot batch these samples (")


def test_sequence_batching_keeps_a_collate_that_masks_and_refuses_packing_for_it():
    # before: the new batches went through pad_collate, so a masked LM trained on no masks and no labels
    model = TinyLM()
    cb = SequenceBatching("length_grouped", multiple_of=1)
    loader = DataLoader(Tokens(), batch_size=8, shuffle=True, collate_fn=_masking_collate)
    seen = []
    real = TinyLM.training_step

    def record(self, batch, batch_idx):
        seen.append(batch)
        return real(self, batch, batch_idx)

    model.training_step = record.__get__(model)
    _trainer([cb], max_steps=4).fit(model, loader)
    assert cb.chosen == "length_grouped" and cb.loader.collate_fn is _masking_collate
    # setup's check step (on a copy) and the 4 training steps: all on batches the user's collate made
    assert len(seen) == 5 and all("labels" in b and (b["labels"] != -100).any() for b in seen)
    assert all(((b["input_ids"] == 63) == (b["labels"] != -100)).float().mean() > 0.5 for b in seen)
    with pytest.raises(
        SpeedupConfigError,
        match="packed rows would not go through the loader's collate_fn, and "
        r"`collate_fn` does more than pad: its batch adds keys \['labels'\].*"
        "HINT: to pack, leave `collate_fn` out of the DataLoader",
    ):
        _trainer([SequenceBatching("packed", block_size=64)], max_steps=1).fit(TinyLM(), loader)


def test_auto_times_nothing_when_every_sample_has_one_length(caplog, monkeypatch):
    """Random fixed-length windows of a token stream (issue 51): the lengths it reads already say there is no padding,
    so "auto" keeps the loader without timing a step, says why in one line and keeps the reason in its state."""
    import lightning_speedups.callbacks.sequence_batching as sb
    from tests.lm_models import LMModule, Windows

    def no_timing(*args, **kwargs):
        raise AssertionError("nothing should be timed")

    monkeypatch.setattr(sb, "loader_epoch_seconds", no_timing)
    monkeypatch.setattr(sb, "sampler_epoch_seconds", no_timing)
    loader = DataLoader(Windows(32), batch_size=8, shuffle=True)
    for net in ("mini", "gpt2"):
        if net == "gpt2" and importlib.util.find_spec("transformers") is None:
            continue
        cb = SequenceBatching("auto", block_size=64)
        caplog.clear()
        with caplog.at_level("INFO"):
            _trainer([cb], max_steps=2).fit(LMModule(net), loader)
        assert cb.chosen == "original" and cb.estimates == {} and cb.loader is None
        note = (
            "SequenceBatching: every sample has 16 tokens and your loader pads 0% of a batch: no batching can save "
            "padding, so nothing was timed; kept your loader."
        )
        assert note in caplog.text and "fastest" not in caplog.text
        assert cb.state_dict()["note"] == note[len("SequenceBatching: ") : -1]


def test_auto_still_times_equal_lengths_padded_wider_by_the_loader():
    """Equal lengths but a collate that pads every batch to 128: length-grouped batches would save that padding."""
    data = [{"input_ids": torch.arange(1, 13), "label": 0} for _ in range(32)]

    def to_128(samples):
        ids = torch.zeros(len(samples), 128, dtype=torch.long)
        ids[:, :12] = torch.stack([s["input_ids"] for s in samples])
        return {"input_ids": ids, "attention_mask": (ids != 0).long()}

    cb = SequenceBatching("auto", multiple_of=1)
    _trainer([cb], max_steps=1).fit(TinyLM(), DataLoader(data, batch_size=8, collate_fn=to_128))
    assert cb._note is None and set(cb.estimates) == {"original", "length_grouped"}
