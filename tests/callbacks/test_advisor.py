"""SpeedAdvisor callback: diagnosis of real (tiny) fits with a mocked clock, reporting, overhead counting, resume."""

from __future__ import annotations

import json
from typing import Any

import lightning as L
import pytest
import torch
from lightning.pytorch.loggers import Logger
from torch import nn
from torch.utils.data import DataLoader, Dataset

import lightning_speedups.callbacks.advisor.callback as advisor_mod
from lightning_speedups._errors import SpeedupConfigError, SpeedupRuntimeError
from lightning_speedups._registry import get_technique
from lightning_speedups.callbacks.advisor import SpeedAdvisor
from lightning_speedups.demo import DemoClassifier
from tests.helpers import quiet_trainer
from tests.technique_examples import EXAMPLES


class FakeClock:
    """Time advances only when the test says so: timings become exact and load-independent."""

    def __init__(self) -> None:
        self.t = 0.0
        self.reads = 0

    def __call__(self) -> float:
        self.reads += 1
        return self.t


class ClockedData(Dataset):
    """64 random images; each sample 'costs' ``per_sample`` seconds on the fake clock."""

    def __init__(self, clock: FakeClock, per_sample: float, n: int = 64) -> None:
        self.clock = clock
        self.per_sample = per_sample
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 3, 32, 32, generator=g)
        self.y = torch.randint(0, 10, (n,), generator=g)

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        self.clock.t += self.per_sample
        return self.x[i], self.y[i]


class ClockedModel(DemoClassifier):
    """DemoClassifier whose training step 'costs' ``per_step`` seconds on the fake clock."""

    def __init__(self, clock: FakeClock | None = None, per_step: float = 0.0, **kw: Any) -> None:
        super().__init__(width=8, **kw)
        self.clock = clock
        self.per_step = per_step

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        if self.clock is not None:
            self.clock.t += self.per_step
        return super().training_step(batch, batch_idx)


class MemoryLogger(Logger):
    def __init__(self) -> None:
        super().__init__()
        self.metrics: list[dict[str, float]] = []

    @property
    def name(self) -> str:
        return "memory"

    @property
    def version(self) -> int:
        return 0

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.metrics.append(dict(metrics))

    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        pass


def _fit(advisor: SpeedAdvisor, model: L.LightningModule, data: Dataset, steps: int, batch_size: int = 8, **kw: Any):
    trainer = quiet_trainer(max_steps=steps, callbacks=[advisor], **kw)
    trainer.fit(model, train_dataloaders=DataLoader(data, batch_size=batch_size, shuffle=True))
    return trainer


def test_advisor_misconfiguration():
    with pytest.raises(SpeedupConfigError, match="`warmup_steps`=0 is out of range. Allowed values: an integer >= 1"):
        SpeedAdvisor(warmup_steps=0)
    with pytest.raises(SpeedupConfigError, match="`window_steps`=-1 is out of range. Allowed values: an integer >= 1"):
        SpeedAdvisor(window_steps=-1)
    with pytest.raises(SpeedupConfigError, match="`window_steps`=3 is out of range.*>= 5. HINT: not smaller than"):
        SpeedAdvisor(warmup_steps=5, window_steps=3)
    with pytest.raises(SpeedupConfigError, match="`thresholds`='high' is not supported"):
        SpeedAdvisor(thresholds="high")  # type: ignore[arg-type]
    with pytest.raises(SpeedupConfigError, match="`data_wait`=2 is out of range"):
        SpeedAdvisor(thresholds={"data_wait": 2})
    with pytest.raises(SpeedupRuntimeError, match="no timed batch has run yet"):
        SpeedAdvisor().to_json()


def test_advisor_data_bound_fit(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(advisor_mod, "_now", clock)
    advisor = SpeedAdvisor(warmup_steps=2, window_steps=4, measure_effects=False, verbose=False)
    logger = MemoryLogger()
    # 8 samples x 5 ms of loading vs 2 ms of compute per batch: 95% of the time waits for data
    _fit(advisor, ClockedModel(clock, per_step=0.002), ClockedData(clock, per_sample=0.005), steps=6, logger=logger)
    report = advisor.report
    assert report is not None and report.summary["timed_batches"] == 4
    assert report.summary["data_wait_share"] == pytest.approx(0.04 / 0.042)
    assert report.summary["samples_per_s"] == pytest.approx(8 / 0.042)
    top = report.findings[0]
    assert top.key == "data_bound" and top.severity == "high"
    assert "DeviceDataLoader" in top.fix and "num_workers" in top.fix
    assert top.evidence["num_workers"] == 0 and top.evidence["loader"] == "DataLoader"
    # FLOPs were counted on the untimed warm-up batch
    assert report.summary["flops_per_batch"] > 0
    # logged to the trainer's loggers
    logged = {k: v for d in logger.metrics for k, v in d.items()}
    assert logged["advisor/data_wait_share"] == pytest.approx(report.summary["data_wait_share"])
    assert logged["advisor/score/data_bound"] == pytest.approx(top.score)
    assert "utilisation" in " ".join(report.notes)  # CPU utilisation is against an estimated peak: said so


def test_advisor_cpu_utilisation_against_estimated_peak(monkeypatch):
    """On a CPU the report's utilisation is against the estimated peak for the run's dtype, labelled an estimate."""
    import lightning_speedups.callbacks.advisor.facts as measure_mod
    from lightning_speedups.measure import estimate_cpu_peak_flops

    asked = []

    def peak(device, dtype):
        asked.append((device.type, dtype))
        return estimate_cpu_peak_flops(dtype, cores=2, ghz=2.45, flags="sse avx avx2 fma", vendor="AuthenticAMD")

    monkeypatch.setattr(measure_mod, "device_peak_flops", peak)
    advisor = SpeedAdvisor(warmup_steps=1, window_steps=2, measure_effects=False, verbose=False)
    _fit(advisor, ClockedModel(), ClockedData(FakeClock(), 0.0), steps=3)
    s = advisor.report.summary
    assert asked == [("cpu", torch.float32)]
    assert s["peak_flops"] == pytest.approx(156.8e9) and s["peak_flops_estimated"] is True
    assert s["utilisation"] == pytest.approx(s["achieved_flops"] / 156.8e9)
    text = advisor.report.to_text()
    assert "of the estimated CPU peak 157 GFLOP/s fp32 (AVX2+FMA" in text and "an estimate)" in text
    assert "device peak unknown" not in text and "estimated peak" in " ".join(advisor.report.notes)
    # bf16-mixed asks for the bf16 peak: no bf16 units on this (mocked) AVX2 CPU, said so
    advisor = SpeedAdvisor(warmup_steps=1, window_steps=2, measure_effects=False, verbose=False)
    monkeypatch.setattr(advisor_mod.settings, "cpu_bf16_is_fast", lambda: True)
    _fit(advisor, ClockedModel(), ClockedData(FakeClock(), 0.0), steps=3, precision="bf16-mixed")
    assert asked[-1] == ("cpu", torch.bfloat16)
    assert "no bf16 units: counted at the fp32 rate" in advisor.report.summary["peak_flops_source"]


def test_advisor_compute_bound_fit(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(advisor_mod, "_now", clock)
    advisor = SpeedAdvisor(warmup_steps=2, window_steps=4, measure_effects=False, verbose=False)
    _fit(advisor, ClockedModel(clock, per_step=0.050), ClockedData(clock, per_sample=0.0), steps=6)
    keys = [f.key for f in advisor.report.findings]
    assert advisor.report.summary["data_wait_share"] == 0.0
    assert "data_bound" not in keys and "num_workers_zero" not in keys


def test_advisor_bf16_on_slow_cpu(monkeypatch):
    # mocked capability: this CPU "has no bf16 units" and the model copy runs 10x slower in bf16
    monkeypatch.setattr(advisor_mod.settings, "cpu_bf16_is_fast", lambda: False)
    monkeypatch.setattr(advisor_mod.F, "bf16_autocast_speedup", lambda module, x, repeats=3: 0.1)
    monkeypatch.setattr(advisor_mod.F, "channels_last_speedup", lambda module, x, repeats=3: None)
    advisor = SpeedAdvisor(warmup_steps=1, window_steps=2, verbose=False)
    _fit(advisor, ClockedModel(), ClockedData(FakeClock(), 0.0), steps=3, precision="bf16-mixed")
    top = advisor.report.findings[0]
    assert top.key == "low_precision_on_slow_cpu" and top.severity == "high"
    assert top.evidence["precision"] == "bf16-mixed" and top.evidence["bf16_step_slowdown"] == pytest.approx(10.0)
    assert 'trainer_settings(precision="auto")' in top.fix


def test_advisor_overhead_outside_window(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(advisor_mod, "_now", clock)
    advisor = SpeedAdvisor(warmup_steps=2, window_steps=3, measure_effects=False, verbose=False)
    seen: list[tuple[int, int]] = []

    class Probe(L.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            seen.append((advisor.work_calls, clock.reads))

    trainer = quiet_trainer(max_steps=12, callbacks=[advisor, Probe()])
    trainer.fit(ClockedModel(), train_dataloaders=DataLoader(ClockedData(clock, 0.0), batch_size=8))
    assert advisor.hook_calls == 2 * 12  # every batch reaches the two batch hooks...
    work = [w for w, _ in seen]
    # ...but they only work on the FLOP batch (index 1) and the 3 timed batches (2..4)
    assert work[0] == 0
    assert work[1] == 2  # FLOP counter start + stop
    assert all(b > a for a, b in zip(work[1:5], work[2:5]))
    assert len(set(work[4:])) == 1, "hooks did work after the window"
    assert len({r for _, r in seen[4:]}) == 1, "the clock was read after the window"
    assert work[4] == 2 + 3 * 4  # each timed batch: start, before_backward, before_optimizer_step, end


def test_advisor_parameter_findings(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(advisor_mod, "_now", clock)

    class Leaky(ClockedModel):
        """Freezes the head after the first step but keeps zeroed grads, so Adam's momentum still moves it."""

        def __init__(self) -> None:
            super().__init__(clock, 0.01)
            self.unused = nn.Linear(4, 4)  # trainable, never in the graph

        def optimizer_zero_grad(self, epoch, batch_idx, optimizer):
            optimizer.zero_grad(set_to_none=False)

        def on_train_batch_start(self, batch, batch_idx):
            if batch_idx == 1:
                self.head.weight.requires_grad_(False)

    advisor = SpeedAdvisor(warmup_steps=2, window_steps=3, measure_effects=False, verbose=False)
    _fit(advisor, Leaky(), ClockedData(clock, 0.0), steps=5)
    by_key = {f.key: f for f in advisor.report.findings}
    assert by_key["frozen_but_updated"].evidence["examples"] == ["head.weight"]
    assert "FineTuneFreezing" in by_key["frozen_but_updated"].fix
    assert by_key["unused_trainable_params"].evidence["examples"] == ["unused.bias", "unused.weight"]


def test_advisor_measured_effects_and_apply(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(advisor_mod.F, "channels_last_speedup", lambda module, x, repeats=3: 1.5)
    monkeypatch.setattr(advisor_mod.F, "fewer_threads_speedup", lambda module, x, threads=None: None)  # not global
    advisor = SpeedAdvisor(warmup_steps=1, window_steps=2, apply=True)
    model = ClockedModel()
    _fit(advisor, model, ClockedData(FakeClock(), 0.0), steps=5)
    d = advisor.to_dict()
    by_key = {f["key"]: f for f in d["findings"]}
    assert by_key["channels_last"]["measured"] and by_key["channels_last"]["evidence"]["channels_last_speedup"] == 1.5
    assert d["applied"] and "channels_last" in d["applied"][0]
    w = model.backbone[0][0].weight
    assert w.is_contiguous(memory_format=torch.channels_last) and not w.is_contiguous()  # applied, training went on
    assert d["summary"]["peak_memory_bytes"] > 0 and 0 < d["summary"]["memory_headroom"] <= 1
    advisor.to_json(tmp_path / "advice.json")
    assert json.loads((tmp_path / "advice.json").read_text()) == json.loads(json.dumps(d, default=str))
    # apply=False (default) never changes the run, whatever it finds
    plain = ClockedModel()
    _fit(SpeedAdvisor(warmup_steps=1, window_steps=2, verbose=False), plain, ClockedData(FakeClock(), 0.0), steps=3)
    assert plain.backbone[0][0].weight.is_contiguous()


def test_advisor_resume(tmp_path):
    advisor = SpeedAdvisor(warmup_steps=1, window_steps=2, measure_effects=False, verbose=False)
    trainer = _fit(advisor, ClockedModel(), ClockedData(FakeClock(), 0.0), steps=4)
    ckpt = tmp_path / "a.ckpt"
    trainer.save_checkpoint(ckpt)
    resumed = SpeedAdvisor(warmup_steps=1, window_steps=2, measure_effects=False, verbose=False)
    trainer2 = quiet_trainer(max_steps=7, callbacks=[resumed])
    trainer2.fit(ClockedModel(), DataLoader(ClockedData(FakeClock(), 0.0), batch_size=8), ckpt_path=ckpt)
    assert resumed.work_calls == 0  # the stored report is reused, nothing is measured again
    assert resumed.to_dict() == advisor.to_dict()


def test_advisor_registry_example():
    info = get_technique("advisor")
    assert info.callback is SpeedAdvisor and info.bench == "lightning_speedups.benchmarks.advise:run"
    advisor = SpeedAdvisor(**EXAMPLES["advisor"].kwargs)
    _fit(advisor, ClockedModel(), ClockedData(FakeClock(), 0.0), steps=2, limit_val_batches=1)
    assert advisor.report is not None and advisor.report.summary["timed_batches"] == 1
    # a run too short for any timed batch says so instead of failing silently
    short = SpeedAdvisor(warmup_steps=2, window_steps=2, verbose=False)
    with pytest.warns(UserWarning, match="before its window"):
        _fit(short, ClockedModel(), ClockedData(FakeClock(), 0.0), steps=1)
    assert short.report is None and short.to_dict() == {}


def test_advisor_exception_in_flop_batch_leaves_no_dispatch_mode():
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    class Boom(ClockedModel):
        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            raise RuntimeError("boom")

    advisor = SpeedAdvisor(warmup_steps=1, window_steps=1, verbose=False)  # batch 0 is the FLOP-counted batch
    with pytest.raises(RuntimeError, match="boom"):
        _fit(advisor, Boom(), ClockedData(FakeClock(), 0.0), steps=2)
    assert _get_current_dispatch_mode() is None and advisor._flop_counter is None


def test_advisor_applies_fewer_cpu_threads_when_measured_faster(monkeypatch):
    before = torch.get_num_threads()  # the suite runs at 1 thread (conftest): the run starts at 4
    monkeypatch.setattr(advisor_mod.F, "channels_last_speedup", lambda module, x, repeats=3: None)
    monkeypatch.setattr(advisor_mod.F, "fewer_threads_speedup", lambda module, x, threads=None: 2.5)
    try:
        torch.set_num_threads(4)
        advisor = SpeedAdvisor(warmup_steps=1, window_steps=2, apply=True, verbose=False)
        _fit(advisor, ClockedModel(), ClockedData(FakeClock(), 0.0), steps=4)
        d = advisor.to_dict()
        finding = next(f for f in d["findings"] if f["key"] == "cpu_threads")
        assert finding["measured"] and "torch.set_num_threads(2)" in finding["fix"]
        assert finding["evidence"] == {"torch_threads": 4, "fewer_threads": 2, "fewer_threads_speedup": 2.5}
        assert torch.get_num_threads() == 2  # applied mid-run, process-wide
        assert any("torch.set_num_threads(2)" in a for a in d["applied"])
    finally:
        torch.set_num_threads(before)


class _TokenLM(L.LightningModule):
    """Embedding + linear head over dict batches of token ids (what pad_collate builds)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(32, 8)
        self.head = nn.Linear(8, 32)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        logits = self.head(self.emb(batch["input_ids"]))
        return nn.functional.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(), ignore_index=-100)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_advisor_counts_padding_of_token_batches():
    from lightning_speedups.data import pad_collate

    # lengths 2 and 8 in every batch: 10 real tokens in 16 positions, 37.5% padding
    samples = [{"input_ids": torch.arange(1, 3 if i % 2 == 0 else 9)} for i in range(16)]
    for s in samples:
        s["labels"] = s["input_ids"].clone()
    loader = DataLoader(samples, batch_size=2, collate_fn=pad_collate(multiple_of=1))
    advisor = SpeedAdvisor(warmup_steps=1, window_steps=3, measure_effects=False, verbose=False)
    quiet_trainer(max_steps=4, callbacks=[advisor]).fit(_TokenLM(), train_dataloaders=loader)
    report = advisor.report
    assert report is not None and report.summary["pad_fraction"] == pytest.approx(6 / 16)
    finding = next(f for f in report.findings if f.key == "padding")
    assert "38% of the training batches' token positions are padding" in finding.title
    assert finding.evidence["tokens"] == 3 * 10 and finding.evidence["padded_tokens"] == 3 * 16
    # image batches: nothing counted, no padding finding
    images = SpeedAdvisor(warmup_steps=1, window_steps=2, measure_effects=False, verbose=False)
    _fit(images, ClockedModel(), ClockedData(FakeClock(), 0.0), steps=3)
    assert images.report.summary["pad_fraction"] is None
    assert "padding" not in [f.key for f in images.report.findings]


def test_advisor_pad_value_misconfiguration():
    with pytest.raises(
        SpeedupConfigError, match=r"`pad_value`='0' is not an integer \(a str\)\. Allowed values: an integer"
    ):
        SpeedAdvisor(pad_value="0")  # type: ignore[arg-type]


def test_advisor_probe_compile_misconfiguration():
    with pytest.raises(
        SpeedupConfigError, match="`probe_compile`='yes' is not supported. Allowed values: True, False, None"
    ):
        SpeedAdvisor(probe_compile="yes")  # type: ignore[arg-type]


def _compile_fit(monkeypatch, probe: Any, per_step: float = 0.5, steps: int = 3, **kw: Any):
    """A compute-bound fit on the fake clock (``per_step`` s per step), with the compile probe replaced by ``probe``
    (asked for: ``probe_compile=True`` unless ``kw`` says otherwise)."""
    from lightning_speedups.functional.advisor import probes

    kw.setdefault("probe_compile", True)
    clock = FakeClock()
    calls = []
    monkeypatch.setattr(advisor_mod, "_now", clock)

    def fake(module, batch, loss=None, attrs=None, autocast_dtype=None, **_: Any):
        calls.append((loss(module, batch) if loss else None, attrs))  # the copy-free check that the loss works
        return probe

    monkeypatch.setattr(probes, "compile_speedup", fake)
    for name in ("channels_last_speedup", "bf16_autocast_speedup"):
        monkeypatch.setattr(advisor_mod.F, name, lambda module, x, repeats=3: None)
    monkeypatch.setattr(advisor_mod.F, "fewer_threads_speedup", lambda module, x, threads=None: None)
    advisor = SpeedAdvisor(warmup_steps=1, window_steps=2, verbose=False, **kw)
    _fit(advisor, ClockedModel(clock, per_step=per_step), ClockedData(clock, 0.0), steps=steps)
    return advisor, calls


def test_advisor_compile_probe_in_fit(monkeypatch):
    from lightning_speedups.functional.advisor.probes import CompileProbe

    # 0.5 s steps, compiled 2x faster after a 0.2 s compile, and the run compiles the training step and a graph the
    # advisor reads off the Trainer: 0.4 s in all, paid back after 2 of the 3 planned steps
    advisor, calls = _compile_fit(monkeypatch, CompileProbe(compile_s=0.2, speedup=2.0, eager_step_s=0.5))
    assert len(calls) == 1 and isinstance(calls[0][0], torch.Tensor) and calls[0][1] == [""]  # TorchCompile's choice
    report = advisor.report
    graphs = report.summary["compile_graphs"]
    assert len(graphs) == 2 and graphs[0] == "training"
    assert report.summary["planned_steps"] == 3 and report.summary["compile_payback_steps"] == pytest.approx(1.6)
    f = next(f for f in report.findings if f.key == "not_compiled")
    assert f.measured and "pays back after 2 steps (of the 3 planned)" in f.title
    assert f.score == pytest.approx((3 * 0.25 - 0.4) / (3 * 0.5))
    # a compile that is not paid back in the planned run: no finding, and a note that says why
    advisor, _ = _compile_fit(monkeypatch, CompileProbe(compile_s=100.0, speedup=2.0, eager_step_s=0.5))
    assert "not_compiled" not in [f.key for f in advisor.report.findings]
    assert any("pays back after 800 steps, more than the 3 planned" in n for n in advisor.report.notes)
    # a failed probe is recorded, never raised: the finding says the cost was not measured, and why
    advisor, _ = _compile_fit(monkeypatch, CompileProbe(error="BackendCompilerFailed: no compiler"))
    f = next(f for f in advisor.report.findings if f.key == "not_compiled")
    assert not f.measured and f.evidence["compile_probe"] == "probe failed: BackendCompilerFailed: no compiler"


def test_advisor_compile_probe_only_when_it_can_fire(monkeypatch):
    from lightning_speedups.functional.advisor.probes import CompileProbe

    probe = CompileProbe(compile_s=0.2, speedup=2.0, eager_step_s=0.5)
    # switched off: not timed, and the finding says how to measure it
    advisor, calls = _compile_fit(monkeypatch, probe, probe_compile=False)
    f = next(f for f in advisor.report.findings if f.key == "not_compiled")
    assert calls == [] and not f.measured and "probe_compile=True" in f.fix
    # a planned run too short to pay back any compile: neither probe nor finding
    advisor, calls = _compile_fit(monkeypatch, probe, per_step=0.01)
    assert calls == [] and "not_compiled" not in [f.key for f in advisor.report.findings]


def test_the_automatic_compile_probe_skips_a_run_too_short_for_a_first_compile(monkeypatch):
    from lightning_speedups.callbacks.advisor.callback import COMPILE_PROBE_SHARE
    from lightning_speedups.functional.advisor.probes import CompileProbe
    from lightning_speedups.functional.compile import FIRST_COMPILE_PRIOR_S

    # a new user's 8-step diagnostic run (13 s of compute) spent 60 s in the probe's compile: by default the probe
    # runs only where its expected cost is a small share of the run; the finding then says how to measure it
    probe = CompileProbe(compile_s=0.2, speedup=2.0, eager_step_s=0.5)
    advisor, calls = _compile_fit(monkeypatch, probe, probe_compile=None)  # 3 steps of 0.5 s
    f = next(f for f in advisor.report.findings if f.key == "not_compiled")
    assert calls == [] and not f.measured and "probe_compile=True" in f.fix
    assert f.evidence["compile_probe"].startswith("probe skipped: the planned run computes for about 2 s")
    # a run long enough for the prior compile to be within the share: probed without being asked
    steps = int(FIRST_COMPILE_PRIOR_S / COMPILE_PROBE_SHARE / 0.5) + 1
    advisor, calls = _compile_fit(monkeypatch, probe, probe_compile=None, steps=steps)
    assert len(calls) == 1 and next(f for f in advisor.report.findings if f.key == "not_compiled").measured
