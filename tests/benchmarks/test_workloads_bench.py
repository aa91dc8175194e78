"""The workload suite bench: rows, row-by-row JSON, resume, medians and ratios, errors (a fake, instant trainer)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from benchmarks import workloads_bench as wb
from benchmarks._workloads_table import does_not_help
from benchmarks.workloads import _registry, get_workload
from lightning_speedups import SpeedupConfigError
from lightning_speedups.autotune import TunePlan
from lightning_speedups.recipes import Recipe


class _FakeTrainer:
    """Stands in for ``time_to_target``: instant, a time per (method, seed), raises on call number ``fail_on``."""

    def __init__(self, times: dict[tuple[str, int], float | None] | None = None, fail_on: int | None = None) -> None:
        self.calls: list[dict[str, Any]] = []
        self.times = times or {}
        self.fail_on = fail_on
        self.method = "baseline"
        self.warm_ups: list[str] = []

    def __call__(self, workload, seed=0, callbacks=(), trainer_overrides=None, small=False, stop_at_target=False):
        self.calls.append(
            {
                "workload": workload,
                "seed": seed,
                "callbacks": list(callbacks),
                "overrides": dict(trainer_overrides or {}),
                "small": small,
            }
        )
        if self.fail_on is not None and len(self.calls) == self.fail_on:
            raise KeyboardInterrupt("interrupted")
        t = self.times.get((self.method, seed), 10.0 + seed)
        return {"time_to_target_s": t, "final": 0.9 + 0.01 * seed, "steps": 7}


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> _FakeTrainer:
    """The fake trainer, a fake autotune (an empty plan, 2 s of trials on the first run) and a tiny workload."""
    trainer = _FakeTrainer()
    monkeypatch.setattr(wb, "time_to_target", trainer)
    autotune_calls: list[dict[str, Any]] = []

    def fake_autotune(model, data, cache_dir=None, no_bf16=False, **kwargs):
        cached = (Path(cache_dir) / "plan").exists()
        autotune_calls.append({"cache_dir": cache_dir, "cached": cached, "no_bf16": no_bf16, "kwargs": kwargs})
        Path(cache_dir).mkdir(parents=True, exist_ok=True)
        (Path(cache_dir) / "plan").write_text("{}")
        plan = TunePlan(
            settings={},
            choices=[],
            trainer_kwargs={**kwargs, "precision": "32-true"},
            notes=["a plan note"],
            from_cache=cached,
        )
        return plan

    def wrap(method, prepare):  # the method under way, so the fake trainer knows which time to report
        def inner(*args):
            trainer.method = method
            return prepare(*args)

        return inner

    monkeypatch.setattr(wb, "autotune", fake_autotune)
    monkeypatch.setattr(wb, "_warm_up", lambda w: trainer.warm_ups.append(w.name))
    monkeypatch.setattr(wb, "_PREPARE", {m: wrap(m, p) for m, p in wb._PREPARE.items()})
    trainer.autotune_calls = autotune_calls  # type: ignore[attr-defined]
    tiny = replace(get_workload("tabular_mlp"), name="tiny", split="dev")
    monkeypatch.setitem(_registry._WORKLOADS, "tiny", tiny)
    return trainer


def test_workloads_bench_rows_and_keys(fake: _FakeTrainer, tmp_path) -> None:
    rows = wb.run_suite(["tiny"], seeds=(0, 1), json_path=tmp_path / "w.json", echo=False)
    # fast_train does not apply to a plain LightningModule: no row; the second seed starts one method later
    assert [(r["method"], r["seed"]) for r in rows] == [
        ("baseline", 0),
        ("autotune_first", 0),
        ("autotune_cached", 0),
        ("autotune_first", 1),
        ("autotune_cached", 1),
        ("baseline", 1),
    ]
    for r in rows:
        assert tuple(r) == wb.ROW_KEYS
        assert r["no_bf16"] is (None if r["method"] == "baseline" else False)  # the default path: auto
        assert (r["task"], r["kind"], r["split"], r["metric"], r["steps"]) == ("tiny", "tabular", "dev", "val_acc", 7)
        assert r["machine"]["torch"] and r["quality"] == pytest.approx(0.9 + 0.01 * r["seed"])
    first = rows[1]
    assert first["trial_s"] > 0 and first["time_to_target_s"] == pytest.approx(10.0 + first["trial_s"])
    assert "kept: nothing" in first["notes"] and "a plan note" in first["notes"]
    # the cached run reads the first run's cache dir; each seed starts with an empty one
    calls = fake.autotune_calls  # type: ignore[attr-defined]
    assert [c["cached"] for c in calls] == [False, True, False, True]
    assert [c["no_bf16"] for c in calls] == [False] * 4
    assert calls[0]["cache_dir"] == calls[1]["cache_dir"] != calls[2]["cache_dir"]
    assert calls[0]["kwargs"]["max_epochs"] == 30 and calls[0]["kwargs"]["accelerator"] == "cpu"
    assert fake.calls[1]["overrides"]["precision"] == "32-true"
    assert json.loads((tmp_path / "w.json").read_text()) == json.loads(json.dumps(rows))
    assert fake.warm_ups == ["tiny"]  # once per task, before its first measured run


def test_workloads_bench_writes_each_row_and_resumes(fake: _FakeTrainer, tmp_path) -> None:
    path = tmp_path / "w.json"
    fake.fail_on = 3
    with pytest.raises(KeyboardInterrupt):
        wb.run_suite(["tiny"], methods=("baseline",), seeds=(0, 1, 2), json_path=path, echo=False)
    assert [r["seed"] for r in json.loads(path.read_text())] == [0, 1]  # the rows measured before the interrupt
    assert not (tmp_path / "w.json.tmp").exists()
    fake.fail_on = None
    fake.calls = []
    rows = wb.run_suite(["tiny"], methods=("baseline",), seeds=(0, 1, 2), json_path=path, echo=False)
    assert [c["seed"] for c in fake.calls] == [2]  # only the missing row trained
    fake.warm_ups = []
    wb.run_suite(["tiny"], methods=("baseline",), seeds=(0, 1, 2), json_path=path, echo=False)
    assert fake.warm_ups == [] and len(fake.calls) == 1  # nothing left to measure: no warm-up either
    assert [r["seed"] for r in rows] == [0, 1, 2] and len(json.loads(path.read_text())) == 3


def test_workloads_bench_resume_keeps_other_rows_and_refills_cache(fake: _FakeTrainer, tmp_path) -> None:
    path = tmp_path / "w.json"
    wb.run_suite(["tiny"], methods=("baseline", "autotune_first"), seeds=(0,), json_path=path, echo=False)
    rows = wb.run_suite(["tiny"], methods=("autotune_cached",), seeds=(0,), json_path=path, echo=False)
    assert [r["method"] for r in rows] == ["autotune_cached"]  # returns the selection
    assert [r["method"] for r in json.loads(path.read_text())] == ["baseline", "autotune_first", "autotune_cached"]
    assert "filled once, untimed" in rows[0]["notes"]  # a new process: the first run's cache was gone


def test_workloads_bench_misconfiguration(fake: _FakeTrainer, tmp_path) -> None:
    with pytest.raises(SpeedupConfigError, match=r"`workload`='nope' is not registered\. Allowed values: .*'tiny'"):
        wb.run_suite(["tiny", "nope"], echo=False)
    with pytest.raises(SpeedupConfigError, match=r"`methods`='fastest' is not supported"):
        wb.run_suite(["tiny"], methods=("baseline", "fastest"), echo=False)
    with pytest.raises(SpeedupConfigError, match=r"`seeds`"):
        wb.run_suite(["tiny"], seeds=(-1,), echo=False)
    bad = tmp_path / "bad.json"
    bad.write_text('{"rows": []}')
    with pytest.raises(SpeedupConfigError, match=r"does not hold a list of rows"):
        wb.run_suite(["tiny"], json_path=bad, echo=False)
    full = tmp_path / "full.json"
    wb.run_suite(["tiny"], methods=("baseline",), seeds=(0,), json_path=full, echo=False)
    with pytest.raises(SpeedupConfigError, match=r"holds full rows; `quick`=True would mix them"):
        wb.run_suite(["tiny"], json_path=full, quick=True, echo=False)
    assert len(fake.calls) == 1  # every error before any training
    assert wb.main(["--tasks", "nope"]) == 2


def test_workloads_bench_quick_is_one_seed_small(fake: _FakeTrainer) -> None:
    rows = wb.run_suite(["tiny"], methods=("baseline",), seeds=(3, 4), quick=True, echo=False)
    assert [r["seed"] for r in rows] == [3] and fake.calls[0]["small"] is True
    assert rows[0]["notes"].startswith(wb.SMALL_NOTE)


def test_workloads_bench_fast_train_where_it_applies(fake: _FakeTrainer, monkeypatch) -> None:
    from lightning_speedups.demo import DemoClassifier

    tiny = get_workload("tiny")
    monkeypatch.setitem(
        _registry._WORKLOADS,
        "tiny",
        replace(tiny, build=lambda seed, small=False: (DemoClassifier(width=4), tiny.build(seed, small)[1])),
    )

    def fake_fast_train(model=None, precision="auto", cache_dir=None, **kwargs):
        return Recipe("fast_train", [], {**kwargs, "precision": precision}, notes=["probe"])

    monkeypatch.setattr(wb, "fast_train", fake_fast_train)
    rows = wb.run_suite(["tiny"], methods=("fast_train",), seeds=(0,), no_bf16=True, echo=False)
    assert [r["method"] for r in rows] == ["fast_train"] and rows[0]["notes"] == "probe"
    assert fake.calls[0]["overrides"]["precision"] == "32-true"


def _rows(times: dict[tuple[str, int], float | None], quality: dict[str, float]) -> list[dict[str, Any]]:
    return [
        dict(
            task="gpt_stdlib",
            kind="transformer_lm",
            split="held_out",
            method=m,
            seed=s,
            time_to_target_s=t,
            quality=quality[m],
            metric="val_loss",
            trial_s=1.0 if m != "baseline" else 0.0,
            machine={"cpu": "x"},
            steps=5,
            notes="",
        )
        for (m, s), t in times.items()
    ]


def test_workloads_bench_summarize_medians_and_ratios() -> None:
    times = {
        ("baseline", 0): 10.0,
        ("baseline", 1): 12.0,
        ("baseline", 2): 20.0,
        ("autotune_first", 0): 5.0,
        ("autotune_first", 1): 6.0,
        ("autotune_first", 2): None,
        ("autotune_cached", 0): None,
        ("autotune_cached", 1): None,
        ("autotune_cached", 2): 4.0,
    }
    quality = {"baseline": 2.90, "autotune_first": 2.905, "autotune_cached": 2.95}
    summary = {s["method"]: s for s in wb.summarize(_rows(times, quality))}
    base = summary["baseline"]
    first = summary["autotune_first"]
    cached = summary["autotune_cached"]
    assert (base["median_s"], base["min_s"], base["max_s"], base["reached"]) == (12.0, 10.0, 20.0, 3)
    assert base["ratio"] == 1.0
    # a missed run counts as infinitely slow: median of (5, 6, inf) = 6
    assert (first["median_s"], first["reached"], first["n"]) == (6.0, 2, 3)
    assert first["ratio"] == pytest.approx(2.0) and (first["ratio_min"], first["ratio_max"]) == (2.0, 2.0)
    assert cached["median_s"] is None and cached["ratio"] is None and cached["ratio_max"] == 5.0
    assert first["mode"] == "min" and first["target"] == 3.0 and first["quality"] == 2.905
    assert does_not_help(first, base) is None  # 0.005 more loss: within 0.01
    assert does_not_help(cached, base) == "target missed"
    assert (base["path"], first["path"], first["no_bf16"]) == ("-", "auto", False)  # rows without the field
    lines = wb.format_summary(wb.summarize(_rows(times, quality))).splitlines()
    assert "| gpt_stdlib | dev | val_loss (min 3) |" in lines  # the registered split now
    assert "| gpt_stdlib | - | baseline | 12.0 s [10.0-20.0] | - | 2.900 | - |" in lines
    assert "| gpt_stdlib | auto | autotune_first | 6.0 s (2/3 reached) | 2.00x | 2.905 | - |" in lines
    assert "| gpt_stdlib | auto | autotune_cached | not reached (1/3) | - | 2.950 | target missed |" in lines


def test_workloads_summary_compares_a_one_seed_method_with_that_seed() -> None:
    runs = [
        ("baseline", 0, 10.0, 0.80),
        ("baseline", 1, 20.0, 0.90),
        ("baseline", 2, 30.0, 0.90),
        ("advisor_top", 0, 10.0, 0.80),
    ]
    rows = [
        dict(
            task="t",
            kind="tabular",
            split="dev",
            method=m,
            seed=s,
            time_to_target_s=t,
            quality=q,
            metric="val_acc",
            trial_s=0.0,
        )
        for m, s, t, q in runs
    ]
    base, top = wb.summarize(rows)
    assert base["ratio"] == 1.0 and base["median_s"] == 20.0
    # seed 0 only: against seed 0's baseline (1.00x, same end), not the three seeds' median (2.00x, 0.1 worse)
    assert top["ratio"] == 1.0 and top["base_median_s"] == 10.0 and top["base_quality"] == 0.80
    assert does_not_help(top, base) is None


def test_workloads_bench_does_not_help_on_accuracy() -> None:
    base = {"ratio": 1.0, "median_s": 10.0, "quality": 0.90, "mode": "max"}
    assert does_not_help({**base, "ratio": 0.8, "median_s": 12.5}, base) == "slower (0.80x)"
    assert does_not_help({**base, "ratio": 1.5, "quality": 0.894}, base).startswith("worse end")
    assert does_not_help({**base, "ratio": 1.5, "quality": 0.896}, base) is None


def test_workloads_bench_run_gives_bench_rows(fake: _FakeTrainer) -> None:
    fake.times = {("autotune_first", 0): 4.0, ("autotune_cached", 0): 5.0}
    rows = wb.run(quick=False, tasks=["tiny"], seeds=(0,), echo=False)
    assert [r.variant for r in rows] == [
        "autotune_first vs plain baseline (tiny, dev, auto path)",
        "autotune_cached vs plain baseline (tiny, dev, auto path)",
    ]
    assert rows[1].technique == "workloads" and rows[1].baseline == 10.0 and rows[1].accuracy_candidate == 0.9
    assert rows[1].ratio == pytest.approx(10.0 / rows[1].candidate)
    both = wb.run(quick=False, tasks=["tiny"], seeds=(0,), echo=False, paths=("auto", "no-bf16"))
    assert [r.variant for r in both][2:] == [
        "autotune_first vs plain baseline (tiny, dev, no-bf16 path)",
        "autotune_cached vs plain baseline (tiny, dev, no-bf16 path)",
    ]
    assert both[3].baseline == 10.0  # the path-free baseline row, run once


def test_workloads_bench_real_smoke(tmp_path) -> None:
    """One real, small run: the baseline of the tabular task (a few seconds), through the real time_to_target."""
    rows = wb.run_suite(["tabular_mlp"], methods=("baseline",), json_path=tmp_path / "w.json", quick=True, echo=False)
    assert len(rows) == 1 and rows[0]["steps"] > 0 and 0.0 <= rows[0]["quality"] <= 1.0
    assert json.loads((tmp_path / "w.json").read_text())[0]["task"] == "tabular_mlp"


def test_workloads_bench_gain_checks_per_sample_against_the_same_seed() -> None:
    from benchmarks._workloads_table import format_gain_checks, gain_checks

    base = dict(task="t", method="baseline", seed=0, train_s=10.0, steps=100, batch_scale=1, predicted_gain=None)
    rows = [
        base,
        {**base, "seed": 1, "train_s": 20.0},
        # a doubled batch: half the steps, each 1.6x as long -> 1.25x per sample, predicted 1.3x: within 10%
        {**base, "method": "autotune_first", "train_s": 8.0, "steps": 50, "batch_scale": 2, "predicted_gain": 1.3},
        # predicted 2x, the fit ran 1.25x: a miss
        {**base, "method": "autotune_cached", "seed": 1, "train_s": 16.0, "predicted_gain": 2.0},
        {**base, "method": "advisor_top", "train_s": 5.0},  # not autotune: no check
        {**base, "method": "autotune_first", "seed": 2, "predicted_gain": 1.1},  # no baseline for seed 2
        {**base, "method": "autotune_cached", "train_s": None, "predicted_gain": 1.1},  # an older row
    ]
    checks = gain_checks(rows)
    assert [(c["method"], c["seed"], c["within"]) for c in checks] == [
        ("autotune_first", 0, True),
        ("autotune_cached", 1, False),
    ]
    assert checks[0]["fit_gain"] == pytest.approx(1.25) and checks[1]["fit_gain"] == pytest.approx(1.25)
    table = format_gain_checks(checks)
    assert "| t | auto | autotune_first | 1.30x | 1.25x | 1/1 |" in table
    assert "| t | auto | autotune_cached | 2.00x | 1.25x | 0/1 |" in table


def test_workloads_advisor_fix_for_skips_code_changes_and_measure_first() -> None:
    from benchmarks._workloads_advisor import FIXES, fix_for

    findings = [
        {"key": "data_bound", "fix": "`DeviceDataLoader`"},
        {"key": "not_compiled", "fix": "Measure first: `SpeedAdvisor(probe_compile=True)`"},
        {"key": "channels_last", "fix": "`ChannelsLast()` callback"},
        {"key": "small_batch", "fix": "`ThroughputBatchSizeFinder()`"},
    ]
    finding, skipped = fix_for(findings)
    assert finding is findings[2] and skipped == ["data_bound", "not_compiled"]
    assert fix_for(findings[:2]) == (None, ["data_bound", "not_compiled"])
    # measured, no gain on this machine ("skip it"): the report ranks it last with score 0, and nobody applies it
    no_gain = {"key": "channels_last", "fix": "`ChannelsLast()` callback", "severity": "info", "score": 0.0}
    assert fix_for([no_gain, findings[3]]) == (findings[3], ["channels_last"])
    callbacks, overrides = FIXES["fp32_on_bf16_cpu"]()
    assert (callbacks, overrides) == ([], {"precision": "bf16-mixed"})
    assert type(FIXES["not_compiled"]()[0][0]).__name__ == "TorchCompile"


def test_workloads_bench_advisor_top_applies_the_first_fix(fake: _FakeTrainer, monkeypatch) -> None:
    findings = {
        0: [
            {"key": "num_workers_zero", "title": "t", "fix": "DataLoader `num_workers` > 0"},
            {"key": "channels_last", "title": "NCHW layout", "fix": "`ChannelsLast()` callback"},
        ],
        1: [{"key": "num_workers_zero", "title": "t", "fix": "DataLoader `num_workers` > 0"}],
    }
    monkeypatch.setattr(wb, "advisor_findings", lambda w, seed, small, no_bf16: (findings[seed], 3.0))
    assert "advisor_top" not in wb.METHODS  # only when named
    rows = wb.run_suite(["tiny"], methods=("advisor_top",), seeds=(0, 1), echo=False)
    assert [(r["method"], r["seed"], r["trial_s"]) for r in rows] == [("advisor_top", 0, 0.0), ("advisor_top", 1, 0.0)]
    assert rows[0]["notes"].startswith("applied: channels_last: NCHW layout") and "num_workers_zero" in rows[0]["notes"]
    assert "took 3.0 s" in rows[0]["notes"]
    assert [type(c).__name__ for c in fake.calls[0]["callbacks"]] == ["ChannelsLast"]
    # seed 1: nothing to apply, so the user's run is the baseline again (its spread against the baseline is noise)
    assert rows[1]["notes"].startswith("nothing applied: the advisor's findings (num_workers_zero)")
    assert [type(c).__name__ for c in fake.calls[1]["callbacks"]] == []


def test_workloads_bench_precision_trial_and_bf16_rows(fake: _FakeTrainer) -> None:
    assert {"precision_trial", "bf16"}.isdisjoint(wb.METHODS)  # only when named
    rows = wb.run_suite(["tiny"], methods=("baseline", "precision_trial", "bf16"), seeds=(0,), echo=False)
    assert [r["method"] for r in rows] == ["baseline", "precision_trial", "bf16"]
    trial = fake.calls[1]
    bf16 = fake.calls[2]
    assert [type(c).__name__ for c in trial["callbacks"]] == ["PrecisionTrial"]
    assert trial["overrides"] == {"precision": "32-true"} and bf16["overrides"] == {"precision": "bf16-mixed"}
    assert rows[1]["notes"] == "PrecisionTrial: "  # the fake fit ran no step: no decision to report
    assert wb.run_suite(["tiny"], methods=("precision_trial", "bf16"), seeds=(0,), no_bf16=True, echo=False) == []


def test_workloads_bench_rotates_the_method_order_from_seed_to_seed(fake: _FakeTrainer) -> None:
    abc = [("a", None), ("b", None), ("c", None)]
    assert wb._rotated(abc, 1) == [("b", None), ("c", None), ("a", None)] and wb._rotated(abc, 3) == abc
    assert wb._rotated(wb._units(["baseline", "autotune_first", "autotune_cached"], [False]), 2) == [
        ("autotune_first", False),
        ("baseline", None),
        ("autotune_cached", False),
    ]
    assert wb._rotated(wb._units(["autotune_first", "autotune_cached", "baseline"], [False]), 1) == [
        ("autotune_first", False),
        ("baseline", None),
        ("autotune_cached", False),
    ]  # the cached run reads the first run's cache
    rows = wb.run_suite(["tiny"], methods=("baseline", "precision_trial", "bf16"), seeds=(0, 1), echo=False)
    order = [(0, "baseline"), (0, "precision_trial"), (0, "bf16"), (1, "precision_trial"), (1, "bf16"), (1, "baseline")]
    assert [(r["seed"], r["method"]) for r in rows] == order


def test_workloads_bench_both_paths_in_one_call(fake: _FakeTrainer, tmp_path) -> None:
    methods = ("baseline", "autotune_first", "autotune_cached")
    rows = wb.run_suite(
        ["tiny"], methods=methods, seeds=(0, 1, 2), json_path=tmp_path / "w.json", echo=False, paths=("auto", "no-bf16")
    )
    # the baseline once per seed, each autotune method once per path; the rotation moves the first run on by one
    # per seed, and the third seed's autotune_cached [auto] is swapped behind autotune_first [auto]
    first, cached = "autotune_first", "autotune_cached"
    assert [(r["seed"], r["method"], r["no_bf16"]) for r in rows] == [
        *[(0, "baseline", None), (0, first, False), (0, first, True), (0, cached, False), (0, cached, True)],
        *[(1, first, False), (1, first, True), (1, cached, False), (1, cached, True), (1, "baseline", None)],
        *[(2, first, True), (2, first, False), (2, cached, True), (2, "baseline", None), (2, cached, False)],
    ]
    assert json.loads((tmp_path / "w.json").read_text()) == json.loads(json.dumps(rows))
    # each path fills and reads its own cache: no cached run found it empty, and autotune saw the path's no_bf16
    calls = fake.autotune_calls  # type: ignore[attr-defined]
    assert [(c["no_bf16"], c["cached"]) for c in calls[:4]] == [
        (False, False),
        (True, False),
        (False, True),
        (True, True),
    ]
    assert calls[0]["cache_dir"] == calls[2]["cache_dir"] != calls[1]["cache_dir"] == calls[3]["cache_dir"]
    assert not any("filled once" in r["notes"] for r in rows)
    assert fake.warm_ups == ["tiny"] and len(fake.calls) == 15
    # precision_trial and bf16 keep bf16 out on the no-bf16 path: rows on the auto path only
    fake.calls = []
    rows = wb.run_suite(
        ["tiny"], methods=("precision_trial", "bf16"), seeds=(0,), echo=False, paths=("auto", "no-bf16")
    )
    assert [(r["method"], r["no_bf16"]) for r in rows] == [("precision_trial", False), ("bf16", False)]


def test_workloads_bench_rotation_covers_the_paths() -> None:
    units = wb._units(["baseline", "autotune_first", "autotune_cached"], [False, True])
    assert units == [
        ("baseline", None),
        ("autotune_first", False),
        ("autotune_first", True),
        ("autotune_cached", False),
        ("autotune_cached", True),
    ]
    assert [wb._rotated(units, k)[0] for k in range(3)] == [
        ("baseline", None),
        ("autotune_first", False),
        ("autotune_first", True),
    ]
    for k in range(len(units)):  # within each path the cached run comes after the first one
        order = wb._rotated(units, k)
        assert sorted(order, key=str) == sorted(units, key=str)
        for no_bf16 in (False, True):
            assert order.index(("autotune_first", no_bf16)) < order.index(("autotune_cached", no_bf16))


def test_workloads_bench_resumes_both_paths_and_an_old_file(fake: _FakeTrainer, tmp_path) -> None:
    path = tmp_path / "w.json"
    wb.run_suite(["tiny"], methods=("baseline", "autotune_first"), seeds=(0,), json_path=path, echo=False)
    old = json.loads(path.read_text())
    for r in old:  # a file written before the field
        del r["no_bf16"]
    path.write_text(json.dumps(old))
    fake.calls = []
    rows = wb.run_suite(
        ["tiny"],
        methods=("baseline", "autotune_first"),
        seeds=(0,),
        json_path=path,
        echo=False,
        paths=("auto", "no-bf16"),
    )
    # the old rows count as the baseline and autotune_first on the auto path: only the no-bf16 run trains
    assert len(fake.calls) == 1 and fake.autotune_calls[-1]["no_bf16"] is True  # type: ignore[attr-defined]
    assert [(r["method"], r.get("no_bf16", "no field")) for r in rows] == [
        ("baseline", "no field"),
        ("autotune_first", "no field"),
        ("autotune_first", True),
    ]
    assert len(json.loads(path.read_text())) == 3  # the old rows kept as they were, the new one added
    # nothing left on either path: no run, no warm-up; the shorthand no_bf16 selects the baseline and no-bf16 rows
    fake.warm_ups = []
    rows = wb.run_suite(
        ["tiny"], methods=("baseline", "autotune_first"), seeds=(0,), json_path=path, no_bf16=True, echo=False
    )
    assert len(fake.calls) == 1 and fake.warm_ups == []
    assert [(r["method"], r.get("no_bf16", "no field")) for r in rows] == [
        ("baseline", "no field"),
        ("autotune_first", True),
    ]


def test_workloads_bench_bad_paths(fake: _FakeTrainer, capsys) -> None:
    with pytest.raises(
        SpeedupConfigError, match=r"`paths`='fp16' is not supported\. Allowed values: 'auto', 'no-bf16'\."
    ):
        wb.run_suite(["tiny"], paths=("auto", "fp16"), echo=False)
    with pytest.raises(SpeedupConfigError, match=r"`paths`='auto' is not a non-empty sequence of paths"):
        wb.run_suite(["tiny"], paths="auto", echo=False)
    with pytest.raises(SpeedupConfigError, match=r"`paths`=\(\) is not a non-empty sequence of paths"):
        wb.run_suite(["tiny"], paths=(), echo=False)
    with pytest.raises(SpeedupConfigError, match=r"`no_bf16`=True conflicts with `paths`=\['auto'\]"):
        wb.run_suite(["tiny"], paths=("auto",), no_bf16=True, echo=False)
    assert wb.main(["--tasks", "tiny", "--no-bf16", "--paths", "auto,no-bf16"]) == 2
    assert "`--no-bf16` (the shorthand for --paths no-bf16) conflicts with `--paths`='auto,no-bf16'" in (
        capsys.readouterr().err
    )
    assert wb.main(["--tasks", "tiny", "--paths", "auto,fp16"]) == 2
    assert "error: `paths`='fp16' is not supported. Allowed values: 'auto', 'no-bf16'." in capsys.readouterr().err
    assert fake.calls == [] and fake.warm_ups == []  # every error before any training


def test_workloads_bench_cli_writes_both_paths(fake: _FakeTrainer, tmp_path, capsys) -> None:
    path = tmp_path / "w.json"
    argv = ["--tasks", "tiny", "--methods", "baseline,autotune_first", "--seeds", "0", "--json", str(path)]
    assert wb.main([*argv, "--paths", "auto,no-bf16"]) == 0
    rows = json.loads(path.read_text())
    assert [(r["method"], r["no_bf16"]) for r in rows] == [
        ("baseline", None),
        ("autotune_first", False),
        ("autotune_first", True),
    ]
    out = capsys.readouterr().out
    assert "| tiny | auto | autotune_first | 10.0 s |" in out and "| tiny | no-bf16 | autotune_first | 10.0 s |" in out
    assert wb.main([*argv, "--no-bf16", "--paths", "no-bf16"]) == 0  # the same meaning twice: no conflict
    assert len(fake.calls) == 3  # and nothing left to run


def _path_row(method: str, seed: int, t: float | None, quality: float, no_bf16: bool | None) -> dict[str, Any]:
    return dict(
        task="convnext_shapes",
        kind="image",
        split="held_out",
        method=method,
        no_bf16=no_bf16,
        seed=seed,
        time_to_target_s=t,
        quality=quality,
        metric="val_acc",
        trial_s=0.0,
        machine={"cpu": "x"},
    )


def test_workloads_bench_summary_by_path_within_120_columns() -> None:
    rows = [
        *(_path_row("baseline", s, t, 0.871, None) for s, t in enumerate((1200.0, 1234.0, 1300.0))),
        *(_path_row("autotune_cached", s, t, 0.91, False) for s, t in enumerate((600.0, 617.0, None))),
        _path_row("precision_trial", 0, 1000.0, 0.871, False),
        *(_path_row("autotune_cached", s, t, 0.854, True) for s, t in enumerate((1100.0, 1200.0, None))),
    ]
    summary = wb.summarize(rows)
    assert [(s["method"], s["path"], s["median_s"], s["ratio"]) for s in summary] == [
        ("baseline", "-", 1234.0, 1.0),
        ("autotune_cached", "auto", 617.0, 2.0),
        ("precision_trial", "auto", 1000.0, 1.2),  # against seed 0's baseline
        ("autotune_cached", "no-bf16", 1200.0, pytest.approx(1234.0 / 1200.0)),
    ]
    table = wb.format_summary(summary, rows)
    lines = table.splitlines()
    assert "| convnext_shapes | held_out | val_acc (max 0.9) |" in lines
    i = lines.index("| convnext_shapes | - | baseline | 1234.0 s [1200.0-1300.0] | - | 0.871 | - |")
    assert lines[i + 1 : i + 5] == [
        "| convnext_shapes | auto | autotune_cached | 617.0 s (2/3 reached) | 2.00x | 0.910 | - |",
        "| convnext_shapes | auto | precision_trial | 1000.0 s | 1.20x | 0.871 | - |",
        "| convnext_shapes | no-bf16 | autotune_cached | 1200.0 s (2/3 reached) | 1.03x | 0.854 | "
        "worse end (0.854 vs 0.871) |",
        "| convnext_shapes | no-bf16 | precision_trial | n/a | - | - | - |",
    ]
    assert max(len(x) for x in lines) <= 120 and "read as the auto path" not in table
    old = [{k: v for k, v in r.items() if k != "no_bf16"} for r in rows if r["no_bf16"] is not True]
    old_table = wb.format_summary(wb.summarize(old), old)
    assert "| convnext_shapes | auto | autotune_cached | 617.0 s (2/3 reached) | 2.00x | 0.910 | - |" in old_table
    assert "Rows without a no_bf16 field (written before it) read as the auto path" in " ".join(old_table.split())
    assert max(len(x) for x in old_table.splitlines()) <= 120


def test_workloads_bench_summary_uses_a_path_specific_baseline() -> None:
    """A file with path-specific baselines (no_bf16 set on the baseline rows): each path's methods against them."""
    rows = [
        _path_row("baseline", 0, 20.0, 0.9, True),
        _path_row("autotune_first", 0, 10.0, 0.9, True),
        _path_row("autotune_first", 0, 10.0, 0.9, False),
    ]
    summary = wb.summarize(rows)
    assert [(s["method"], s["path"], s["ratio"]) for s in summary] == [
        ("autotune_first", "auto", None),  # no baseline on this path
        ("baseline", "no-bf16", 1.0),
        ("autotune_first", "no-bf16", 2.0),
    ]


def test_workloads_bench_gain_checks_per_path() -> None:
    from benchmarks._workloads_table import format_gain_checks, gain_checks

    base = dict(task="t", method="baseline", seed=0, train_s=10.0, steps=100, batch_scale=1, predicted_gain=None)
    first = {**base, "method": "autotune_first"}
    rows = [
        {**base, "no_bf16": None},
        {**base, "seed": 1, "train_s": 40.0, "no_bf16": None},
        {**base, "seed": 1, "train_s": 20.0, "no_bf16": True},  # the no-bf16 path's own baseline of seed 1
        {**first, "no_bf16": True, "train_s": 10.0, "predicted_gain": 1.2},
        {**first, "no_bf16": True, "seed": 1, "train_s": 10.0, "predicted_gain": 2.0},
        {**first, "no_bf16": False, "train_s": 8.0, "predicted_gain": 1.25},
    ]
    checks = gain_checks(rows)
    assert [(c["path"], c["seed"], c["fit_gain"], c["within"]) for c in checks] == [
        ("no-bf16", 0, 1.0, False),
        ("no-bf16", 1, 2.0, True),  # against its path's baseline (20 s), not the path-free one (40 s)
        ("auto", 0, 1.25, True),
    ]
    lines = format_gain_checks(checks).splitlines()
    assert lines[0] == "| task | path | method | predicted (per seed) | the fit measured (per seed) | within 10% |"
    assert lines[2:] == [
        "| t | auto | autotune_first | 1.25x | 1.25x | 1/1 |",
        "| t | no-bf16 | autotune_first | 1.20x, 2.00x | 1.00x, 2.00x | 1/2 |",
    ]


def test_workloads_targets_per_path_name_each_miss() -> None:
    """The held-out median against 1.5x (auto) and 1.3x (no-bf16), the floor on every task (dev ones too), an end
    worse than the baseline's and the GPT's own target: each miss is named beside its target."""
    from benchmarks._workloads_table import format_headline, format_targets, target_checks

    runs = {  # task -> (baseline seconds, auto seconds, no-bf16 seconds); box_cnn's auto run misses its target
        "convnext_shapes": (30.0, 15.0, 20.0),
        "signal_cnn1d": (30.0, 20.0, 21.0),
        "box_cnn": (30.0, None, 22.0),
        "digits": (10.0, 5.0, 11.0),
        "gpt_stdlib": (60.0, 30.0, 50.0),
    }
    rows = []
    for task, times in runs.items():
        for method, no_bf16, t in zip(("baseline", "autotune_first", "autotune_first"), (None, False, True), times):
            quality = 0.80 if (task, no_bf16) == ("signal_cnn1d", True) else 0.9
            rows.append({**_path_row(method, 0, t, quality, no_bf16), "task": task})
    checks = target_checks(wb.summarize(rows))
    assert [(c["path"], c["median"], c["lowest"], c["met"]) for c in checks] == [
        ("auto", 1.5, ("box_cnn", 0.0), False),  # a missed target counts as 0x
        ("no-bf16", pytest.approx(30.0 / 21.0), ("digits", pytest.approx(10.0 / 11.0)), False),
    ]
    assert checks[1]["worse"] == [("signal_cnn1d", "worse end (0.8 vs 0.9)")]
    assert checks[0]["own"] == {"gpt_stdlib": (2.0, 1.5)}
    lines = format_targets(checks).splitlines()
    assert (
        lines[2] == "| auto | 1.50x (met) over 3 | box_cnn 0.00x (target 0.97x) | none | gpt_stdlib 2.00x (met) | no |"
    )
    assert lines[3].startswith("| no-bf16 | 1.43x (met) over 3 | digits 0.91x (target 0.97x) | signal_cnn1d |")
    assert "gpt_stdlib 1.20x (target 1.5x)" in lines[3] and max(len(x) for x in lines) <= 120
    assert format_headline(wb.summarize(rows)).splitlines() == [
        "| task (metric, target) | split | plain run | bf16 allowed | `no_bf16=True` |",
        "|---|---|---|---|---|",
        "| convnext_shapes (val_acc 0.9) | held out | 30.0 s | 2.00x | 1.50x |",
        "| signal_cnn1d (val_acc 0.8) | held out | 30.0 s | 1.50x | 1.43x, worse end (0.8 vs 0.9) |",
        "| box_cnn (val_acc 0.65) | held out | 30.0 s | -, target missed | 1.36x |",
        "| gpt_stdlib (val_acc 3) | dev | 60.0 s | 2.00x | 1.20x |",  # dev, shown for its own target
        "| median held-out task |  |  | **1.50x** (target 1.5x) | **1.43x** (target 1.3x) |",
    ]
