"""The CI sample of the architecture sweep (``tools/arch_sweep.py``): one model of every failure class.

Each cell runs as the sweep runs it (the zoo's fit, reload and resume checks, then the technique's effect) and must not
``fail``: it works with its effect, or ``setup()`` refuses it with a reason, the model unchanged. The models are tiny
stand-ins of each class (aux logits, dict outputs with pixel targets, an encoder-decoder, a weight-norm conv, channel
shuffle, a token-mixing MLP, tied embeddings, an LSTM, BatchNorm's version metadata) and one timm model of each
refusal class the sweep found (partial and mixed convolutions, coupled halves, attention without a free feed-forward
block, sides the model cannot run at) or that works since the mechanism was fixed for it (a Linear read by its parent,
a buffer the forward rebuilds); ``SAMPLE`` in the tool lists them with the techniques each class is about.
Cells that do not conform yet are in ``EXPECTED_FAIL`` with their reason: they xfail strictly, so a fixed cell shows
as XPASS and its entry is to be removed.
"""

from __future__ import annotations

import importlib.util
import warnings
from pathlib import Path

import pytest
import torch

from tests.zoo.models import ARCHS
from tools.arch_sweep import DEFAULT_OUT, SAMPLE, run_cell, timm_plan
from tools.arch_sweep_models import find_row, register

pytestmark = [
    pytest.mark.zoo,
    pytest.mark.filterwarnings("ignore:The dirpath has changed"),
]


def _needs(row: str) -> str | None:
    """The optional package a row needs to build (the zoo extra: timm, transformers)."""
    if row.startswith("hf_"):
        return "transformers"
    return "timm" if row == "mixer_tiny" or row.startswith("timm_") else None


# (row, technique) -> why the cell fails today; strict xfail: remove an entry when its cell passes
EXPECTED_FAIL: dict[tuple[str, str], str] = {}

# a refusal of these cells must name the module that blocks the technique
MUST_NAME = {
    ("lstm", "pruning"): "LSTM",
    ("timm_fasternet", "pruning"): "partial_conv3",
    ("timm_mixnet", "pruning"): "net.blocks.",
    ("timm_ghostnet", "pruning"): "net.blocks.",
    ("timm_pvt", "pruning"): "mlp.fc1",
    ("timm_pvt", "progressive_resizing"): "attn.sr",
    ("timm_pit", "progressive_resizing"): "PoolingVisionTransformer",
}

CELLS = [(row, tech) for row, techs in SAMPLE.items() for tech in techs]


def _param(row: str, tech: str) -> object:
    reason = EXPECTED_FAIL.get((row, tech))
    marks = [pytest.mark.xfail(reason=reason, strict=True)] if reason else []
    return pytest.param(row, tech, id=f"sweep-{row}-{tech}", marks=marks)


def test_sample_covers_every_class():
    assert len(SAMPLE) >= 9 and all(SAMPLE.values())
    assert set(EXPECTED_FAIL) <= set(CELLS), "EXPECTED_FAIL names a cell that is not in the sample"


@pytest.mark.parametrize(("row", "tech"), [_param(r, t) for r, t in CELLS])
def test_arch_sweep_sample(row: str, tech: str):
    need = _needs(row)
    if need and importlib.util.find_spec(need) is None:
        pytest.skip(f"{row} needs {need}")
    added = row not in ARCHS
    if added:  # registered for this cell only: the zoo's own table lists ARCHS at the end of the session
        register(find_row(row, timm_plan(DEFAULT_OUT)))  # the committed plan: counting every family takes minutes
    torch.set_num_threads(min(2, torch.get_num_threads()))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            rec = run_cell(row, tech)
    finally:
        if added:
            ARCHS.pop(row, None)
    if rec["outcome"] == "skipped":
        pytest.skip(rec.get("message", ""))
    assert rec["outcome"] != "fails", f"{rec.get('error')}: {rec.get('message')} [at {rec.get('where')}]"
    name = MUST_NAME.get((row, tech))
    if rec["outcome"] == "refused" and name:
        assert name in rec["message"], f"the refusal does not name {name}: {rec['message']}"


def test_a_reload_is_compared_in_the_trained_models_memory_format():
    """NHWC and NCHW convolutions round differently, so a reload of a channels_last model is compared in NHWC (the
    sweep's EfficientNetV2 cell differed by 1e4 on outputs of 2e7 in NCHW, and by 0 in NHWC)."""
    from tests.zoo.cells import _same_memory_format

    trained = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.Conv2d(4, 4, 1))
    trained.to(memory_format=torch.channels_last)
    fresh = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.Conv2d(4, 4, 1))
    _same_memory_format(fresh, torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3)))  # an NCHW model: left as it is
    assert fresh[0].weight.is_contiguous()
    _same_memory_format(fresh, trained)
    assert fresh[0].weight.is_contiguous(memory_format=torch.channels_last) and not fresh[0].weight.is_contiguous()


def test_smallest_first_orders_a_chunk_by_parameter_count(monkeypatch):
    """``--smallest-first`` runs a chunk's rows from the fewest parameters up, rows of unknown size last."""
    import tools.arch_sweep_models as models
    from tools.arch_sweep import select_rows

    rows = [
        models.Row(name, "seq", "series", lambda size: torch.nn.Identity(), name, params=n)
        for name, n in (("big", 9_000), ("unknown", None), ("small", 10), ("mid", 500))
    ]
    monkeypatch.setattr(models, "all_rows", lambda families, cache: rows)

    class Args:
        sample = False
        families = ["seq"]
        chunk = "1/1"
        smallest_first = True

    assert [r.name for r in select_rows(Args)] == ["small", "mid", "big", "unknown"]
    Args.smallest_first = False
    assert [r.name for r in select_rows(Args)] == ["big", "unknown", "small", "mid"]
    Args.chunk = "2/2"
    assert [r.name for r in select_rows(Args)] == ["unknown", "mid"]


def test_a_row_whose_baseline_diverges_trains_at_a_lower_probed_rate():
    """The sweep judges techniques by whether training stays finite: a recipe that blows up with no technique (as
    torchvision efficientnet_b5 at 32 px does at SGD 0.01) would fail them for the row's sake, so ``register`` probes
    the baseline's first steps and lowers the row's rate 10x (at most twice) until they stay finite."""
    from torch import nn

    from tools.arch_sweep_models import LRS, ROWS, SIZES, Row, SweepModule

    def hot(size: int) -> nn.Module:  # a deep unnormalized MLP at 4x its init scale: loss 42 -> 2194 at SGD 0.01
        widths = [3 * size * size] + [64] * 7
        layers: list[nn.Module] = [nn.Flatten()]
        for cin, cout in zip(widths, widths[1:], strict=False):
            layers += [nn.Linear(cin, cout), nn.ReLU()]
        net = nn.Sequential(*layers, nn.Linear(64, 4))
        with torch.no_grad():
            for layer in net:
                if isinstance(layer, nn.Linear):
                    layer.weight.mul_(4)
        return net

    def calm(size: int) -> nn.Module:
        return nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(3, 4))

    names = ("probe_hot", "probe_calm")
    try:
        for name, build in zip(names, (hot, calm), strict=True):
            register(Row(name, "torchvision", "image", build, "a probe test row"))
        assert LRS.get("probe_hot", 0.01) < 0.01
        assert SweepModule("probe_hot").lr == LRS["probe_hot"]
        assert "probe_calm" not in LRS and SweepModule("probe_calm").lr == 0.01
    finally:
        for name in names:
            for table in (LRS, ROWS, SIZES, ARCHS):
                table.pop(name, None)


def test_a_timm_family_is_swept_with_its_smallest_classifier_not_an_encoder_only_variant(monkeypatch, tmp_path):
    """timm's ``_enc`` variants are encoders without a classifier head (``gemma4_vit_167m_enc`` returns token
    features): the family's smallest classifier is chosen, and an encoder-only family keeps its encoder."""
    import timm

    import tools.arch_sweep_models as models

    params = {"gem_167m": 167_367_684, "gem_167m_enc": 167_364_608, "gem_570m": 569_552_692, "solo_9m_enc": 9}
    monkeypatch.setattr(timm, "list_models", lambda *a, **k: sorted(params))
    monkeypatch.setattr(models, "row_params", lambda row: params[row.name])  # a candidate's row is named as it
    chosen = {r.name: r.source for r in models.timm_rows(tmp_path / "plan.json")}
    assert chosen == {
        "timm_gem": "timm gem_167m (smallest of family 'gem')",
        "timm_solo": "timm solo_9m_enc (smallest of family 'solo')",
    }


def test_a_timm_familys_smallest_model_is_counted_not_guessed_from_its_name(monkeypatch, tmp_path):
    """Names do not order sizes (timm's ``aimv2_1b`` is four times ``aimv2_large``; ``convnext_zepto`` is below
    ``convnext_atto``): every name of a family is counted, and a recorded cell of the family's former choice runs
    again."""
    import timm

    import tools.arch_sweep as sweep
    import tools.arch_sweep_models as models

    params = {
        "aim2_1b_p14_224": 1_234_966_532,
        "aim2_1b_p14_336": 1_235_000_000,
        "aim2_3b_p14_224": 2_700_000_000,
        "aim2_huge_p14_224": 681_000_000,
        "aim2_large_p14_224": 309_201_924,
        "cnx_atto": 3_373_324,
        "cnx_atto_rms": 3_373_324,
        "cnx_femto": 5_000_000,
        "cnx_zepto_rms": 1_899_684,
    }
    monkeypatch.setattr(timm, "list_models", lambda *a, **k: sorted(params))
    monkeypatch.setattr(models, "row_params", lambda row: params[row.name])
    rows = {r.name: r for r in models.timm_rows(tmp_path / "plan.json")}
    assert {k: r.source.split()[1] for k, r in rows.items()} == {
        "timm_aim": "aim2_large_p14_224",
        "timm_cnx": "cnx_zepto_rms",
    }
    former = {"row": "timm_aim", "tech": "ema", "outcome": "works", "source": "timm aim2_1b_p14_224 (smallest ...)"}
    assert sweep._redo(former, [], rows["timm_aim"])
    assert not sweep._redo({**former, "source": rows["timm_aim"].source}, [], rows["timm_aim"])
    assert sweep._redo({**former, "source": rows["timm_aim"].source, "outcome": "fails"}, ["fails"], rows["timm_aim"])


def test_the_checks_run_without_the_trained_runs_gradients_and_optimizer_state():
    """The resume check loads a second model and optimizer beside the trained one: the sweep frees the first run's
    gradients and AdamW moments before it (their 12 bytes per parameter decide whether a large model fits)."""
    import lightning as L
    from torch import nn

    from tools.arch_sweep import _release_training_state

    class Tiny(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Linear(4, 2)

        def training_step(self, batch, batch_idx):
            return self.net(batch[0]).square().mean()

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-2)

    model = Tiny()
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(8, 4)), batch_size=4)
    trainer = L.Trainer(
        max_steps=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
    )
    trainer.fit(model, data)
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    assert trainer.optimizers[0].state and model.net.weight.grad is not None  # what a fit leaves behind
    _release_training_state(model)
    assert not trainer.optimizers[0].state and all(p.grad is None for p in model.parameters())
    assert all(torch.equal(v, weights[k]) for k, v in model.state_dict().items())  # the weights the checks read
    _release_training_state(Tiny())  # a module never attached to a trainer: nothing to free, no error


def test_a_worker_killed_at_its_cell_limit_leaves_no_scratch_behind(tmp_path):
    """A worker killed mid-cell (time or memory limit) cannot remove its checkpoints: the parent removes the scratch
    folder it gave the worker, however the worker ended (the largest models' checkpoints are several GB each)."""
    import argparse
    import json
    import sys
    import time

    from tools.arch_sweep import SCRATCH_ENV, _watch_worker

    progress = tmp_path / "progress"
    seen = tmp_path / "scratch_was"
    progress.write_text(json.dumps({"tech": "baseline", "start": time.time()}))
    script = (
        f"import os, pathlib, time; s = pathlib.Path(os.environ[{SCRATCH_ENV!r}]); "
        f"(s / 'epoch=0.ckpt').write_bytes(b'0' * 1024); pathlib.Path({str(seen)!r}).write_text(str(s)); "
        f"time.sleep(60)"
    )
    args = argparse.Namespace(cell_timeout=2.0, max_rss_mb=0)
    with (tmp_path / "log").open("w") as logf:
        proc, killed = _watch_worker([sys.executable, "-c", script], logf, progress, args)
    assert killed is not None and killed[0] == "Timeout" and proc.returncode != 0
    scratch = Path(seen.read_text())
    assert scratch.name.startswith("arch_sweep-worker-") and not scratch.exists()


def test_a_worker_the_kernel_stops_at_its_memory_cgroup_is_recorded_as_over_the_memory_limit(tmp_path, monkeypatch):
    """In a memory cgroup the kernel enforces ``--max-rss-mb`` (paging out where there is swap); a worker it kills
    there is a ``MemoryLimit`` cell, and RSS, which counts pages the group is not charged for, is not polled."""
    import argparse
    import sys

    import tools.arch_sweep as sweep

    group = tmp_path / "group"
    group.mkdir()
    monkeypatch.setattr(sweep, "_memory_cgroup", lambda limit_mb: group)
    monkeypatch.setattr(sweep, "_rss_mb", lambda pid: pytest.fail("RSS polled inside a memory cgroup"))
    args = argparse.Namespace(cell_timeout=60.0, max_rss_mb=100.0)
    script = "import os, signal, time; time.sleep(1.5); os.kill(os.getpid(), signal.SIGKILL)"
    with (tmp_path / "log").open("w") as logf:
        _, killed = sweep._watch_worker([sys.executable, "-c", script], logf, tmp_path / "progress", args)
    assert killed is not None and killed[0] == "MemoryLimit" and "cgroup" in killed[1]
    assert (group / "cgroup.procs").read_text().strip()  # the worker joined the group before it ran
