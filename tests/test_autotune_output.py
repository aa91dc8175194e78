"""What autotune logs (issue 52): by default a header, one line per choice and one line that counts the notes, each
within 120 columns; the reasons come from ``TunePlan.explain()``, logged too with ``verbose=True``; no line names the
project's own speed targets. Plans come from the fake machine of ``test_autotune`` or are built by hand."""

from __future__ import annotations

import logging

import pytest

from lightning_speedups import SpeedupConfigError
from lightning_speedups.autotune import Choice, TunePlan, autotune
from lightning_speedups.autotune.plan import WIDTH
from lightning_speedups.callbacks.optimizer_race import OptimizerRace
from lightning_speedups.callbacks.precision_trial import PrecisionTrial
from lightning_speedups.demo import DemoClassifier
from tests.test_autotune import FakeMachine, _loader, _patched

RANK_ZERO = "lightning.pytorch.utilities.rank_zero"  # the logger of Lightning's rank_zero_info
LONG = "the measured reason, in words that go on " * 12  # far longer than one line


def _logged(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The lines autotune logged through ``rank_zero_info``."""
    return [line for r in caplog.records if r.name == RANK_ZERO for line in r.getMessage().splitlines()]


def _flat(text: str) -> str:
    """``text`` with its wrapping undone (every run of whitespace one space)."""
    return " ".join(text.split())


def _tune(monkeypatch, caplog, **kwargs) -> tuple[TunePlan, list[str]]:
    """The default plan of a tiny CNN on the fake machine (its choices measured, with the notes of what the default
    leaves out), and the lines autotune logged for it."""
    machine = FakeMachine({"bf16-mixed": 0.5, "channels_last": 0.99, "fused": 0.85})
    _patched(monkeypatch, machine)
    with caplog.at_level(logging.INFO, logger=RANK_ZERO):
        plan = autotune(
            DemoClassifier(width=4),
            _loader(),
            cache=False,
            clock=machine.clock,
            budget_s=2000.0,
            max_epochs=1,
            **kwargs,
        )
    return plan, _logged(caplog)


def _hand_built() -> TunePlan:
    """A plan with long notes, an in-fit precision trial and an optimizer race, both decided as after a fit."""
    trial = PrecisionTrial()
    trial.kept = "bf16-mixed"
    trial.ratio = (1.2, 1.3, 1.4)
    trial.note = "kept bf16-mixed: 1.30x faster per step [1.20, 1.40] in 3 rounds"
    race = OptimizerRace()
    race.winner = "muon"
    race.note = "muon kept: its loss was lower on every scored batch " + LONG
    race.notes = ["schedule_free not raced: its package is not installed"]
    choices = [
        Choice("precision", "in-fit trial", changed=True, note="timed on the fit's steps " + LONG),
        Choice("batch_size", 2, gain=2.5, interval=(2.3, 2.7), trials=3, note="batch x2: " + LONG, changed=True),
        Choice("ema", 0.99, gain=0.98, interval=(0.98, 0.98), trials=5, note="the EMA " + LONG, changed=True),
        Choice("optimization", "in-fit race", changed=True, note="OptimizerRace " + LONG),
        Choice("channels_last", False, trials=7, note="within noise"),
        Choice("data", "an option with a name far too long for its column " * 3, trials=3),
    ]
    notes = ["compile not tried: " + LONG, "batch_size not tried by default: " + LONG, "one more note"]
    return TunePlan({}, choices, callbacks=[trial, race], notes=notes, trial_s=1.25)


def test_autotune_logs_one_line_per_choice_within_120_columns(monkeypatch, caplog):
    plan, lines = _tune(monkeypatch, caplog)
    assert len(plan.choices) >= 3 and len(plan.notes) >= 2
    assert all(len(line) <= WIDTH for line in lines), lines
    assert lines == plan.to_text().splitlines() and len(lines) == 1 + len(plan.choices) + 1
    assert lines[0].startswith("autotune plan (") and f"{len(plan.choices)} choices, estimated " in lines[0]
    for choice, line in zip(plan.choices, lines[1:]):
        assert line.split()[0] == choice.name and f"{choice.gain:5.2f}x [" in line
        assert line.endswith("changed") if choice.changed else line.endswith("kept"), line
    assert lines[-1] == f"  {len(plan.notes)} notes: plan.explain() shows them and the reason for each choice"
    logged = _flat("\n".join(lines))
    assert not any(_flat(n) in logged for n in [*plan.notes, *(c.note for c in plan.choices if c.note)])


def test_verbose_logs_the_reasons_every_note_and_choice_note(monkeypatch, caplog):
    plan, lines = _tune(monkeypatch, caplog, verbose=True)
    assert lines[: len(plan.choices) + 2] == plan.to_text().splitlines()
    assert lines[len(plan.choices) + 2 :] == plan.explain().splitlines()
    logged = _flat("\n".join(lines))
    for note in [*plan.notes, *(c.note for c in plan.choices)]:
        assert _flat(note) in logged


def test_explain_holds_every_note_wrapped_with_a_hanging_indent():
    plan = _hand_built()
    text = plan.explain()
    assert all(len(line) <= WIDTH for line in text.splitlines()), text
    assert all(line.startswith(("  ", "      ")) for line in text.splitlines())
    flat = _flat(text)
    race = plan.callbacks[1]
    for note in [*plan.notes, *(c.note for c in plan.choices if c.note)]:
        assert _flat(note) in flat
    assert _flat(f"race: {race.note}") in flat and f"race: {race.notes[0]}" in flat
    assert f"PrecisionTrial: {plan.callbacks[0].note}" in flat
    assert "batch_size = x2: 2.50x [2.30, 2.70] in 3 rounds; batch x2:" in flat
    # unwrapped: one line per entry, each as it was (choices, notes, the fit's decisions)
    entries = plan.explain(width=None).splitlines()
    assert len(entries) == len(plan.choices) + len(plan.notes) + 3
    assert f"  race: {race.note}" in entries and f"  note: {plan.notes[0]}" in entries


def test_plan_text_says_what_each_choice_costs_or_kept_and_counts_the_notes():
    plan = _hand_built()
    lines = plan.to_text().splitlines()
    assert all(len(line) <= WIDTH for line in lines), lines
    assert lines[0] == f"autotune plan (1.2s of trials): 6 choices, estimated {plan.gain:.2f}x per step"
    assert lines[1].endswith("0 rounds  the fit kept bf16-mixed")
    assert lines[2].split()[:2] == ["batch_size", "x2"] and lines[2].endswith("3 rounds  changed")
    assert lines[3].endswith("5 rounds  changed, costs 2.0% per step")
    assert lines[4].endswith("the race kept muon")
    assert lines[5].endswith("7 rounds  kept") and lines[6].endswith("...")
    assert lines[7] == "  6 notes: plan.explain() shows them and the reason for each choice"  # 3 + the race's 2 + 1
    assert len(lines) == 1 + len(plan.choices) + 1
    # before the fit decides, the in-fit choices say where they are decided
    plan.callbacks = [PrecisionTrial(), OptimizerRace()]
    lines = plan.to_text().splitlines()
    assert lines[1].endswith("timed on the fit's first steps") and lines[4].endswith("raced on the fit's first steps")
    assert lines[-1].startswith("  3 notes: ")


def test_plan_text_without_notes_adds_no_notes_line():
    quiet = TunePlan({}, [Choice("channels_last", True, gain=1.3, interval=(1.2, 1.4), trials=3, changed=True)])
    assert quiet.to_text().splitlines()[1:] == [
        "  channels_last  True            1.30x [1.20, 1.40]  3 rounds  changed"
    ]
    assert quiet.explain() == "  channels_last = True: 1.30x [1.20, 1.40] in 3 rounds"
    reasons = TunePlan({}, [Choice("channels_last", False, trials=3, note="within noise")])
    assert reasons.to_text().splitlines()[-1] == "  plan.explain() shows the reason for each choice"
    assert TunePlan({}, []).to_text() == "autotune plan (0.0s of trials): 0 choices, estimated 1.00x per step"
    assert TunePlan({}, []).explain() == ""


def test_a_cached_plan_is_logged_the_same_way(monkeypatch, caplog, tmp_path):
    machine = FakeMachine({"bf16-mixed": 0.5})
    _patched(monkeypatch, machine)
    kw = dict(candidates=["precision"], budget_s=500.0, cache_dir=tmp_path, clock=machine.clock, max_epochs=1)
    autotune(DemoClassifier(width=4), _loader(), **kw)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger=RANK_ZERO):
        cached = autotune(DemoClassifier(width=4), _loader(), **kw)
    lines = _logged(caplog)
    assert cached.from_cache and lines == cached.to_text().splitlines()
    assert lines[0].startswith("autotune plan (cached): 1 choice, ") and len(lines) == 3


def test_no_logged_line_names_the_projects_targets(monkeypatch, caplog):
    machine = FakeMachine({"bf16-mixed": 0.5, "channels_last": 0.8})
    _patched(monkeypatch, machine)
    with caplog.at_level(logging.INFO, logger=RANK_ZERO):  # the default candidates and methods, every reason logged
        autotune(
            DemoClassifier(width=4),
            _loader(),
            cache=False,
            clock=machine.clock,
            verbose=True,
            budget_s=500.0,
            max_epochs=50,
        )
    logged = "\n".join(_logged(caplog)).lower()
    assert "choices, estimated" in logged and "note: " in logged
    for internal in ("target ratio", "not met", "1.5x target", "mission", "held-out", "speed target"):
        assert internal not in logged


@pytest.mark.parametrize("verbose", ["yes", 1, None])
def test_a_bad_verbose_is_refused_before_any_trial(monkeypatch, verbose):
    machine = FakeMachine({})
    _patched(monkeypatch, machine)
    message = f"`verbose`={verbose!r} is not supported. Allowed values: True, False."
    with pytest.raises(SpeedupConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        autotune(DemoClassifier(width=4), _loader(), cache=False, clock=machine.clock, verbose=verbose)
    assert machine.calls == 0
