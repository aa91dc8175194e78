"""The sequence batching benchmark's building blocks on tiny sizes: the task, the strategies, the models, the rows.

Nothing here asserts on speed: timings decide nothing in tests (they live in the benchmark's output).
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from lightning_speedups.benchmarks import _sequence_tasks as tasks
from lightning_speedups.benchmarks import sequences
from lightning_speedups.data import pack_collate, packed_attention_mask, pad_collate, pad_fraction
from lightning_speedups.measure import torch_threads

TINY = sequences.SIZES["tiny"]


@pytest.fixture(scope="module")
def task() -> tasks.SnippetTask:
    return tasks.snippet_task(max_len=512, per_class=100, val_per_class=10)


def test_snippet_task_is_long_tailed_and_balanced(task):
    stats = tasks.length_stats(task.train.lengths, task.max_len)
    assert stats["max"] <= task.max_len
    assert stats["median"] < task.max_len / 2  # most paragraphs are short ...
    assert stats["p90"] > 2 * stats["median"]  # ... and a few are long
    assert stats["pad_to_max"] > 0.4
    assert sorted(set(task.train.labels)) == list(range(len(tasks.KINDS)))
    assert [task.train.labels.count(k) for k in range(len(tasks.KINDS))] == [100] * len(tasks.KINDS)
    assert len(task.val) == 10 * len(tasks.KINDS)
    tokens, label = task.train[0]
    assert tokens.dtype == torch.long and int(tokens.min()) >= 1 and int(tokens.max()) < tasks.VOCAB
    assert tasks.snippet_task(max_len=512, per_class=100, val_per_class=10).train.lengths == task.train.lengths


def test_paragraph_kind():
    assert [
        tasks.paragraph_kind(p)
        for p in (b"    def f():", b"@cache\ndef g():", b"class A:", b'"""Doc."""', b"# note", b"import os")
    ] == [0, 0, 1, 2, 2, 3]


def test_strategies_cover_each_epoch_once(task):
    lengths = task.train.lengths
    strats = tasks.classifier_strategies(lengths, batch_size=16, max_len=512, seed=0)
    assert list(strats)[0] == tasks.BASELINE
    pads = {}
    for name, (epochs, collate) in strats.items():
        batches = epochs(0)
        assert sorted(i for b in batches for i in b) == list(range(len(lengths))), name
        assert epochs(1) != batches, f"{name}: the order does not change between epochs"
        pads[name] = pad_fraction(lengths, batches, multiple_of=512 if name == tasks.BASELINE else 8)
        ids, labels, mask = collate([task.train[i] for i in batches[0]])
        assert ids.shape == mask.shape and labels.shape == (len(batches[0]),)
        if name == tasks.BASELINE:
            assert ids.shape[1] == 512
    assert pads["length-grouped"] < pads["dynamic padding"] <= pads[tasks.BASELINE]
    assert pads["token budget"] < pads["dynamic padding"]
    budget = tasks.token_budget(lengths, 16, 512)
    for batch in strats["token budget"][0](0):
        assert math.ceil(max(lengths[i] for i in batch) / 8) * 8 * len(batch) <= budget


def test_classifier_ignores_padding(task):
    torch.manual_seed(0)
    model = tasks.SnippetClassifier(len(tasks.KINDS), 512, d=16, heads=2, layers=1).eval()
    samples = [task.train[i] for i in range(6)]
    with torch.no_grad():
        wide = model(*pad_collate(multiple_of=512)(samples)[::2])
        tight = model(*pad_collate()(samples)[::2])
    torch.testing.assert_close(wide, tight, atol=1e-5, rtol=1e-4)


def test_gpt_packed_equals_separate_documents():
    torch.manual_seed(0)
    model = tasks.ByteGPT(block_size=16, d=16, heads=2, layers=1).eval()
    docs = [torch.tensor([5, 6, 7]), torch.tensor([8, 9, 10, 11, 12]), torch.tensor([13, 14])]
    packed = pack_collate(16)(docs)
    pos = packed["position_ids"]
    with torch.no_grad():
        together = model(packed["input_ids"], pos, packed_attention_mask(pos))
        start = 0
        for doc in docs:
            alone = model(doc[None], torch.arange(len(doc))[None])
            torch.testing.assert_close(together[0, start : start + len(doc)], alone[0], atol=1e-5, rtol=1e-4)
            start += len(doc)


def test_lm_strategies_cover_the_documents():
    docs = tasks.lm_documents(block_size=64, max_docs=60)
    lengths = [len(d) for d in docs]
    assert max(lengths) <= 64 and min(lengths) >= 2
    pads = {}
    for name, (epochs, collate) in tasks.lm_strategies(lengths, batch_size=8, block_size=64, seed=0).items():
        batches = epochs(0)
        assert sorted(i for b in batches for i in b) == list(range(len(docs))), name
        batch = collate([docs[i] for i in batches[0]])
        assert int((batch["input_ids"] != tasks.PAD).sum()) == sum(lengths[i] for i in batches[0])
        if name == "packing":
            assert batch["input_ids"].shape[1] == 64 and "position_ids" in batch
            pads[name] = tasks.packed_pad_fraction(lengths, batches, 64)
        else:
            pads[name] = pad_fraction(lengths, batches, multiple_of=8)
    assert pads["packing"] < pads["per-document padding, random batches"]


@pytest.fixture(scope="module")
def tiny_rows():
    with torch_threads(1):
        return sequences.run(tiny=True)


def test_run_tiny_rows(tiny_rows):
    rates = [r for r in tiny_rows if r.metric == "non-pad tokens/s"]
    timed = [r for r in tiny_rows if r.metric == "train seconds"]
    assert [r.variant for r in rates[:3]] == [
        f"{n} vs pad-to-max" for n in ("dynamic padding", "length-grouped", "token budget")
    ]
    assert len(timed) == 3 and len(rates) == 5
    assert sum("LM packing" in r.variant for r in rates) == 2
    for row in tiny_rows:
        assert row.technique == "sequence_batching"
        assert "target" in row.extra and "target" not in row.note  # the goal in the JSON, never in a line
        assert set(row.extra["lengths"]) >= {"median", "p90", "max", "pad_to_max"}
    for row in rates:
        assert row.baseline > 0 and row.candidate > 0 and row.ratio > 0
        assert 0.0 <= row.extra["pad_fraction"] < 1.0 and row.extra["ratio_min"] <= row.extra["ratio_max"]
    for row in timed:
        assert 0.0 <= row.accuracy_baseline <= 1.0 and 0.0 <= row.accuracy_candidate <= 1.0
        assert row.baseline > 0 and (row.ratio > 0 or math.isnan(row.ratio))
    assert any(r.extra.get("curves") for r in timed)
    json.dumps([r.as_dict() for r in tiny_rows])  # the runner writes them as JSON


def test_main_prints_table_and_writes_json(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sequences.SIZES, "quick", TINY)
    out = tmp_path / "seq.json"
    with torch_threads(1):
        sequences.main(["--quick", "--json", str(out)])
    printed = capsys.readouterr().out
    assert "classifier data:" in printed and "LM documents:" in printed and "length-grouped" in printed
    payload = json.loads(out.read_text())
    assert payload["quick"] is True and payload["machine"]["cpu"] and len(payload["rows"]) == 8
