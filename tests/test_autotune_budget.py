"""autotune's trial budget on the fake clock: a run of minutes reaches the candidate that matters, comparisons are
priced at the least they take, and a run too short to measure anything says so once (issue 23). No timing asserted:
every second here is the fake machine's."""

from __future__ import annotations

import re

import lightning as L
import pytest
from torch import nn

from lightning_speedups import _peak
from lightning_speedups._errors import SpeedupConfigError
from lightning_speedups.autotune import autotune
from lightning_speedups.autotune.budget import Skipped, budget_note
from lightning_speedups.autotune.trials import COMPARISON_STEPS, MIN_ROUNDS
from lightning_speedups.callbacks.fast_schedule import FastSchedule
from lightning_speedups.demo import DemoClassifier
from lightning_speedups.measure import PlanCache
from tests.test_autotune import FakeMachine, _fake_tune, _loader, _patched


def test_a_2x_candidate_on_a_half_second_step_is_measured_within_5_percent_of_a_two_minute_run(monkeypatch):
    # issue 23: 5% of a 2-minute run (240 steps of 0.5 s) is 6 s; the 4 sizing steps take 2 s, and one comparison was
    # priced at 2 x (1 + 5) steps = 6 s, so a 2x candidate was never tried. Now: 1 + 2 x 3 steps = 3.5 s, and the warm
    # sizing copy is the baseline: measured, kept, within the budget (channels_last: an offline candidate; precision
    # is timed in the fit on such a run, next test)
    machine = FakeMachine({"32-true": 0.5, "channels_last": 0.5})
    plan = _fake_tune(monkeypatch, machine, ["channels_last"], max_steps=240)
    (choice,) = plan.choices
    assert choice.name == "channels_last" and choice.chosen is True
    assert choice.gain == pytest.approx(2.0, rel=0.2) and choice.trials == MIN_ROUNDS  # a 2x effect settles in 3
    assert plan.trial_s <= 6.0 * 1.15  # the 5% (6 s, sized by a jittered median step)
    assert not any("not tried" in n for n in plan.notes)


def test_precision_is_timed_in_the_fit_by_default_on_a_run_long_enough_for_it(monkeypatch):
    # a CPU with bf16 units and 240 planned steps: no offline precision step (the fit's own steps time it, and train),
    # so the whole budget goes to the other candidates; the plan's gain counts bf16 once the fit has decided
    from lightning_speedups.callbacks.precision_trial import PrecisionTrial

    # (260 steps: the in-fit trial's check of one bf16 step on a copy comes out of the 5% too, issue 50; 240 steps'
    # 12 steps of budget held the sizing's 4 and one comparison's 7 with nothing to spare)
    machine = FakeMachine({"32-true": 0.5, "bf16-mixed": 0.25, "channels_last": 0.5})
    plan = _fake_tune(monkeypatch, machine, ["precision", "channels_last"], max_steps=260)
    assert [(c.name, c.chosen) for c in plan.choices] == [("precision", "in-fit trial"), ("channels_last", True)]
    assert plan.trainer_kwargs["precision"] == "32-true" and machine.calls < 4 + COMPARISON_STEPS * 2
    assert "other candidates are timed in fp32" in plan.choices[0].note
    (trial,) = [cb for cb in plan.callbacks if isinstance(cb, PrecisionTrial)]
    assert plan.gain == pytest.approx(2.0, rel=0.2)  # channels_last's; bf16 not decided yet
    trial.kept = "bf16-mixed"
    trial.ratio = (1.2, 1.3, 1.4)
    assert plan.gain == pytest.approx(2.0 * 1.3, rel=0.2)
    # offline where the in-fit trial cannot time every option or pay its steps: a short run, or no_bf16
    short = _fake_tune(monkeypatch, FakeMachine({"bf16-mixed": 0.5}), ["precision"], budget_s=60.0, max_steps=40)
    assert short.choices[0].chosen == "bf16-mixed" and short.trainer_kwargs["precision"] == "bf16-mixed"
    plain = _fake_tune(monkeypatch, FakeMachine({"bf16-mixed": 0.5}), ["precision"], max_steps=240, no_bf16=True)
    assert plain.choices == [] and not plain.callbacks and any("no_bf16=True" in n for n in plain.notes)


def test_the_fits_precision_decision_is_cached_and_a_later_run_starts_in_it(monkeypatch, tmp_path):
    # the plan's PrecisionTrial writes its decision into the cached plan: the next autotune call returns the kept
    # precision as a Trainer argument, with the fit's measured ratio, and no trial callback
    from lightning_speedups.autotune.budget import InFitRecord
    from lightning_speedups.callbacks.precision_trial import PrecisionTrial

    machine = FakeMachine({"32-true": 0.5, "bf16-mixed": 0.25})
    kw = dict(candidates=["precision"], methods=[], cache_dir=tmp_path, clock=machine.clock, max_steps=240)
    _patched(monkeypatch, machine)
    first = autotune(DemoClassifier(width=4), _loader(), **kw)
    again = autotune(DemoClassifier(width=4), _loader(), **kw)  # cached, still undecided: the fit times it again
    assert again.from_cache and again.trainer_kwargs["precision"] == "32-true"
    (trial,) = [cb for cb in again.callbacks if isinstance(cb, PrecisionTrial)]
    assert isinstance(trial.on_decision, InFitRecord) and isinstance(first.callbacks[0].on_decision, InFitRecord)
    trial.kept = "bf16-mixed"
    trial.ratio = (1.2, 1.3, 1.4)
    trial.note = "kept bf16-mixed: 1.30x faster per step"
    trial.times = {"32-true": [1.0] * 3, "bf16-mixed": [0.77] * 3}
    trial.on_decision(trial)  # what the fit's rank 0 does once it decides
    decided = autotune(DemoClassifier(width=4), _loader(), **kw)
    assert decided.from_cache and decided.trainer_kwargs["precision"] == "bf16-mixed"
    assert not any(isinstance(cb, PrecisionTrial) for cb in decided.callbacks)
    (choice,) = decided.choices
    assert choice.chosen == "bf16-mixed" and choice.gain == pytest.approx(1.3) and choice.trials == 3
    assert "timed on the fit's own steps" in choice.note and decided.gain == pytest.approx(1.3)
    trial.on_decision(trial)  # a second fit of the undecided plan: the entry is already decided, left as it is
    assert autotune(DemoClassifier(width=4), _loader(), **kw).choices[0].chosen == "bf16-mixed"
    # an entry the record cannot read (hand-edited) warns: the user's fit, which made the decision, goes on
    PlanCache(tmp_path).put(trial.on_decision.key, {"settings": {"precision_trial": True}})
    with pytest.warns(UserWarning, match=r"decision was not cached \(KeyError"):
        trial.on_decision(trial)


def test_the_rest_of_a_small_budget_goes_on_in_order_and_the_note_says_what_was_left_and_what_one_needs(monkeypatch):
    # the same 6 s with the offline candidates: channels_last (2x) first, then nothing else fits; the note prices the
    # next comparison at 7 steps of the *new* (channels_last) step, names what was left, and the budget_s that fits it
    machine = FakeMachine({"32-true": 0.5, "channels_last": 0.5, "foreach": 0.5, "optimizer_only": 0.9})
    plan = _fake_tune(monkeypatch, machine, ["channels_last", "batch_size", "optimizer"], max_steps=240)
    assert [c.name for c in plan.choices] == ["channels_last"] and plan.choices[0].chosen is True
    (note,) = [n for n in plan.notes if "not tried: what was left" in n]
    assert note.startswith("batch_size, optimizer not tried: what was left of the trial budget (")
    assert re.search(r"of [56]\.\d\ds, 5% of a planned run of about 1[0-3]\d\.\ds", note)  # 240 jittered 0.5 s steps
    needs = dict(re.findall(r"(optimizer|batch_size) (\d+\.\d\d)s", note.split("below")[1]))
    step = 0.25  # the channels_last plan's step on the fake machine
    assert float(needs["optimizer"]) == pytest.approx(COMPARISON_STEPS * step, rel=0.15)
    assert float(needs["batch_size"]) > float(needs["optimizer"])  # two steps per call, both warmed up
    assert "HINT: pass a larger `budget_s` (at least " in note and "to measure optimizer" in note
    assert not note.startswith("nothing measured")


def test_a_comparison_stops_once_settled_and_a_large_budget_is_not_spent(monkeypatch):
    machine = FakeMachine({"bf16-mixed": 0.5})
    plan = _fake_tune(monkeypatch, machine, ["precision"], budget_s=2000.0, max_epochs=1)
    assert plan.choices[0].trials == MIN_ROUNDS and plan.trial_s < 20.0  # not the 2000 s it was allowed


class _Encoder(L.LightningModule):
    """A small transformer classifier over token ids (for the model-kind rules; the fake machine never runs it)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(50, 16)
        self.encoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(16, 2, 32, batch_first=True), 1)
        self.head = nn.Linear(16, 10)

    def training_step(self, batch, batch_idx):  # noqa: ANN001, ANN201
        x, y = batch
        return nn.functional.cross_entropy(self.head(self.encoder(self.embed(x)).mean(1)), y)

    def configure_optimizers(self):  # noqa: ANN201
        import torch

        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def test_a_run_too_short_to_measure_says_so_once_with_the_budget_it_needs_and_adds_no_unproven_method(monkeypatch):
    # 2 planned steps of 1 s with 0.1 s of trials (as 5% of the run was before issue 50; the default budget of such a
    # run now tries nothing, next test), while the 4 sizing steps alone take 4 s. One note says nothing was
    # measured, and the budget_s that fits one comparison: the sizing (about 4 s) and 7 steps (about 7 s)
    machine = FakeMachine({"bf16-mixed": 0.5})
    _patched(monkeypatch, machine)
    plan = autotune(_Encoder(), _loader(), cache=False, clock=machine.clock, max_epochs=1, budget_s=0.1)
    assert plan.choices == [] and plan.callbacks == [] and machine.calls == 4
    budget_notes = [n for n in plan.notes if "trial budget" in n or "nothing measured" in n]
    assert len(budget_notes) == 1, plan.notes
    (note,) = budget_notes
    assert note.startswith("nothing measured: the run is too short for one comparison; ")
    # the budget's note names what it left untried (a plain module's own optimizer included since issue 50); what
    # could not be tried anyway says its own reason
    assert "precision, data, optimizer, compile not tried" in note
    assert any(
        n.startswith("batch_size not tried by default: a larger batch changes the optimisation") for n in plan.notes
    )
    assert "channels_last not tried: no 4-D input or no Conv2d" in plan.notes
    assert not any("builds its own optimizer" in n for n in plan.notes)
    assert "(0.00s of 0.10s)" in note
    fits = float(re.search(r"at least (\d+\.\d)s to measure precision", note).group(1))
    assert fits == pytest.approx(4.0 + COMPARISON_STEPS, abs=1.5)
    assert any(
        n.startswith("ema, schedule not added: no evidence for this model kind (transformer)") for n in plan.notes
    )
    text = plan.to_text() + plan.explain()
    assert "[6, 6, 7, 5]" not in text and "digits" not in text


def test_a_too_short_run_of_a_conv_model_keeps_the_methods_it_names(monkeypatch):
    machine = FakeMachine({})
    _patched(monkeypatch, machine)
    plan = autotune(
        DemoClassifier(width=4),
        _loader(),
        candidates=["precision"],
        cache=False,
        clock=machine.clock,
        accelerator="cpu",
        max_epochs=1,
        methods=["schedule"],
    )
    assert plan.notes[0].startswith("precision not tried: the planned run (2 steps of about ")
    assert [c.name for c in plan.choices] == ["schedule"] and isinstance(plan.callbacks[0], FastSchedule)
    assert not any("not added" in n for n in plan.notes)


def test_the_budget_note_lists_each_candidates_need_when_they_differ():
    note = budget_note([Skipped("channels_last", 1.0, 3.5), Skipped("batch_size", 1.0, 8.0)], 6.0, None, True)
    assert note.startswith("channels_last, batch_size not tried: what was left of the trial budget (1.00s of 6.00s)")
    assert "below what one decision needs (channels_last 3.50s; batch_size 8.00s)" in note
    assert "(at least 8.5s to measure channels_last)" in note
    # each came up with a different amount left (the expensive batching first, then a cheaper one after a trial)
    note = budget_note([Skipped("batching", 4.0, 11.0), Skipped("data", 1.0, 3.5)], 6.0, 120.0, True)
    assert (
        "trial budget (of 6.00s, 5% of a planned run of about 120.0s; when each came up: batching 4.00s; "
        "data 1.00s) is below what one decision needs (batching 11.00s; data 3.50s)" in note
    )
    assert "(at least 8.5s to measure data)" in note


def test_a_cached_plan_that_skipped_candidates_is_measured_again_with_a_larger_budget(monkeypatch, tmp_path):
    # a new user followed the note's HINT ("pass a larger `budget_s`") and got the same cached plan back: a plan
    # whose budget left candidates out is only reused by a call that gives no more time than it had
    machine = FakeMachine({"32-true": 0.5, "bf16-mixed": 0.25})
    _patched(monkeypatch, machine)
    kw = dict(
        candidates=["precision", "channels_last"], methods=[], cache_dir=tmp_path, clock=machine.clock, max_epochs=1
    )
    small = autotune(DemoClassifier(width=4), _loader(), budget_s=3.0, **kw)
    assert any("channels_last not tried: what was left" in n for n in small.notes)
    assert any("a larger `budget_s` measures again" in n for n in small.notes)
    same = autotune(DemoClassifier(width=4), _loader(), budget_s=3.0, **kw)
    assert same.from_cache  # the same budget: the trials are not repeated
    calls = machine.calls
    larger = autotune(DemoClassifier(width=4), _loader(), budget_s=60.0, **kw)
    assert not larger.from_cache and machine.calls > calls
    assert not any("not tried: what was left" in n for n in larger.notes)
    assert {c.name for c in larger.choices} == {"precision", "channels_last"}
    again = autotune(DemoClassifier(width=4), _loader(), budget_s=60.0, **kw)
    assert again.from_cache  # nothing was skipped: a larger budget would change nothing
    assert autotune(DemoClassifier(width=4), _loader(), budget_s=600.0, **kw).from_cache


def test_candidates_given_as_one_string_are_refused_by_name():
    with pytest.raises(SpeedupConfigError, match=r"`candidates`='precision' is a string\. Allowed values: a list"):
        autotune(DemoClassifier(width=4), _loader(), candidates="precision", cache=False)  # type: ignore[arg-type]


def test_precision_that_the_budget_cannot_fit_is_timed_on_the_fits_own_steps(monkeypatch):
    # 240 planned steps of 0.5 s with 3 s of trials: the 4 sizing steps leave 1 s, below one comparison (3.5 s).
    # bf16 is then timed in the fit (PrecisionTrial): its steps train as they measure, so no trial time is lost
    from lightning_speedups.autotune import tune
    from lightning_speedups.callbacks.precision_trial import PrecisionTrial

    monkeypatch.setattr(tune, "precision_in_fit", lambda ctx: False)  # as on a GPU: offline first (16-mixed too)
    machine = FakeMachine({"32-true": 0.5, "bf16-mixed": 0.25})
    # (3 s, not 2.5 s: the in-fit trial's check of one bf16 step on a copy comes out of what is left, issue 50)
    plan = _fake_tune(monkeypatch, machine, ["precision", "channels_last"], budget_s=3.0, max_steps=240)
    assert [c.name for c in plan.choices] == ["precision"] and plan.choices[0].chosen == "in-fit trial"
    assert plan.trainer_kwargs["precision"] == "32-true" and any(isinstance(c, PrecisionTrial) for c in plan.callbacks)
    (note,) = [n for n in plan.notes if "not tried: what was left" in n]
    assert "channels_last not tried" in note and "precision" not in note
    assert not note.startswith("nothing measured")  # precision is measured, in the fit
    assert "the trial budget could not fit an offline comparison" in plan.explain(width=None)
    # with no_bf16 the fit's trial (which only times bf16) is never the fallback
    plain = _fake_tune(monkeypatch, FakeMachine({}), ["precision"], budget_s=2.5, max_steps=240, no_bf16=True)
    assert plain.choices == [] and not plain.callbacks and "no_bf16=True" in " ".join(plain.notes)
    # a run too short for the trial to pay its two extra steps within 2% keeps the budget note instead
    plan = _fake_tune(monkeypatch, FakeMachine({"bf16-mixed": 0.5}), ["precision"], budget_s=2.5, max_steps=40)
    assert plan.choices == [] and "precision not tried" in plan.notes[0]


def test_precision_is_not_tried_on_a_cpu_without_bf16_units(monkeypatch):
    machine = FakeMachine({"bf16-mixed": 0.5})
    _patched(monkeypatch, machine)
    monkeypatch.setattr(_peak, "cpu_bf16_units", lambda: None)
    plan = autotune(
        DemoClassifier(width=4),
        _loader(),
        candidates=["precision"],
        methods=[],
        cache=False,
        clock=machine.clock,
        budget_s=2.5,
        max_steps=240,
    )
    assert plan.choices == [] and plan.callbacks == [] and machine.calls == 4  # the sizing steps only
    assert any(n.startswith("precision not tried: this CPU has no bf16 units") for n in plan.notes)


class _FirstCallMachine(FakeMachine):
    """A :class:`FakeMachine` whose first step of each copy also pays ``first_s`` (a first call's costs)."""

    def __init__(self, costs: dict[str, float], first_s: float) -> None:
        super().__init__(costs)
        self.first_s = first_s

    def make_step(self, ctx, plan, steps: int = 1):
        step = super().make_step(ctx, plan, steps)
        first = [True]

        def once_slow() -> None:
            if first[0]:
                self.now += self.first_s
                first[0] = False
            step()

        return once_slow


def test_a_short_run_tries_nothing_spends_one_step_and_says_what_run_would_pay_back(monkeypatch):
    # issue 50: a 1-D CNN's run of 768 steps of 15 ms (about 11.5 s, its target reached in under 3 s): 5% is 0.58 s,
    # of the order of what a first run spends that trains nothing. Nothing is tried, the in-fit trial included, and
    # the untimed first step (an upper bound of the step) shows it: the three timed sizing steps are not spent
    machine = FakeMachine({"32-true": 0.015, "bf16-mixed": 0.5})
    plan = _fake_tune(monkeypatch, machine, ["precision", "channels_last", "data", "compile"], max_steps=768)
    assert plan.choices == [] and plan.callbacks == [] and machine.calls == 1
    assert plan.trainer_kwargs["precision"] == "32-true"
    assert plan.trial_s == pytest.approx(0.015, rel=0.15)  # the one step: all the first run spent
    note = plan.notes[0]
    assert note.startswith(
        "precision, channels_last, data, compile not tried: the planned run (768 steps of about 0.01"
    )
    assert re.search(r"is too short for a trial to pay back: its 5% trial budget \(0\.[56]\ds\)", note)
    need = int(re.search(r"A planned run of at least 20s \(about (\d+) steps of this model\)", note).group(1))
    assert need == pytest.approx(20.0 / 0.015, rel=0.15)
    assert "HINT: pass `budget_s` to measure anyway" in note
    assert [n for n in plan.notes if "pay back" in n] == [note]  # one note
    # what could not be tried anyway still says its own reason, and is not listed as cut by the run's length
    blocked = _fake_tune(monkeypatch, FakeMachine({"32-true": 0.015}), ["precision"], max_steps=768, no_bf16=True)
    assert "precision not tried: bf16 disabled (no_bf16=True) and no GPU for 16-mixed" in blocked.notes
    assert not any("pay back" in n for n in blocked.notes)


def test_a_short_run_sized_by_its_median_step_still_tries_nothing(monkeypatch):
    # the first call (0.3 s of first-call costs on top of a 15 ms step) says the run may be long enough: the timed
    # steps run, and their median says it is not (768 x 15 ms): the same one note, nothing else spent
    machine = _FirstCallMachine({"32-true": 0.015}, first_s=0.3)
    plan = _fake_tune(monkeypatch, machine, ["channels_last", "data"], max_steps=768)
    assert plan.choices == [] and machine.calls == 1 + 3
    assert plan.notes[0].startswith("channels_last, data not tried: the planned run (768 steps of about 0.01")


def test_a_run_long_enough_keeps_its_trials_and_an_explicit_budget_is_never_cut(monkeypatch):
    # 768 steps of 30 ms (about 23 s, a budget of 1.15 s): trials as before; and the short run of the test above
    # with `budget_s` given measures within it (the user's choice)
    long = _fake_tune(
        monkeypatch, FakeMachine({"32-true": 0.03, "channels_last": 0.5}), ["channels_last"], max_steps=768
    )
    assert [(c.name, c.chosen) for c in long.choices] == [("channels_last", True)]
    assert not any("pay back" in n for n in long.notes)
    machine = FakeMachine({"32-true": 0.015, "channels_last": 0.5})
    given = _fake_tune(monkeypatch, machine, ["channels_last"], max_steps=768, budget_s=0.5)
    assert [(c.name, c.chosen) for c in given.choices] == [("channels_last", True)] and machine.calls > 4
    assert given.trial_s <= 0.5 * 1.15


def test_the_in_fit_check_comes_out_of_the_budget_before_the_offline_candidates(monkeypatch):
    # 240 steps of 0.5 s, 2.2 s of trials: the 4 sizing steps leave about 0.2 s, below the in-fit trial's check of one
    # bf16 step on a copy (0.5 s), which trains nothing: not planned, and the budget note names precision
    from lightning_speedups.autotune import tune

    monkeypatch.setattr(tune, "precision_in_fit", lambda ctx: False)
    plan = _fake_tune(monkeypatch, FakeMachine({"bf16-mixed": 0.5}), ["precision"], budget_s=2.2, max_steps=240)
    assert plan.choices == [] and plan.callbacks == []
    assert plan.notes[0].startswith("nothing measured: the run is too short for one comparison; precision not tried")
    # by default on a CPU with bf16 units (precision_in_fit): the check's step is taken first, so a comparison that
    # fitted the budget without it (12 steps = 4 sizing + 7 + 1 spare at 240 steps) does not fit with it
    monkeypatch.undo()
    machine = FakeMachine({"32-true": 0.5, "bf16-mixed": 0.25, "channels_last": 0.5}, seed=3)
    plan = _fake_tune(monkeypatch, machine, ["precision", "channels_last"], budget_s=5.0, max_steps=240)
    assert [c.name for c in plan.choices] == ["precision"] and plan.choices[0].chosen == "in-fit trial"
    (note,) = [n for n in plan.notes if "not tried: what was left" in n]
    assert note.startswith("channels_last not tried")
    assert plan.trial_s + 0.5 <= 5.0 * 1.1  # the sizing, and the check's step kept for the fit


def test_the_data_trial_builds_its_twin_once_and_prices_its_copy_to_the_device(monkeypatch):
    import torch

    from lightning_speedups.autotune import data
    from lightning_speedups.autotune.trials import TrialContext
    from lightning_speedups.data import DeviceDataLoader

    built = []

    class _Counted(DeviceDataLoader):
        def __init__(self, *args, **kwargs) -> None:
            built.append(1)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr("lightning_speedups.data.DeviceDataLoader", _Counted)
    plan = _fake_tune(monkeypatch, FakeMachine({"32-true": 0.5}), ["data"], budget_s=60.0, max_steps=240)
    assert [c.name for c in plan.choices] == ["data"] and len(built) == 1  # the blocker asks, the trial builds
    loader = _loader(n=64)
    ctx = TrialContext(DemoClassifier(width=4), None, torch.device("cuda"), 240, 0.05, 0.0, {}, loader=loader)
    ctx.step_s = 0.01
    size = sum(t.numel() * t.element_size() for t in loader.dataset.tensors)
    assert data.twin_copy_s(ctx) == pytest.approx(size / data.TWIN_COPY_BYTES_PER_S)
    assert ctx.price("data") == pytest.approx(COMPARISON_STEPS * 0.01 + size / data.TWIN_COPY_BYTES_PER_S)
    assert len(built) == 1  # pricing builds nothing
    ctx.device = torch.device("cpu")  # the twin keeps the user's tensors: no copy
    assert data.twin_copy_s(ctx) == 0.0 and ctx.price("data") == pytest.approx(COMPARISON_STEPS * 0.01)
