"""count_tokens: one counting rule for real and padded tokens, on every batch layout pad_collate and users produce."""

from __future__ import annotations

import pytest
import torch

from lightning_speedups._errors import SpeedupConfigError
from lightning_speedups._tokens import TokenCount, TokenCounter, as_token_count, count_tokens, token_ids
from lightning_speedups.data import pad_collate

IDS = torch.tensor([[5, 6, 7, 8], [9, 4, 0, 0], [3, 0, 0, 0]])  # 7 real tokens in 12 positions


def test_count_tokens_dict_from_pad_collate():
    samples = [
        {"input_ids": torch.tensor([5, 6, 7]), "labels": torch.tensor([5, 6, 7])},
        {"input_ids": torch.tensor([8]), "labels": torch.tensor([8])},
    ]
    batch = pad_collate(multiple_of=4)(samples)
    c = count_tokens(batch)
    assert (c.tokens, c.padded, c.sequences, c.source) == (4, 8, 2, "attention_mask")
    assert c.pad_fraction == 0.5


def test_count_tokens_tuple_from_pad_collate_reads_the_trailing_mask():
    samples = [(torch.tensor([5, 6, 7]), torch.tensor([1, 2, 3])), (torch.tensor([8]), torch.tensor([4]))]
    batch = pad_collate(multiple_of=1)(samples)  # (input_ids, labels, attention_mask)
    c = count_tokens(batch)
    assert (c.tokens, c.padded, c.source) == (4, 6, "attention_mask")
    # a tokens-only tuple: (input_ids, attention_mask)
    c = count_tokens(pad_collate(multiple_of=1)([(torch.tensor([1, 2]),), (torch.tensor([3]),)]))
    assert (c.tokens, c.padded, c.source) == (3, 4, "attention_mask")


def test_count_tokens_rules_in_order():
    mask = (IDS != 0).long()
    labels = IDS.masked_fill(IDS == 0, -100)
    assert count_tokens({"input_ids": IDS, "attention_mask": mask}, pad_value=5).source == "attention_mask"
    assert count_tokens({"input_ids": IDS}, pad_value=0) == TokenCount(7, 12, 3, "pad_value")
    assert count_tokens({"input_ids": IDS, "labels": labels}) == TokenCount(7, 12, 3, "labels")
    assert count_tokens({"input_ids": IDS, "labels": labels}, ignore_index=-1) == TokenCount(12, 12, 3, "labels")
    assert count_tokens(IDS) == TokenCount(12, 12, 3, "all")  # nothing says what is padding
    assert count_tokens(IDS, pad_value=0).tokens == 7
    assert count_tokens((IDS, labels)) == TokenCount(7, 12, 3, "labels")  # a tuple's second item as labels
    assert count_tokens([IDS, labels, mask]).source == "attention_mask"
    assert count_tokens({"tokens": IDS}, pad_value=0).tokens == 7


def test_count_tokens_does_not_read_per_token_labels_as_a_mask():
    binary = torch.tensor([[0, 1, 0, 1], [1, 0, 1, 0], [0, 1, 1, 0]])  # 0/1 but not one-sided: labels, not a mask
    assert count_tokens((IDS, binary)).source == "labels"
    assert count_tokens((IDS, binary), pad_value=0).tokens == 7


def test_count_tokens_refuses_image_batches():
    assert count_tokens((torch.randn(4, 3, 8, 8), torch.randint(0, 10, (4,)))) is None
    assert count_tokens(torch.randint(0, 255, (4, 3, 8, 8), dtype=torch.uint8)) is None  # uint8 images are 4-D
    assert count_tokens({"image": torch.randn(2, 3, 8, 8), "label": torch.tensor([1, 0])}) is None
    assert count_tokens(torch.tensor([1, 2, 3])) is None  # 1-D: class labels, not (batch, length)
    assert count_tokens(torch.ones(2, 3, dtype=torch.bool)) is None
    assert count_tokens([]) is None and token_ids("text") is None


def test_as_token_count_and_counter():
    assert as_token_count(5) == TokenCount(5, 5, 0, "custom")
    assert as_token_count(torch.tensor(5)).tokens == 5
    assert as_token_count((3, 4)).pad_fraction == 0.25
    assert as_token_count(None) is None
    for bad in ((5, 4), (-1, 2), "many", (1.0, 2), True):
        with pytest.raises(SpeedupConfigError, match="`batch_to_tokens` returned .* Allowed values: an int"):
            as_token_count(bad)
    assert TokenCounter(pad_value=0)(IDS).tokens == 7
    assert TokenCounter(batch_to_tokens=lambda b: (1, 2))(IDS) == TokenCount(1, 2, 0, "custom")
