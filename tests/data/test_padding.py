"""Padding and packing collates: pad_collate, pack_sequences, packed_attention_mask, sequence_lengths.

The packing tests check what matters for training: a model fed packed rows gives every document exactly the logits
(and loss terms) it gets alone, both for a small SDPA transformer written here and for a Hugging Face causal LM.
"""

from __future__ import annotations

import pickle
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

from lightning_speedups import SpeedupConfigError
from lightning_speedups.data import (
    IGNORE_INDEX,
    LengthGroupedSampler,
    PackCollate,
    PadCollate,
    pack_collate,
    pack_sequences,
    packed_attention_mask,
    pad_collate,
    sequence_lengths,
    token_tensor,
)

VOCAB = 64
DOC_LENGTHS = (5, 11, 3, 9)  # rows of 16: [5 + 11], [3 + 9 + 4 padding], no document cut


def _docs(lengths: tuple[int, ...] = DOC_LENGTHS, seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(1, VOCAB, (n,), generator=gen) for n in lengths]


# ---------------------------------------------------------------------------------------------- pad_collate
def test_pad_collate_dict_samples():
    samples = [
        {"input_ids": torch.tensor([5, 6, 7]), "labels": torch.tensor([6, 7, 8]), "label": 1, "text": "abc"},
        {"input_ids": torch.tensor([9]), "labels": torch.tensor([2]), "label": 0, "text": "d"},
    ]
    batch = pad_collate(pad_value=0, multiple_of=4)(samples)
    assert list(batch)[:2] == ["input_ids", "attention_mask"]
    assert batch["input_ids"].tolist() == [[5, 6, 7, 0], [9, 0, 0, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 0], [1, 0, 0, 0]]
    assert batch["labels"].tolist() == [[6, 7, 8, IGNORE_INDEX], [2, IGNORE_INDEX, IGNORE_INDEX, IGNORE_INDEX]]
    assert batch["label"].tolist() == [1, 0]
    assert batch["text"] == ["abc", "d"]
    # an incoming attention_mask is rebuilt for the padded length; another key for the tokens works too
    other = pad_collate(multiple_of=1)([{"tokens": torch.tensor([1, 2]), "attention_mask": torch.tensor([1, 1])}])
    assert set(other) == {"input_ids", "attention_mask"}
    assert other["attention_mask"].tolist() == [[1, 1]]


def test_pad_collate_tuple_and_tensor_samples():
    samples = [(torch.tensor([1, 2, 3]), torch.tensor(4)), (torch.tensor([5]), torch.tensor(6))]
    input_ids, label, mask = pad_collate(pad_value=-1, multiple_of=1)(samples)
    assert input_ids.tolist() == [[1, 2, 3], [5, -1, -1]]
    assert label.tolist() == [4, 6]
    assert mask.tolist() == [[1, 1, 1], [1, 0, 0]]
    # a per-token field after the tokens is padded as labels
    pairs = [(torch.tensor([1, 2]), torch.tensor([2, 3])), (torch.tensor([7]), torch.tensor([8]))]
    _, labels, _ = pad_collate(multiple_of=1)(pairs)
    assert labels.tolist() == [[2, 3], [8, IGNORE_INDEX]]
    bare = pad_collate(multiple_of=1)([torch.tensor([1, 2]), torch.tensor([3])])
    assert bare["input_ids"].tolist() == [[1, 2], [3, 0]]


def test_pad_collate_token_ids_as_lists_and_numpy_arrays():
    # a Hugging Face tokenizer's output: every field a list of ints, the label an int
    samples = [
        {"input_ids": [101, 7, 102], "token_type_ids": [0, 0, 0], "attention_mask": [1, 1, 1], "labels": 1},
        {"input_ids": [101, 102], "token_type_ids": [0, 0], "attention_mask": [1, 1], "labels": 0},
    ]
    batch = pad_collate(multiple_of=1)(samples)
    assert batch["input_ids"].tolist() == [[101, 7, 102], [101, 102, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 1, 0]]
    assert batch["token_type_ids"].tolist() == [[0, 0, 0], [0, 0, 0]]
    assert batch["labels"].tolist() == [1, 0]  # one label per sequence: collated, not padded
    assert token_tensor([4, 5]).tolist() == [4, 5]  # a bare list of ids is a sample too
    assert pad_collate(multiple_of=1)([[4, 5], [6]])["input_ids"].tolist() == [[4, 5], [6, 0]]
    pair = pad_collate(multiple_of=1, tuple_mask=False)([([4, 5], [5, 6]), ([6], [7])])
    assert [t.tolist() for t in pair] == [[[4, 5], [6, 0]], [[5, 6], [7, IGNORE_INDEX]]]
    np = pytest.importorskip("numpy")
    assert token_tensor({"input_ids": np.array([3, 4], dtype=np.int32)}).dtype == torch.long
    assert sequence_lengths([{"input_ids": [1, 2, 3]}, {"input_ids": np.arange(5)}]).lengths == [3, 5]
    for not_ids in ([1.5, 2.0], [True, False], np.array([0.5])):
        with pytest.raises(SpeedupConfigError, match="holds no token tensor. Allowed values: a 1-D integer tensor or"):
            token_tensor({"input_ids": not_ids})


@pytest.mark.parametrize("multiple_of", [1, 3, 8, 64])
def test_pad_collate_multiple_of_and_mask(multiple_of):
    lengths = [7, 1, 12, 5]
    samples = [{"input_ids": torch.arange(1, n + 1)} for n in lengths]
    batch = pad_collate(multiple_of=multiple_of)(samples)
    width = batch["input_ids"].shape[1]
    assert width % multiple_of == 0 and 12 <= width < 12 + multiple_of
    assert batch["attention_mask"].sum(1).tolist() == lengths
    assert (batch["input_ids"] != 0).long().equal(batch["attention_mask"])
    assert batch["attention_mask"].dtype == torch.long


def test_pad_collate_in_dataloader_and_pickle():
    data = [{"input_ids": torch.randint(1, 9, (n,)), "label": n % 2} for n in (3, 8, 2, 5, 7, 1)]
    collate = pad_collate(multiple_of=4)
    again = pickle.loads(pickle.dumps(collate))
    assert again == collate and isinstance(again, PadCollate)
    sampler = LengthGroupedSampler([len(d["input_ids"]) for d in data], 2, shuffle=False)
    loader = DataLoader(data, batch_sampler=sampler, collate_fn=again, num_workers=0)
    batches = list(loader)
    assert len(batches) == 3
    assert [b["attention_mask"].sum().item() for b in batches] == [3, 8, 15]  # lengths (1, 2), (3, 5), (7, 8)
    assert all(b["input_ids"].shape[1] % 4 == 0 for b in batches)
    pack = pack_collate(8)
    assert pickle.loads(pickle.dumps(pack)) == pack and isinstance(pack, PackCollate)


def test_pad_collate_misconfiguration():
    with pytest.raises(SpeedupConfigError, match=r"`multiple_of`=0 is out of range. Allowed values: an integer >= 1"):
        pad_collate(multiple_of=0)
    with pytest.raises(SpeedupConfigError, match="`samples` is empty"):
        pad_collate()([])
    with pytest.raises(SpeedupConfigError, match="a sample of type Tensor holds no token tensor"):
        pad_collate()([torch.rand(3, 8, 8)])
    with pytest.raises(SpeedupConfigError, match="a sample of type dict holds no token tensor.*HINT: sequence batch"):
        token_tensor({"pixels": torch.rand(3)})
    with pytest.raises(SpeedupConfigError, match="a sample of type dict holds no token tensor"):
        token_tensor({"input_ids": torch.rand(4)})  # floats are not tokens
    with pytest.raises(SpeedupConfigError, match="a sample of type str holds no token tensor"):
        token_tensor("some text")
    assert token_tensor((torch.tensor([1, 2]), 0)).tolist() == [1, 2]


# ---------------------------------------------------------------------------------------------- pack_sequences
def test_pack_sequences_docstring_example():
    out = pack_sequences([[1, 2, 3], [4, 5], [6, 7, 8, 9]], block_size=4)
    assert out["input_ids"].tolist() == [[1, 2, 3, 4], [5, 6, 7, 8], [9, 0, 0, 0]]
    assert out["position_ids"].tolist() == [[0, 1, 2, 0], [0, 0, 1, 2], [0, 0, 1, 2]]
    assert out["labels"].tolist() == [[-100, 2, 3, -100], [-100, -100, 7, 8], [-100, -100, -100, -100]]
    assert out["document_ids"].tolist() == [[0, 0, 0, 1], [0, 1, 1, 1], [0, 1, 1, 1]]
    assert out["cu_seqlens"].tolist() == [0, 3, 4, 5, 8, 9, 12]
    assert out["cu_seqlens"].dtype == torch.int32
    assert int(out["max_seqlen"]) == 3


@pytest.mark.parametrize("seed", range(6))
def test_pack_sequences_properties(seed):
    gen = torch.Generator().manual_seed(seed)
    block = int(torch.randint(4, 20, (1,), generator=gen))
    lengths = torch.randint(1, 30, (int(torch.randint(1, 9, (1,), generator=gen)),), generator=gen).tolist()
    docs = [torch.randint(1, VOCAB, (n,), generator=gen) for n in lengths]
    out = pack_sequences(docs, block, pad_value=0)
    total = sum(lengths)
    rows = -(-total // block)
    for key in ("input_ids", "labels", "position_ids", "document_ids"):
        assert out[key].shape == (rows, block), key
    flat_ids = out["input_ids"].flatten()
    flat_pos = out["position_ids"].flatten()
    flat_labels = out["labels"].flatten()
    assert flat_ids[:total].equal(torch.cat(docs)), "documents end to end, in order"
    assert (flat_ids[total:] == 0).all()

    # segment starts: every document start and every row start (and the padding)
    starts = torch.zeros(rows * block, dtype=torch.bool)
    starts[torch.tensor([0, *lengths[:-1]]).cumsum(0)] = True
    starts[::block] = True
    if total < rows * block:
        starts[total] = True
    assert (flat_pos == 0).equal(starts), "position_ids restart exactly at document and row starts"
    assert (torch.diff(flat_pos)[~starts[1:]] == 1).all(), "and count up by one inside a segment"
    assert (flat_labels[starts] == IGNORE_INDEX).all()
    assert (flat_labels[total:] == IGNORE_INDEX).all()
    keep = ~starts
    keep[total:] = False
    assert flat_labels[keep].equal(flat_ids[keep]), "everything else is labelled with its own token"

    cu = out["cu_seqlens"].long()
    assert cu[0] == 0 and cu[-1] == rows * block
    assert cu[:-1].equal(torch.nonzero(flat_pos == 0).flatten()), "cu_seqlens = where position_ids restart"
    assert int(out["max_seqlen"]) == int(torch.diff(cu).max())
    doc = out["document_ids"]
    assert (doc[:, 0] == 0).all()
    assert doc.equal((out["position_ids"] == 0).long().cumsum(1) - 1)


def test_packed_attention_mask_is_block_diagonal_causal():
    out = pack_sequences(_docs((5, 11, 3, 9, 20)), 16)
    mask = packed_attention_mask(out["position_ids"])
    rows, length = out["input_ids"].shape
    assert mask.shape == (rows, 1, length, length) and mask.dtype == torch.bool
    doc = out["document_ids"]
    same_doc = doc[:, :, None] == doc[:, None, :]
    causal = torch.ones(length, length, dtype=torch.bool).tril()
    assert mask[:, 0].equal(same_doc & causal)
    # the same mask from cu_seqlens, over the flattened rows
    cu = out["cu_seqlens"].long()
    seg = torch.repeat_interleave(torch.arange(len(cu) - 1), torch.diff(cu)).view(rows, length)
    assert mask[:, 0].equal((seg[:, :, None] == seg[:, None, :]) & causal)
    assert packed_attention_mask(out["position_ids"], causal=False)[:, 0].equal(same_doc)
    assert packed_attention_mask(torch.tensor([[0, 1, 0]]))[0, 0].int().tolist() == [[1, 0, 0], [1, 1, 0], [0, 0, 1]]


def test_pack_misconfiguration():
    with pytest.raises(SpeedupConfigError, match=r"`block_size`=0 is out of range. Allowed values: an integer >= 1"):
        pack_sequences([[1, 2]], 0)
    with pytest.raises(SpeedupConfigError, match="`sequences` is empty"):
        pack_sequences([], 4)
    with pytest.raises(SpeedupConfigError, match=r"`sequences`\[1\] is empty"):
        pack_sequences([[1], []], 4)
    with pytest.raises(SpeedupConfigError, match=r"`block_size`=0 is out of range"):
        pack_collate(0)
    with pytest.raises(SpeedupConfigError, match=r"`keys`=\('attention_mask',\) is not supported"):
        pack_collate(8, keys=("attention_mask",))
    with pytest.raises(SpeedupConfigError, match=r"`position_ids` has shape \(3,\)"):
        packed_attention_mask(torch.tensor([0, 1, 0]))


def test_pack_collate_keys():
    batch = pack_collate(16)([{"input_ids": d} for d in _docs()])
    assert set(batch) == {"input_ids", "labels", "position_ids"}
    assert batch["input_ids"].shape == (2, 16)
    every = pack_collate(16, keys=("input_ids", "cu_seqlens", "max_seqlen", "document_ids"))(_docs())
    assert set(every) == {"input_ids", "cu_seqlens", "max_seqlen", "document_ids"}


# ---------------------------------------------------------------------------------------------- no cross-document attn
class _TinyCausalLM(nn.Module):
    """2 pre-norm blocks, SDPA with the packed mask, a learned position embedding indexed by position_ids."""

    def __init__(self, vocab: int = VOCAB, d: int = 32, heads: int = 4, layers: int = 2, max_pos: int = 64) -> None:
        super().__init__()
        self.heads = heads
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(max_pos, d)
        self.blocks = nn.ModuleList(
            nn.ModuleDict(
                {
                    "ln1": nn.LayerNorm(d),
                    "qkv": nn.Linear(d, 3 * d),
                    "proj": nn.Linear(d, d),
                    "ln2": nn.LayerNorm(d),
                    "mlp": nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d)),
                }
            )
            for _ in range(layers)
        )
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab)

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        x = self.tok(input_ids) + self.pos(position_ids)
        mask = packed_attention_mask(position_ids)
        b, length, d = x.shape
        for blk in self.blocks:
            q, k, v = blk["qkv"](blk["ln1"](x)).split(d, dim=-1)
            q, k, v = (t.view(b, length, self.heads, d // self.heads).transpose(1, 2) for t in (q, k, v))
            att = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            x = x + blk["proj"](att.transpose(1, 2).reshape(b, length, d))
            x = x + blk["mlp"](blk["ln2"](x))
        return self.head(self.ln(x))


def _segments(lengths: list[int], block: int) -> list[tuple[int, int]]:
    """(start, end) of every packed segment in the flattened rows: documents, cut at row boundaries."""
    out = []
    pos = 0
    for n in lengths:
        end = pos + n
        while pos < end:
            cut = min(end, (pos // block + 1) * block)
            out.append((pos, cut))
            pos = cut
    return out


def _check_against_alone(run: Any, docs: list[torch.Tensor], block: int) -> None:
    """Packed logits of every segment == the logits of that segment run alone (position_ids from 0)."""
    packed = pack_sequences(docs, block)
    with torch.no_grad():
        logits = run(packed["input_ids"], packed["position_ids"]).reshape(-1, VOCAB)
        flat = torch.cat(docs)
        for start, end in _segments([len(d) for d in docs], block):
            alone = run(flat[start:end][None], torch.arange(end - start)[None])[0]
            torch.testing.assert_close(logits[start:end], alone, atol=1e-5, rtol=0, msg=f"segment {start}:{end}")


def _loss_terms_check(run: Any, docs: list[torch.Tensor], block: int) -> None:
    """The packed labels give the same next-token loss as the documents trained one at a time."""
    packed = pack_sequences(docs, block)
    with torch.no_grad():
        logits = run(packed["input_ids"], packed["position_ids"])
        packed_loss = F.cross_entropy(
            logits[:, :-1].reshape(-1, VOCAB), packed["labels"][:, 1:].reshape(-1), reduction="sum"
        )
        alone = sum(
            F.cross_entropy(run(d[None], torch.arange(len(d))[None])[0, :-1], d[1:], reduction="sum") for d in docs
        )
    count = int((packed["labels"][:, 1:] != IGNORE_INDEX).sum())
    assert count == sum(len(d) - 1 for d in docs)
    torch.testing.assert_close(packed_loss, alone, atol=1e-4, rtol=1e-5)


def test_packing_no_cross_document_attention_sdpa():
    torch.manual_seed(0)
    model = _TinyCausalLM().eval()
    docs = _docs()
    _check_against_alone(model, docs, 16)
    _loss_terms_check(model, docs, 16)
    # the check has teeth: a plain causal mask over the packed row lets later documents see earlier ones
    packed = pack_sequences(docs, 16)
    leaky = packed["position_ids"].clone()
    leaky[0] = torch.arange(16)  # row 0 as one document: document 1 now sees document 0
    with torch.no_grad():
        mixed = model(packed["input_ids"], leaky)[0, 5:16]
        alone = model(docs[1][None], torch.arange(11)[None])[0]
    assert (mixed - alone).abs().max() > 1e-3


def test_packing_documents_cut_across_rows():
    torch.manual_seed(0)
    model = _TinyCausalLM().eval()
    docs = _docs((7, 20, 2, 13, 1))  # 43 tokens into rows of 16: documents 1 and 3 are cut
    assert len(_segments([len(d) for d in docs], 16)) > len(docs)
    _check_against_alone(model, docs, 16)


# ---------------------------------------------------------------------------------------------- Hugging Face causal LM
def _hf_model(attn_implementation: str) -> Any:
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=64,
        attn_implementation=attn_implementation,
    )
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).eval()


@pytest.mark.parametrize("attn_implementation", ["sdpa", "eager"])
def test_packing_hugging_face_causal_lm(attn_implementation):
    """A HF causal LM given pack_collate's input_ids + position_ids (no attention_mask) keeps documents apart.

    Only without a KV cache: pass ``use_cache=False`` (or set ``model.config.use_cache = False``), see the next test.
    """
    model = _hf_model(attn_implementation)
    docs = _docs()
    batch = pack_collate(16)(docs)
    assert "attention_mask" not in batch

    def run(input_ids: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        return model(input_ids=input_ids, position_ids=position_ids, use_cache=False).logits

    _check_against_alone(run, docs, 16)
    _loss_terms_check(run, docs, 16)
    # HF's own loss over the packed batch: the mean of the same next-token terms
    with torch.no_grad():
        loss = model(**batch, use_cache=False).loss
        alone = sum(model(input_ids=d[None], labels=d[None]).loss * (len(d) - 1) for d in docs)
    torch.testing.assert_close(loss, alone / sum(len(d) - 1 for d in docs), atol=1e-5, rtol=1e-5)


def test_packing_hugging_face_needs_use_cache_false():
    """With the config's default ``use_cache=True`` HF builds a cache and then ignores the packing in position_ids.

    transformers (5.x ``masking_utils._preprocess_mask_arguments``) looks for packed sequences only when
    ``attention_mask is None and cache is None``; in train mode too, unless gradient checkpointing turns the cache
    off. If this test fails, transformers now detects packing with a cache: drop the ``use_cache=False`` advice.
    """
    model = _hf_model("sdpa")
    docs = _docs()
    batch = pack_collate(16)(docs)
    model.train()  # a training step, as Lightning runs it
    with torch.no_grad():
        default = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"]).logits[0, 5:16]
        alone = model(input_ids=docs[1][None], use_cache=False).logits[0]
        assert (default - alone).abs().max() > 1e-3, "documents leak into each other with the default use_cache"
        model.config.use_cache = False  # the config-level fix: model(**batch) then keeps documents apart
        fixed = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"]).logits[0, 5:16]
    torch.testing.assert_close(fixed, alone, atol=1e-5, rtol=0)


# ---------------------------------------------------------------------------------------------- sequence_lengths
class _CountingDataset(torch.utils.data.Dataset):
    def __init__(self, lengths: list[int]) -> None:
        self.sizes = lengths
        self.reads = 0

    def __len__(self) -> int:
        return len(self.sizes)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        self.reads += 1
        return {"input_ids": torch.ones(self.sizes[i], dtype=torch.long)}


def test_sequence_lengths_reads_once_and_caches():
    data = _CountingDataset([3, 1, 4, 1, 5])
    first = sequence_lengths(data)
    assert first.lengths == [3, 1, 4, 1, 5] and first.source == "read" and first.seconds >= 0
    assert data.reads == 5
    second = sequence_lengths(data)
    assert second.lengths == first.lengths and second.source == "cache" and second.seconds == 0.0
    assert data.reads == 5, "the cache read nothing"
    other = _CountingDataset([2, 2])
    assert sequence_lengths(other).source == "read", "the cache is per dataset object"
    given = sequence_lengths(data, lengths=[1, 1, 1, 1, 1])
    assert given.source == "argument" and given.lengths == [1] * 5 and given.seconds == 0.0
    # a dataset that is not weak-referenceable (a plain list) is read every time, without error
    plain = [torch.tensor([1, 2]), torch.tensor([3])]
    assert sequence_lengths(plain).lengths == [2, 1]
    assert sequence_lengths(plain).source == "read"


def test_sequence_lengths_uses_dataset_lengths():
    data = _CountingDataset([3, 1, 4])
    data.lengths = [3, 1, 4]
    found = sequence_lengths(data)
    assert found.source == "dataset.lengths" and found.lengths == [3, 1, 4] and data.reads == 0
    assert sequence_lengths(data, lengths=[2, 2, 2]).source == "argument", "an explicit argument wins"


def test_sequence_lengths_misconfiguration():
    data = _CountingDataset([3, 1, 4, 1])
    with pytest.raises(SpeedupConfigError, match="`lengths` has 3 entries but the dataset has 4 samples"):
        sequence_lengths(data, lengths=[1, 2, 3])
    data.lengths = [1, 2]
    with pytest.raises(SpeedupConfigError, match="`lengths` has 2 entries but the dataset has 4 samples"):
        sequence_lengths(data)
    with pytest.raises(SpeedupConfigError, match="`dataset` of type generator has no length"):
        sequence_lengths(x for x in range(3))
    with pytest.raises(SpeedupConfigError, match="holds no token tensor"):
        sequence_lengths([torch.rand(3, 8, 8)])
