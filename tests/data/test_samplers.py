"""Sequence batch samplers: coverage, DDP sharding and balance, determinism, padding, resume state, bad input."""

from __future__ import annotations

import math
from collections import Counter
from itertools import islice
from typing import Any

import pytest
import torch
from lightning.fabric.utilities.data import _set_sampler_epoch
from torch.utils.data import DataLoader

from lightning_speedups import SpeedupConfigError
from lightning_speedups.data import LengthGroupedSampler, PackedBatchSampler, TokenBudgetBatchSampler, pad_fraction

KINDS = ["length_grouped", "length_grouped_auto", "token_budget", "packed"]


def _lengths(n: int = 97, high: int = 30, seed: int = 0) -> list[int]:
    # 97 samples: a prime count, so batches and ranks never divide it evenly
    return torch.randint(1, high + 1, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _skewed(n: int = 5000, sigma: float = 0.5, seed: int = 0) -> torch.Tensor:
    """Long-tailed lengths (lognormal, median ~150 tokens, a few samples several times longer)."""
    noise = torch.randn(n, generator=torch.Generator().manual_seed(seed))
    return torch.exp(5.0 + sigma * noise).long().clamp(min=1)


def _make(kind: str, lengths: Any, **kw: Any) -> Any:
    if kind == "length_grouped":
        kw.setdefault("group_batches", 5)
        return LengthGroupedSampler(lengths, kw.pop("batch_size", 4), **kw)
    if kind == "length_grouped_auto":  # the default: the group size found from the lengths
        return LengthGroupedSampler(lengths, kw.pop("batch_size", 4), **kw)
    if kind == "token_budget":
        return TokenBudgetBatchSampler(lengths, kw.pop("max_tokens", 64), **kw)
    return PackedBatchSampler(lengths, kw.pop("block_size", 16), kw.pop("rows", 2), **kw)


def _flat(batches: list[list[int]]) -> list[int]:
    return [i for b in batches for i in b]


def _padded(lengths: Any, batch: list[int], multiple_of: int = 1) -> int:
    longest = max(int(lengths[i]) for i in batch)
    return math.ceil(longest / multiple_of) * multiple_of * len(batch)


def _step_imbalance(costs: list[list[int]]) -> torch.Tensor:
    """Per step, (slowest - fastest rank) / slowest, from each rank's per-batch cost."""
    per_step = torch.tensor(costs, dtype=torch.float64)  # (ranks, steps)
    high = per_step.max(0).values
    low = per_step.min(0).values
    return (high - low) / high


# ---------------------------------------------------------------------------------------------- coverage and len
@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("kind", KINDS)
def test_sampler_covers_every_index_once(kind, shuffle):
    lengths = _lengths()
    sampler = _make(kind, lengths, shuffle=shuffle, seed=3)
    for epoch in range(3):
        sampler.set_epoch(epoch)
        batches = list(sampler)
        assert len(sampler) == len(batches)
        assert all(batches), "no empty batch"
        assert sorted(_flat(batches)) == list(range(len(lengths))), f"epoch {epoch}: every index exactly once"


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("kind", KINDS)
def test_sampler_ddp_sharding(kind, world):
    lengths = _lengths()
    per_rank = [list(_make(kind, lengths, seed=1, rank=r, world_size=world)) for r in range(world)]
    counts = {len(b) for b in per_rank}
    assert len(counts) == 1, f"every rank runs the same number of steps, got {[len(b) for b in per_rank]}"
    for r in range(world):
        assert len(_make(kind, lengths, seed=1, rank=r, world_size=world)) == len(per_rank[r])
    everything = [b for batches in per_rank for b in batches]
    assert set(_flat(everything)) == set(range(len(lengths))), "the ranks together see every index"
    # the ranks are disjoint except the batches repeated to complete the last step (whole batches, < world of them)
    copies = Counter(tuple(b) for b in everything)
    extra = sum(c - 1 for c in copies.values())
    global_batches = len(everything) - extra
    assert extra == (-global_batches) % world
    assert max(copies.values()) <= 2
    assert sorted(_flat([list(b) for b in copies])) == list(range(len(lengths)))


def test_sampler_ddp_single_batch_is_repeated_on_every_rank():
    # fewer batches than ranks: every rank still gets one step
    per_rank = [list(LengthGroupedSampler([3, 4], 8, rank=r, world_size=3)) for r in range(3)]
    assert per_rank == [[[0, 1]]] * 3


# ---------------------------------------------------------------------------------------------- determinism, epochs
@pytest.mark.parametrize("kind", KINDS)
def test_sampler_determinism_and_epochs(kind):
    lengths = _lengths()
    a = _make(kind, lengths, seed=7)
    b = _make(kind, lengths, seed=7)
    assert list(a) == list(b) == list(a), "same seed and epoch: same batches (and iterating twice changes nothing)"
    epoch0 = list(a)
    a.set_epoch(1)
    epoch1 = list(a)
    assert epoch1 != epoch0, "a new epoch reshuffles"
    assert sorted(_flat(epoch1)) == sorted(_flat(epoch0))
    assert list(_make(kind, lengths, seed=8)) != epoch0, "another seed, another order"
    a.set_epoch(0)
    assert list(a) == epoch0, "going back to an epoch gives its order again"
    # what Lightning calls: batch_sampler.sampler.set_epoch(epoch)
    c = _make(kind, lengths, seed=7)
    c.sampler.set_epoch(1)
    assert c.epoch == 1 and list(c) == epoch1


@pytest.mark.parametrize("kind", KINDS)
def test_sampler_set_epoch_through_lightning(kind):
    lengths = _lengths()
    sampler = _make(kind, lengths, seed=2)
    loader = DataLoader(list(range(len(lengths))), batch_sampler=sampler)
    assert len(loader) == len(sampler)
    _set_sampler_epoch(loader, 4)  # what Lightning's fit loop does at every epoch start
    assert sampler.epoch == 4
    expected = _make(kind, lengths, seed=2)
    expected.set_epoch(4)
    assert [b.tolist() for b in loader] == list(expected)


@pytest.mark.parametrize("kind", ["length_grouped", "token_budget"])
def test_sampler_no_shuffle_is_sorted(kind):
    lengths = _lengths()
    batches = list(_make(kind, lengths, shuffle=False))
    order = [lengths[i] for i in _flat(batches)]
    assert order == sorted(order), "shortest first"
    assert sorted(_flat(batches)) == list(range(len(lengths)))
    again = _make(kind, lengths, shuffle=False, seed=99)
    again.set_epoch(5)
    assert list(again) == batches, "without shuffle neither seed nor epoch matters"


def test_packed_sampler_fills_batches_and_keeps_its_count_every_epoch():
    lengths = _lengths()
    sampler = PackedBatchSampler(lengths, 16, 2, shuffle=True, seed=1)
    counts = set()
    for epoch in range(4):
        sampler.set_epoch(epoch)
        batches = list(sampler)
        counts.add(len(batches))
        assert sorted(_flat(batches)) == list(range(len(lengths)))
        for batch in batches:  # within the budget, unless one document alone is longer than it
            assert len(batch) == 1 or sum(lengths[i] for i in batch) <= 32
    assert len(counts) == 1, "Lightning reads len() once: the count must not change between epochs"
    # a document longer than the whole budget gets a batch of its own (the collate cuts it into rows)
    assert list(PackedBatchSampler([3, 40, 2], 8, 2, shuffle=False)) == [[1], [0, 2]]


def test_sampler_docstring_examples():
    lengths = [5, 1, 4, 2, 8, 3]
    assert list(LengthGroupedSampler(lengths, 2, shuffle=False)) == [[1, 3], [5, 2], [0, 4]]
    assert list(TokenBudgetBatchSampler(lengths, 8, shuffle=False)) == [[1, 3], [5, 2], [0], [4]]
    assert list(PackedBatchSampler(lengths, 4, 2, shuffle=False)) == [[4], [0, 1, 3], [2, 5]]
    assert pad_fraction([2, 4, 4, 8], [[0, 1], [2, 3]]) == 0.25
    assert pad_fraction([2, 4], [[0, 1]], multiple_of=8) == 1 - 6 / 16
    assert "batch_size=2" in repr(LengthGroupedSampler(lengths, 2))


# ---------------------------------------------------------------------------------------------- padding on skewed data
def test_length_grouped_pad_fraction_skewed():
    lengths = _skewed(sigma=0.3)
    pad_to_max = pad_fraction(lengths, [list(range(len(lengths)))])
    assert pad_to_max > 0.5, "one batch padded to the longest sample is mostly padding"
    random_batches = [list(range(i, min(i + 32, len(lengths)))) for i in range(0, len(lengths), 32)]
    assert pad_fraction(lengths, random_batches) > 0.3
    for seed in range(3):
        assert pad_fraction(lengths, list(LengthGroupedSampler(lengths, 32, seed=seed))) <= 0.05


def test_length_grouped_pad_fraction_heavier_tail():
    """Sorting within random groups of 50 batches pads more as the tail grows; larger groups pad less; "auto" finds
    the group size that keeps the padding under 5%.

    On lognormal(5, 0.5) lengths fixed groups of 50 batches pad ~6% (Hugging Face's group_by_length has the same
    trade-off: small groups mix the data set more); one group over the whole data set stays under 5%.
    """
    lengths = _skewed(sigma=0.5)
    pad_to_max = pad_fraction(lengths, [list(range(len(lengths)))])
    fixed = pad_fraction(lengths, list(LengthGroupedSampler(lengths, 32, group_batches=50)))
    assert 0.05 < fixed <= 0.08 < pad_to_max
    fractions = [pad_fraction(lengths, list(LengthGroupedSampler(lengths, 32, group_batches=g))) for g in (5, 50, 157)]
    assert fractions[0] > fractions[1] > fractions[2]
    assert fractions[2] <= 0.05, "one group (whole data set sorted, batches shuffled)"
    assert pad_fraction(lengths, list(LengthGroupedSampler(lengths, 32, shuffle=False))) <= 0.05
    auto = LengthGroupedSampler(lengths, 32)
    assert pad_fraction(lengths, list(auto)) <= 0.05 and 50 < auto.group_size < 157


def _lognormal(n: int = 20000, seed: int = 0) -> torch.Tensor:
    """The issue's long tail: log-normal lengths, median 37 tokens, clipped at 512 (groups of 50 batches pad 12%)."""
    noise = torch.randn(n, generator=torch.Generator().manual_seed(seed))
    return torch.exp(math.log(37.0) + 0.8 * noise).round().clamp(1, 512).long()


def _bimodal(n: int = 20000, seed: int = 0) -> torch.Tensor:
    """Short questions and long documents: 70% around 30 tokens, 30% around 400."""
    g = torch.Generator().manual_seed(seed)
    short = 30.0 + 5.0 * torch.randn(n, generator=g)
    long = 400.0 + 40.0 * torch.randn(n, generator=g)
    return torch.where(torch.rand(n, generator=g) < 0.7, short, long).round().clamp(1, 512).long()


DISTRIBUTIONS = {
    "uniform": lambda: torch.randint(1, 513, (20000,), generator=torch.Generator().manual_seed(0)),
    "lognormal": _lognormal,
    "bimodal": _bimodal,
    "equal": lambda: torch.full((20000,), 64),
}


@pytest.mark.parametrize("batch_size", [8, 32])
@pytest.mark.parametrize("name", list(DISTRIBUTIONS))
def test_length_grouped_auto_keeps_padding_under_5pct(name, batch_size):
    lengths = DISTRIBUTIONS[name]()
    sampler = LengthGroupedSampler(lengths, batch_size, seed=3)
    for epoch in range(3):  # the group size was found on two epochs of this seed: the third is checked too
        sampler.set_epoch(epoch)
        assert pad_fraction(lengths, list(sampler)) <= 0.05, f"{name}, epoch {epoch}, group {sampler.group_size}"
    group = sampler.group_size
    assert group == LengthGroupedSampler(lengths, batch_size, seed=3).group_size, "deterministic given the seed"
    if name == "equal":
        assert group == 1, "nothing to sort: every batch random"
    else:  # the most random grouping that meets the bound: a quarter of the group pads more than 5%
        quarter = LengthGroupedSampler(lengths, batch_size, seed=3, group_batches=max(1, group // 4))
        assert pad_fraction(lengths, list(quarter)) > 0.05


def test_length_grouped_auto_on_the_issues_long_tail():
    # issue 49: on log-normal lengths (median 37, a tail to 512) fixed groups of 50 batches pad 12% of the tokens
    lengths = _lognormal()
    assert float(lengths.median()) == 37.0 and int(lengths.max()) == 512
    assert pad_fraction(lengths, list(LengthGroupedSampler(lengths, 32, group_batches=50))) > 0.11
    sampler = LengthGroupedSampler(lengths, 32)
    assert pad_fraction(lengths, list(sampler)) <= 0.05 and sampler.group_size == 128
    # a stricter bound needs larger groups
    strict = LengthGroupedSampler(lengths, 32, max_pad_fraction=0.02)
    assert strict.group_size > sampler.group_size and pad_fraction(lengths, list(strict)) <= 0.02


@pytest.mark.parametrize("world", [2, 3])
def test_length_grouped_auto_ddp_shares_are_disjoint_and_equal(world):
    lengths = _lognormal(n=3001)
    per_rank = [LengthGroupedSampler(lengths, 16, seed=2, rank=r, world_size=world) for r in range(world)]
    assert len({s.group_size for s in per_rank}) == 1, "every rank finds the same group size"
    batches = [list(s) for s in per_rank]
    assert len({len(b) for b in batches}) == 1, "every rank runs the same number of steps"
    everything = [tuple(b) for rank in batches for b in rank]
    copies = Counter(everything)
    assert sum(c - 1 for c in copies.values()) < world, "only the batches that complete the last step repeat"
    assert sorted(i for b in copies for i in b) == list(range(len(lengths))), "disjoint, and together every index"
    assert pad_fraction(lengths, [list(b) for b in copies]) <= 0.05


def test_length_grouped_auto_warns_when_no_grouping_reaches_the_bound():
    lengths = _lognormal(n=2000)  # 2000 samples in batches of 64: the tail's batches span hundreds of tokens
    with pytest.warns(UserWarning, match="even the whole data set sorted by length pads .* HINT: TokenBudgetBatch"):
        sampler = LengthGroupedSampler(lengths, 64)
        batches = list(sampler)
    assert sampler.group_size == len(batches) == 32


def test_length_grouped_explicit_group_is_unchanged():
    """An explicit ``group_batches`` builds the same batches as the per-group loop it replaced."""
    lengths = _skewed(n=997, sigma=0.5)
    for world in (1, 2):
        sampler = LengthGroupedSampler(lengths, 8, group_batches=5, seed=4, rank=0, world_size=world)
        perm = torch.randperm(len(lengths), generator=sampler._generator(0))
        group = math.ceil(5 / world) * world * 8
        order = []
        for start in range(0, len(perm), group):
            chunk = perm[start : start + group]
            order.extend(chunk[torch.sort(lengths[chunk], stable=True).indices].tolist())
        assert sampler._global_batches(sampler._generator(0)) == [order[i : i + 8] for i in range(0, len(order), 8)]


@pytest.mark.parametrize("multiple_of", [1, 8])
def test_token_budget_within_budget_and_low_padding(multiple_of):
    lengths = _skewed(sigma=0.8)
    budget = 8192
    sampler = TokenBudgetBatchSampler(lengths, budget, multiple_of=multiple_of, seed=1)
    batches = list(sampler)
    assert sorted(_flat(batches)) == list(range(len(lengths)))
    assert max(_padded(lengths, b, multiple_of) for b in batches) <= budget
    assert pad_fraction(lengths, batches, multiple_of=multiple_of) <= 0.05
    assert pad_fraction(lengths, [list(range(len(lengths)))]) > 0.8
    # most batches are nearly full: one step costs about the same whatever the lengths
    fill = torch.tensor([_padded(lengths, b, multiple_of) / budget for b in batches])
    assert fill.median() > 0.9
    capped = list(TokenBudgetBatchSampler(lengths, budget, multiple_of=multiple_of, max_batch_size=16))
    assert max(len(b) for b in capped) == 16
    assert max(_padded(lengths, b, multiple_of) for b in capped) <= budget


def test_token_budget_fixed_batch_count_per_epoch():
    lengths = _skewed(n=2000)
    sampler = TokenBudgetBatchSampler(lengths, 4096, seed=0)
    counts = set()
    for epoch in range(3):
        sampler.set_epoch(epoch)
        counts.add(len(list(sampler)))
    assert len(counts) == 1


@pytest.mark.parametrize("kind", KINDS)
def test_sampler_ddp_balance(kind):
    """With 2 ranks, each step's padded tokens are about equal on both ranks (neither waits long for the other)."""
    lengths = _skewed(sigma=0.5)
    if kind == "length_grouped":
        samplers = [LengthGroupedSampler(lengths, 32, rank=r, world_size=2) for r in range(2)]
        limit = 0.10

        def cost(b):
            return _padded(lengths, b)
    elif kind == "token_budget":
        samplers = [TokenBudgetBatchSampler(lengths, 8192, multiple_of=8, rank=r, world_size=2) for r in range(2)]
        limit = 0.05

        def cost(b):
            return _padded(lengths, b, 8)
    else:
        samplers = [PackedBatchSampler(lengths, 512, 8, rank=r, world_size=2) for r in range(2)]
        limit = 0.05

        def cost(b):
            return math.ceil(sum(int(lengths[i]) for i in b) / 512) * 512

    imbalance = _step_imbalance([[cost(b) for b in s] for s in samplers])
    assert imbalance.mean() < limit, f"mean per-step imbalance {imbalance.mean():.3f}"
    assert imbalance.median() < limit / 2


def test_length_grouped_ddp_step_within_one_group():
    """A DDP step never spans two sorted groups, even when the world size does not divide ``group_batches``.

    Otherwise one rank gets a group's longest batch and another the next group's shortest in the same step.
    """
    lengths = torch.randperm(60, generator=torch.Generator().manual_seed(0)) + 1  # distinct lengths
    per_rank = [list(LengthGroupedSampler(lengths, 2, group_batches=2, rank=r, world_size=3)) for r in range(3)]
    for step in zip(*per_rank):
        in_rank_order = [int(lengths[i]) for batch in step for i in batch]
        assert in_rank_order == sorted(in_rank_order), f"step {step} mixes two groups"


# ---------------------------------------------------------------------------------------------- resume
@pytest.mark.parametrize("world", [1, 2])
@pytest.mark.parametrize("kind", KINDS)
def test_sampler_resume_mid_epoch(kind, world):
    lengths = _lengths()
    dist = {} if world == 1 else {"rank": 1, "world_size": 2}
    sampler = _make(kind, lengths, seed=5, **dist)
    sampler.set_epoch(2)
    full = list(sampler)
    assert len(full) > 4
    k = 3
    it = iter(sampler)
    taken = list(islice(it, k))
    assert taken == full[:k]
    state = sampler.state_dict()
    assert state == {"seed": 5, "epoch": 2, "consumed": k}
    assert sampler.state_dict(consumed=k - 1)["consumed"] == k - 1

    fresh = _make(kind, lengths, seed=5, **dist)
    fresh.load_state_dict(state)
    assert fresh.state_dict() == state, "a state saved again before iterating keeps the skip"
    fresh.sampler.set_epoch(2)  # Lightning sets the (same) epoch again at the restart
    assert list(fresh) == full[k:]
    fresh.set_epoch(3)
    nxt = _make(kind, lengths, seed=5, **dist)
    nxt.set_epoch(3)
    assert list(fresh) == list(nxt), "the next epoch is whole again"

    # consumed given by the loop (a prefetching loader runs ahead of it)
    behind = _make(kind, lengths, seed=5, **dist)
    behind.load_state_dict(sampler.state_dict(consumed=k - 1))
    assert list(behind) == full[k - 1 :]


@pytest.mark.parametrize("kind", KINDS)
def test_sampler_resume_state_of_another_epoch_does_not_skip(kind):
    lengths = _lengths()
    sampler = _make(kind, lengths, seed=5)
    list(islice(iter(sampler), 2))
    state = sampler.state_dict()  # epoch 0, 2 consumed
    fresh = _make(kind, lengths, seed=5)
    fresh.load_state_dict(state)
    fresh.set_epoch(1)
    expected = _make(kind, lengths, seed=5)
    expected.set_epoch(1)
    assert list(fresh) == list(expected)


@pytest.mark.parametrize("kind", KINDS)
def test_sampler_state_after_epoch_end(kind):
    """A state taken after the next epoch was set (before it is iterated) must not skip that epoch."""
    lengths = _lengths()
    sampler = _make(kind, lengths, seed=5)
    list(sampler)
    assert sampler.state_dict()["consumed"] == len(sampler), "whole epoch consumed"
    sampler.set_epoch(1)
    state = sampler.state_dict()
    assert state["consumed"] == 0
    fresh = _make(kind, lengths, seed=5)
    fresh.load_state_dict(state)
    fresh.set_epoch(1)
    assert len(list(fresh)) == len(fresh) > 0


@pytest.mark.parametrize("kind", KINDS)
def test_sampler_state_is_plain_data(kind, tmp_path):
    lengths = _lengths()
    sampler = _make(kind, lengths, seed=11)
    sampler.set_epoch(1)
    full = list(sampler)
    list(islice(iter(sampler), 4))
    path = tmp_path / "state.pt"
    torch.save(sampler.state_dict(), path)
    state = torch.load(path, weights_only=True)
    assert state == {"seed": 11, "epoch": 1, "consumed": 4}
    fresh = _make(kind, lengths, seed=0)  # the seed comes from the state
    fresh.load_state_dict(state)
    assert list(fresh) == full[4:]


def test_sampler_load_state_misconfiguration():
    sampler = LengthGroupedSampler([1, 2, 3], 2)
    with pytest.raises(SpeedupConfigError, match="`state` has no 'consumed'"):
        sampler.load_state_dict({"seed": 0, "epoch": 0})


# ---------------------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("kind", KINDS)
def test_sampler_misconfiguration_lengths(kind):
    with pytest.raises(SpeedupConfigError, match=r"`lengths` has shape \(0,\)"):
        _make(kind, [])
    with pytest.raises(SpeedupConfigError, match=r"`lengths` has shape \(2, 2\)"):
        _make(kind, [[1, 2], [3, 4]])
    with pytest.raises(SpeedupConfigError, match=r"`lengths`\[1\]=0 is not a sequence length. Allowed values: integ"):
        _make(kind, [3, 0, 2])
    with pytest.raises(SpeedupConfigError, match=r"`lengths`\[2\]=-4 is not a sequence length"):
        _make(kind, torch.tensor([3, 1, -4]))
    for bad in ([1.5, 2], torch.tensor([3.0, 4.0]), [True, True], "abc", [None]):
        with pytest.raises(SpeedupConfigError, match="`lengths` of type .* is not a sequence of integers"):
            _make(kind, bad)


@pytest.mark.parametrize("kind", KINDS)
def test_sampler_misconfiguration_ranks(kind):
    with pytest.raises(SpeedupConfigError, match=r"`rank`=0 and `world_size`=None must be given together"):
        _make(kind, [1, 2], rank=0)
    with pytest.raises(SpeedupConfigError, match=r"`rank`=None and `world_size`=2 must be given together"):
        _make(kind, [1, 2], world_size=2)
    with pytest.raises(SpeedupConfigError, match=r"`rank`=2 is out of range. Allowed values: an integer in \[0, 1\]"):
        _make(kind, [1, 2], rank=2, world_size=2)
    with pytest.raises(SpeedupConfigError, match=r"`rank`=-1 is out of range"):
        _make(kind, [1, 2], rank=-1, world_size=2)
    with pytest.raises(SpeedupConfigError, match=r"`world_size`=0 is out of range. Allowed values: an integer >= 1"):
        _make(kind, [1, 2], rank=0, world_size=0)
    with pytest.raises(SpeedupConfigError, match="`shuffle`='yes' is not supported"):
        _make(kind, [1, 2], shuffle="yes")
    with pytest.raises(SpeedupConfigError, match=r"`epoch`=-1 is out of range"):
        _make(kind, [1, 2]).set_epoch(-1)


def test_sampler_misconfiguration_sizes():
    for bad in (0, -2):
        with pytest.raises(SpeedupConfigError, match=rf"`batch_size`={bad} is out of range. Allowed values: an int"):
            LengthGroupedSampler([1, 2], bad)
    with pytest.raises(SpeedupConfigError, match=r"`group_batches`=0 is out of range.*HINT: or 'auto'"):
        LengthGroupedSampler([1, 2], 2, group_batches=0)
    with pytest.raises(SpeedupConfigError, match=r"`group_batches`='big' is not an integer"):
        LengthGroupedSampler([1, 2], 2, group_batches="big")
    for bad in (0.0, 1.0, -0.1):
        with pytest.raises(SpeedupConfigError, match=rf"`max_pad_fraction`={bad} is out of range"):
            LengthGroupedSampler([1, 2], 2, max_pad_fraction=bad)
    with pytest.raises(SpeedupConfigError, match=r"`block_size`=0 is out of range. Allowed values: an integer >= 1"):
        PackedBatchSampler([1, 2], 0, 2)
    with pytest.raises(SpeedupConfigError, match=r"`rows`=0 is out of range. Allowed values: an integer >= 1"):
        PackedBatchSampler([1, 2], 8, 0)
    with pytest.raises(SpeedupConfigError, match=r"`multiple_of`=0 is out of range. Allowed values: an integer >= 1"):
        TokenBudgetBatchSampler([1, 2], 8, multiple_of=0)
    with pytest.raises(SpeedupConfigError, match=r"`multiple_of`=0 is out of range"):
        pad_fraction([1, 2], [[0, 1]], multiple_of=0)
    with pytest.raises(SpeedupConfigError, match=r"`max_tokens`=0 is out of range"):
        TokenBudgetBatchSampler([1, 2], 0)
    with pytest.raises(SpeedupConfigError, match=r"`max_batch_size`=0 is out of range"):
        TokenBudgetBatchSampler([1, 2], 8, max_batch_size=0)
    with pytest.raises(
        SpeedupConfigError, match=r"`max_tokens`=8 is below sample 2, of length 9. Allowed values: an integer >= 9"
    ):
        TokenBudgetBatchSampler([1, 2, 9, 3], 8)
    with pytest.raises(SpeedupConfigError, match=r"`max_tokens`=9 is below sample 1, of length 9 \(padded to 16\)"):
        TokenBudgetBatchSampler([1, 9, 3], 9, multiple_of=8)
    TokenBudgetBatchSampler([1, 9, 3], 9)  # exactly the longest sample fits
