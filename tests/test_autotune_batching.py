"""autotune's "batching" candidate for token data (issue 24): measured for token samples in a plain DataLoader, kept
as a SequenceBatching callback (also from the cache), skipped silently for image data and with a note where the
loader cannot be rebuilt. The real clock runs here, so only what ran and what the plan holds are asserted, never
which batching was faster."""

from __future__ import annotations

import json

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, SubsetRandomSampler

from lightning_speedups.autotune import autotune, list_candidates
from lightning_speedups.callbacks.sequence_batching import SequenceBatching
from lightning_speedups.data.padding import pad_collate
from lightning_speedups.demo import DemoClassifier
from tests.test_autotune import _loader as _image_loader

MAX_LEN = 128


class _LongTail(Dataset):
    """Token samples ``(ids, label)``: most 4-12 tokens, one in eight 96-128 (a long tail)."""

    def __init__(self, n: int = 64, same: int | None = None) -> None:
        g = torch.Generator().manual_seed(0)
        lengths = [
            same
            or (
                int(torch.randint(96, MAX_LEN + 1, (1,), generator=g))
                if i % 8 == 7
                else int(torch.randint(4, 13, (1,), generator=g))
            )
            for i in range(n)
        ]
        self.samples = [
            (torch.randint(1, 50, (n_,), generator=g), int(torch.randint(0, 4, (1,), generator=g))) for n_ in lengths
        ]

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int):  # noqa: ANN204
        return self.samples[i]


def _pad_to_max(items):  # noqa: ANN001, ANN202
    ids = torch.zeros(len(items), MAX_LEN, dtype=torch.long)
    for row, (x, _y) in enumerate(items):
        ids[row, : len(x)] = x
    return ids, torch.tensor([y for _x, y in items])


class _Classifier(L.LightningModule):
    """A small transformer classifier; it reads ``batch[0]`` (ids) and ``batch[1]`` (labels) of either the user's
    ``(ids, labels)`` or pad_collate's ``(input_ids, labels, attention_mask)``."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(50, 16)
        self.encoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(16, 2, 32, batch_first=True), 1)
        self.head = nn.Linear(16, 4)

    def training_step(self, batch, batch_idx):  # noqa: ANN001, ANN201
        x = batch[0]
        y = batch[1]
        return nn.functional.cross_entropy(self.head(self.encoder(self.embed(x)).mean(1)), y)

    def configure_optimizers(self):  # noqa: ANN201
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def _tokens(**kw) -> DataLoader:
    return DataLoader(_LongTail(**kw), batch_size=8, shuffle=True, collate_fn=_pad_to_max)


def _tune(loader: DataLoader, model: L.LightningModule | None = None, **kw):
    kw = {"cache": False, **kw}
    return autotune(
        model or _Classifier(),
        loader,
        candidates=["batching"],
        methods=[],
        budget_s=120.0,
        accelerator="cpu",
        max_epochs=1,
        **kw,
    )


def _batchings(plan) -> list[str]:  # noqa: ANN001
    return [cb.strategy for cb in plan.callbacks if isinstance(cb, SequenceBatching)]


def test_batching_is_first_and_measured_for_token_data_and_kept_as_a_callback(tmp_path):
    assert list_candidates()[0] == "batching"
    plan = _tune(_tokens(), cache=True, cache_dir=tmp_path)
    (choice,) = plan.choices
    assert choice.name == "batching" and choice.options == [None, "length_grouped"]
    assert "original" in choice.note  # the user's loader was estimated beside each batching
    kept = choice.chosen
    assert _batchings(plan) == ([kept] if kept else []) and plan.settings["batching"] == kept
    again = _tune(_tokens(), cache=True, cache_dir=tmp_path)  # the cached plan re-creates the callback
    assert again.from_cache and _batchings(again) == _batchings(plan)


def test_a_cached_batching_plan_fits_with_its_sequence_batching(tmp_path):
    _tune(_tokens(), cache=True, cache_dir=tmp_path)
    cache_file = tmp_path / "autotune.json"
    data = json.loads(cache_file.read_text())
    for entry in data["plans"].values():
        entry["settings"]["batching"] = "token_budget"  # as a trial that kept it leaves the plan
    cache_file.write_text(json.dumps(data))
    plan = _tune(_tokens(), cache=True, cache_dir=tmp_path)
    assert plan.from_cache and _batchings(plan) == ["token_budget"]
    callbacks, kwargs = plan
    trainer = L.Trainer(
        callbacks=callbacks,
        **kwargs,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        limit_train_batches=2,
        default_root_dir=tmp_path,
    )
    trainer.fit(_Classifier(), train_dataloaders=_tokens())
    (cb,) = [c for c in trainer.callbacks if isinstance(c, SequenceBatching)]
    assert cb.chosen == "token_budget" and trainer.global_step == 2


def test_image_data_gets_no_batching_choice_and_no_note():
    plan = _tune(_image_loader(), model=DemoClassifier(width=4))
    assert plan.choices == [] and plan.notes == [] and "batching" not in plan.settings


def test_token_data_the_plan_cannot_rebatch_is_noted():
    data = _LongTail()
    loader = DataLoader(data, batch_size=8, sampler=SubsetRandomSampler(range(32)), collate_fn=_pad_to_max)
    plan = _tune(loader)
    assert plan.choices == [] and any(
        n.startswith("batching not tried: `train_dataloaders` has a custom sampler (SubsetRandomSampler)")
        for n in plan.notes
    )


def test_token_data_of_one_length_is_not_timed():
    plan = _tune(_tokens(same=16))
    assert plan.choices == [] and "batching not tried: the samples read all have 16 tokens" in plan.notes[0]


def _labelled_pad(items):  # noqa: ANN001, ANN202
    """A collate that does more than pad: it builds per-token labels the step needs (as an MLM collator does)."""
    ids, y = _pad_to_max(items)
    return {"input_ids": ids, "labels": y, "token_labels": ids.roll(1, dims=1)}


class _DictClassifier(_Classifier):
    def training_step(self, batch, batch_idx):  # noqa: ANN001, ANN201
        assert "token_labels" in batch, "a batch that did not go through the user's collate"
        return super().training_step((batch["input_ids"], batch["labels"]), batch_idx)


def test_a_collate_that_does_more_than_pad_batches_the_timed_batches_too():
    # before: the estimate collated with pad_collate, the step failed on it and batching was never measured
    def labelled_dynamic(items):  # noqa: ANN001, ANN202
        batch = pad_collate(multiple_of=1)([{"input_ids": x, "labels": y} for x, y in items])
        return {**batch, "token_labels": batch["input_ids"].roll(1, dims=1)}

    loader = DataLoader(_LongTail(), batch_size=8, shuffle=True, collate_fn=labelled_dynamic)
    plan = _tune(loader, model=_DictClassifier())
    (choice,) = plan.choices
    assert choice.name == "batching" and not any("failed" in n for n in plan.notes)
    assert (
        "the new batches go through your collate_fn, which does more than pad (its batch is a dict where "
        "padding gives a tuple)" in choice.note
    )


def test_a_collate_that_does_more_than_pad_to_one_width_is_not_timed():
    loader = DataLoader(_LongTail(), batch_size=8, shuffle=True, collate_fn=_labelled_pad)
    plan = _tune(loader, model=_DictClassifier())
    assert plan.choices == [] and plan.notes == [
        "batching not tried: your collate_fn does more than pad (its batch is a dict where padding gives a tuple), "
        "so the new batches would go through it, and it pads even the shortest samples to 128 tokens: there is no "
        "padding to save. HINT: pad to each batch's longest sample in it"
    ]
