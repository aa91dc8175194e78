"""The advisor's `not_compiled` finding: after how many steps compiling pays back, and silence where it does not.

The rule's branches run on injected numbers (no timing decides a test); one test calls the real compile probe.
"""

from __future__ import annotations

import json
import math
import re

import pytest
import torch
from torch import nn

from lightning_speedups.functional.advisor import AdvisorReport, Measurements, diagnose
from lightning_speedups.functional.advisor.probes import CompileProbe, compile_speedup
from lightning_speedups.functional.advisor.rules import MIN_COMPILE_S, compile_may_pay_back


def _m(compute: float = 0.1, wait: float = 0.0, n: int = 10, **kw) -> Measurements:
    return Measurements(compute_times=[compute] * n, data_waits=[wait] * n, batch_size=128, **kw)


def _compile(m: Measurements):
    return next((f for f in diagnose(m) if f.key == "not_compiled"), None)


def test_advisor_compile_payback_numbers():
    # 0.1 s eager step, 2x faster compiled: 0.05 s saved per step, so a 10 s compile pays back after 200 steps
    m = _m(compile_s=10.0, compile_speedup=2.0, planned_steps=1000)
    assert m.compile_saving_s == pytest.approx(0.05)
    assert m.compile_payback_steps == pytest.approx(200.0)
    assert m.compile_net_share == pytest.approx((1000 * 0.1 - 10.0 - 1000 * 0.05) / (1000 * 0.1))
    # the probe's own eager step, when there is one, is what the ratio saves a share of
    assert _m(compile_s=10.0, compile_speedup=2.0, compile_eager_s=0.04).compile_saving_s == pytest.approx(0.02)
    slower = _m(compile_s=10.0, compile_speedup=0.8, planned_steps=1000)
    assert slower.compile_payback_steps == math.inf and slower.compile_net_share < 0
    unmeasured = _m(planned_steps=1000)
    assert unmeasured.compile_payback_steps is None and unmeasured.compile_net_share is None
    s = slower.summary()
    assert s["compile_payback_steps"] is None and s["planned_steps"] == 1000  # no infinity in the JSON
    assert json.loads(AdvisorReport(s, []).to_json())["summary"]["compile_speedup"] == pytest.approx(0.8)


def test_advisor_compile_pays_back_within_the_planned_run():
    f = _compile(_m(wait=0.025, compile_s=10.0, compile_speedup=2.0, planned_steps=1000))
    assert f is not None and f.measured
    assert "pays back after 200 steps (of the 1000 planned)" in f.title and "200 steps" in f.expected
    compute_share = 0.1 / 0.125
    assert f.score == pytest.approx(compute_share * (1000 * 0.05 - 10.0) / (1000 * 0.1))
    assert f.evidence["payback_steps"] == 200 and f.evidence["planned_steps"] == 1000
    assert f.evidence["compile_s"] == 10.0 and f.evidence["compiled_step_speedup"] == 2.0
    assert "TorchCompile()" in f.fix
    # it ranks by its net saving: below a larger measured finding, above a smaller one
    big = diagnose(
        _m(compile_s=10.0, compile_speedup=2.0, planned_steps=1000, has_conv=True, channels_last_speedup=3.0)
    )
    assert [x.key for x in big][:2] == ["channels_last", "not_compiled"]
    small = diagnose(
        _m(compile_s=10.0, compile_speedup=2.0, planned_steps=1000, has_conv=True, channels_last_speedup=1.1)
    )
    assert [x.key for x in small][:2] == ["not_compiled", "channels_last"]


@pytest.mark.parametrize(
    "numbers",
    [
        {"compile_s": 30.0, "compile_speedup": 1.1, "planned_steps": 300},  # pays back after 3300 steps
        {"compile_s": 1.0, "compile_speedup": 1.0, "planned_steps": 10_000},  # within noise: never pays back
        {"compile_s": 1.0, "compile_speedup": 0.7, "planned_steps": 10_000},  # compiled slower
        {"compile_s": 1.0, "compile_speedup": 0.7, "planned_steps": None},
    ],
)
def test_advisor_compile_not_paid_back_is_no_finding(numbers):
    m = _m(**numbers)
    assert _compile(m) is None  # so applying the top finding never slows this run down
    assert all(f.key != "not_compiled" for f in diagnose(m))


def test_advisor_compile_unknown_run_length():
    f = _compile(_m(compile_s=10.0, compile_speedup=2.0, planned_steps=None))
    assert f is not None and f.measured
    assert "pays back after 200 steps; the run length is unknown" in f.title
    assert "run longer than that" in f.expected
    assert f.score == pytest.approx(1 - 1 / 2.0) and f.evidence["planned_steps"] is None
    one = _compile(_m(compile_s=0.01, compile_speedup=2.0))
    assert "pays back after 1 step;" in one.title


def test_advisor_compile_not_measured():
    m = _m(planned_steps=1000, compile_note="probe off (`measure_effects` or `probe_compile` is False)")
    f = _compile(m)
    assert f is not None and not f.measured
    assert "not measured" in f.title and "probe_compile=True" in f.fix and "TorchCompile()" in f.fix
    assert not re.search(r"\d", f.expected)  # no speedup quoted from elsewhere
    assert f.evidence["compile_probe"].startswith("probe off") and f.evidence["payback_steps"] is None
    assert f.severity == "low" and 0 < f.score <= 0.01
    # below a measured finding of a modest size (channels_last measured 1.05x faster)
    ranked = [x.key for x in diagnose(_m(planned_steps=1000, has_conv=True, channels_last_speedup=1.05))]
    assert ranked.index("channels_last") < ranked.index("not_compiled")
    # on a GPU too: no rule-of-thumb gain from elsewhere
    gpu = _compile(_m(device_type="cuda"))
    assert gpu.score == pytest.approx(0.01)


def test_advisor_compile_gates():
    assert compile_may_pay_back(_m(planned_steps=1000))
    # a planned run whose whole compute is shorter than any compile: nothing to find, nothing to measure
    short = _m(compute=0.01, planned_steps=int(MIN_COMPILE_S / 0.01) - 1)
    assert not compile_may_pay_back(short) and _compile(short) is None
    assert _compile(_m(compile_s=0.001, compile_speedup=5.0, planned_steps=5)) is None
    assert not compile_may_pay_back(_m(compiled=True))
    assert not compile_may_pay_back(_m(callbacks=["TorchCompile"]))
    assert not compile_may_pay_back(_m(compute=0.01, wait=0.03))  # data-bound
    assert not compile_may_pay_back(Measurements())  # nothing timed


def test_advisor_compile_probe_functional():
    """The one real probe call: a tiny model compiled on this machine (seconds on a CPU); numbers not judged."""
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    probe = compile_speedup(model, torch.randn(4, 8), repeats=2, budget_s=0.2)
    assert isinstance(probe, CompileProbe) and probe.error == ""
    assert probe.compile_s > 0 and probe.speedup > 0 and probe.eager_step_s > 0
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert model[0].weight.grad is None and model._compiled_call_impl is None  # the copies were compiled, not it


def test_advisor_compile_probe_failure_is_recorded():
    failed = compile_speedup(nn.Linear(8, 2), torch.randn(4, 9))  # wrong input width: the step raises
    assert failed.compile_s is None and failed.speedup is None
    assert failed.error.startswith("RuntimeError: mat1 and mat2 shapes cannot be multiplied")


def test_advisor_compile_counts_every_graph_the_run_compiles():
    # the same 10 s compile and 2x step: a run that also validates and ends epochs on a smaller batch compiles three
    # graphs, so it pays back after 600 steps, past the 500 planned: no finding (applying it would slow the run)
    one = _m(compile_s=10.0, compile_speedup=2.0, planned_steps=500)
    three = _m(
        compile_s=10.0,
        compile_speedup=2.0,
        planned_steps=500,
        compile_graphs=["training", "last smaller training batch", "validation"],
    )
    assert one.compile_total_s == pytest.approx(10.0) and three.compile_total_s == pytest.approx(30.0)
    assert three.compile_payback_steps == pytest.approx(600.0)
    assert _compile(one) is not None and _compile(three) is None
    f = _compile(_m(compile_s=10.0, compile_speedup=2.0, planned_steps=5000, compile_graphs=["training", "validation"]))
    assert "pays back after 400 steps" in f.title
    assert "2 graphs (training, validation), about 20.0 s" in f.expected
    assert f.evidence["compile_graphs"] == ["training", "validation"]


def test_advisor_compile_graphs_read_off_the_trainer():
    import lightning as L
    from torch.utils.data import DataLoader, TensorDataset

    from lightning_speedups.callbacks.advisor.facts import compile_graphs

    class Plain(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Linear(4, 2)

        def training_step(self, batch, batch_idx):
            return nn.functional.cross_entropy(self.net(batch[0]), batch[1])

        def validation_step(self, batch, batch_idx):
            self.log("val_loss", nn.functional.cross_entropy(self.net(batch[0]), batch[1]))

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    seen: dict[str, list[str]] = {}

    class Read(L.Callback):
        def on_train_batch_end(self, trainer, pl_module, *args) -> None:
            seen.setdefault("graphs", compile_graphs(trainer, pl_module))

    data = TensorDataset(torch.randn(10, 4), torch.randint(0, 2, (10,)))

    def fit(loader: DataLoader, **kw) -> list[str]:
        seen.clear()
        trainer = L.Trainer(
            max_epochs=1,
            callbacks=[Read()],
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            **kw,
        )
        trainer.fit(Plain(), loader, DataLoader(data, batch_size=5))
        return seen["graphs"]

    assert fit(DataLoader(data, batch_size=4)) == ["training", "last smaller training batch", "validation"]
    assert fit(DataLoader(data, batch_size=4, drop_last=True), limit_val_batches=0) == ["training"]
    assert fit(DataLoader(data, batch_size=4), max_steps=1) == ["training", "validation"]  # stops before the end
