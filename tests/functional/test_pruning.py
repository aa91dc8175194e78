"""Functional pruning: structured (torch-pruning) on the demo CNN and resnet18, unstructured masks, reports, reload."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lightning_speedups._errors import SpeedupConfigError
from lightning_speedups.demo import DemoClassifier
from lightning_speedups.functional.pruning import (
    clean_pruned_state_dict,
    load_pruned,
    make_pruning_permanent,
    prune_structured,
    prune_unstructured,
    save_pruned,
    sparsity_report,
    weight_mask,
)

pytest.importorskip("torch_pruning")
X = torch.zeros(1, 3, 32, 32)


def test_pruning_functional_structured_demo():
    model = DemoClassifier(width=8)
    model.backbone[0][0].weight.requires_grad_(False)
    old = {n: p.detach().clone() for n, p in model.named_parameters()}
    summary = prune_structured(model, X, 0.5)
    assert summary.params_after < summary.params_before and summary.macs_after < summary.macs_before
    assert summary.layers["backbone.0.0"] == (8, 4) and summary.layers["backbone.6.0"] == (32, 16)
    assert model.head.in_features == 16 and model.head.out_features == 10  # classifier ignored by default
    assert not model.backbone[0][0].weight.requires_grad  # frozen parameters stay frozen
    assert int(model.backbone[0][1].num_batches_tracked) == 0  # tracing ran in eval mode
    # every sliced parameter knows where it came from, and the slice is exact
    by_id = {id(p): n for n, p in model.named_parameters()}
    assert {by_id[k] for k in summary.origins} == {n for n, p in model.named_parameters() if p.shape != old[n].shape}
    for pid, (root, kept) in summary.origins.items():
        expect = root.detach()
        for dim, idx in kept.items():
            expect = expect.index_select(dim, idx)
        torch.testing.assert_close(dict(model.named_parameters())[by_id[pid]].detach(), expect)
    model.train()
    model(torch.randn(4, 3, 32, 32)).sum().backward()
    assert model.head.weight.grad.shape == (10, 16)


def test_pruning_functional_structured_resnet18():
    torchvision = pytest.importorskip("torchvision")
    model = torchvision.models.resnet18(weights=None)
    before = sum(p.numel() for p in model.parameters())
    summary = prune_structured(model, X, 0.5)
    assert summary.params_after == sum(p.numel() for p in model.parameters()) < before / 2
    assert model.fc.out_features == 1000 and model.fc.in_features == 256
    out = model(torch.randn(2, 3, 32, 32))
    out.sum().backward()
    assert out.shape == (2, 1000)


def test_pruning_functional_dry_run_and_refusal():
    model = DemoClassifier(width=8)
    shapes = {n: p.shape for n, p in model.named_parameters()}
    plan = prune_structured(model, X, 0.5, dry_run=True)
    assert plan.layers["backbone.1.0"] == (8, 4)
    assert {n: p.shape for n, p in model.named_parameters()} == shapes
    tiny = DemoClassifier(width=2)
    tiny_shapes = {n: p.shape for n, p in tiny.named_parameters()}
    with pytest.raises(SpeedupConfigError, match="would remove all 2 channels of layer 'backbone.1.0'"):
        prune_structured(tiny, X, 0.6)
    assert {n: p.shape for n, p in tiny.named_parameters()} == tiny_shapes  # refused before touching anything


def test_pruning_functional_unstructured_exact():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 20), nn.ReLU(), nn.Linear(20, 20), nn.Linear(20, 3))
    summary = prune_unstructured(model, 0.5)  # global over layers 0 and 2; the classifier (3) is left dense
    assert set(summary.layers) == {"0", "2"}
    zeros = int((model[0].weight == 0).sum() + (model[2].weight == 0).sum())
    assert zeros == round(0.5 * (200 + 400))
    first = {k: weight_mask(model[k]).clone() for k in (0, 2)}
    prune_unstructured(model, 0.7)
    for k in (0, 2):
        assert bool((weight_mask(model[k]) <= first[k]).all())  # pruned weights stay pruned
        assert len(model[k].parametrizations.weight) == 1  # mask updated in place: no stacked parametrizations
    report = sparsity_report(model)
    assert report.layers["0.weight"][1] + report.layers["2.weight"][1] == round(0.7 * 600)
    per_layer = nn.Sequential(nn.Linear(10, 20), nn.Linear(20, 3))
    prune_unstructured(per_layer, 0.25, scope="layer")
    assert int((weight_mask(per_layer[0]) == 0).sum()) == 50
    state = clean_pruned_state_dict(model.state_dict())
    assert not any(k.endswith(("_orig", "_mask")) for k in state)
    assert make_pruning_permanent(model) == 2
    assert int((model[0].weight == 0).sum() + (model[2].weight == 0).sum()) == round(0.7 * 600)


def test_pruning_functional_sparsity_report_counts_shared_once():
    shared = nn.Linear(4, 4, bias=False)
    model = nn.Sequential(shared, nn.ReLU(), shared)
    with torch.no_grad():
        shared.weight[0].zero_()
    report = sparsity_report(model)
    assert (report.total, report.zeros) == (16, 4)
    assert report.sparsity == 0.25


def test_pruning_functional_save_load(tmp_path):
    model = DemoClassifier(width=8).eval()
    prune_structured(model, X, 0.5)
    save_pruned(model, tmp_path / "p.pt")
    fresh = load_pruned(DemoClassifier(width=8), tmp_path / "p.pt").eval()
    x = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(fresh(x), model(x))
    masked = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
    prune_unstructured(masked, 0.5)
    save_pruned(masked, tmp_path / "m.pt")
    plain = load_pruned(nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2)), tmp_path / "m.pt")
    torch.testing.assert_close(plain(torch.ones(1, 4)), masked(torch.ones(1, 4)))


def test_pruning_functional_misconfiguration():
    model = DemoClassifier(width=8)
    with pytest.raises(SpeedupConfigError, match="`amount`=1.0 is out of range"):
        prune_structured(model, X, 1.0)
    with pytest.raises(SpeedupConfigError, match="`importance`='fisher' is not supported"):
        prune_structured(model, X, 0.5, importance="fisher")
    with pytest.raises(SpeedupConfigError, match="`ignored_layers` names 'classifier', which is not a submodule"):
        prune_structured(model, X, 0.5, ignored_layers=["classifier"])
    with pytest.raises(SpeedupConfigError, match="leaves no prunable layer"):
        prune_structured(model, X, 0.5, ignored_layers=["backbone", "head"])
    with pytest.raises(SpeedupConfigError, match="'taylor' needs gradients"):
        prune_structured(model, X, 0.5, importance="taylor")
    with pytest.raises(SpeedupConfigError, match="`importance`='taylor' is not supported"):
        prune_unstructured(model, 0.5, importance="taylor")
    with pytest.raises(SpeedupConfigError, match="`scope`='net' is not supported"):
        prune_unstructured(model, 0.5, scope="net")
    with pytest.raises(SpeedupConfigError, match="leaves no conv/linear layer"):
        prune_unstructured(model, 0.5, ignored_layers=[""])
