"""Zoo plumbing: run each cell's tests back to back, guard memory, and write results JSON when asked.

``LS_ZOO_RESULTS=path.json`` makes the session write every cell's observed outcome and check statuses there
(``tests/zoo/make_table.py`` turns it into the README table). ``LS_ZOO_MAX_RSS_MB`` (default 6000, 0 = off) stops the
run with a clear message if the process grows past it during a zoo test (a technique that blows memory on one
architecture must not take the machine down; it cannot be caught inside the test, so the run ends).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path

import pytest

_CHECK_ORDER = {"test_zoo": 0, "test_zoo_resume": 1, "test_zoo_reload": 2}


def pytest_collection_modifyitems(config, items):
    """Within the zoo, order items cell by cell (fit, resume, reload) so one fit serves the three checks."""
    from tests.zoo.cells import CELLS

    order = {c.id: i for i, c in enumerate(CELLS)}
    idx = [i for i, it in enumerate(items) if it.get_closest_marker("zoo") is not None]

    def key(it):
        cell = it.callspec.id if hasattr(it, "callspec") else ""
        return order.get(cell, len(order)), _CHECK_ORDER.get(it.originalname, 9)

    for i, it in zip(idx, sorted((items[i] for i in idx), key=key)):
        items[i] = it


_IN_ZOO_TEST = threading.Event()  # the watchdog only acts while a zoo test runs (other suites share the session)


def _watchdog(limit_mb: int) -> None:
    import psutil

    proc = psutil.Process()
    while True:
        rss = proc.memory_info().rss / 2**20
        if rss > limit_mb and _IN_ZOO_TEST.is_set():
            capture = _CONFIG[0].pluginmanager.getplugin("capturemanager") if _CONFIG else None
            if capture is not None:  # pytest captures fd 2: let the message reach the terminal
                capture.suspend_global_capture(in_=False)
            sys.stderr.write(
                f"\n[zoo] RSS {rss:.0f} MiB > LS_ZOO_MAX_RSS_MB={limit_mb}: aborting the run "
                f"(current test: {os.environ.get('PYTEST_CURRENT_TEST')})\n"
            )
            sys.stderr.flush()
            os._exit(99)
        time.sleep(0.2)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    zoo = item.get_closest_marker("zoo") is not None
    if zoo:
        _start_watchdog()
        _IN_ZOO_TEST.set()
    try:
        yield
    finally:
        _IN_ZOO_TEST.clear()


_WATCHDOG: list[threading.Thread] = []
_CONFIG: list[pytest.Config] = []


def pytest_configure(config):
    _CONFIG.append(config)


def _start_watchdog() -> None:
    limit = int(os.environ.get("LS_ZOO_MAX_RSS_MB", "6000"))
    if limit > 0 and not _WATCHDOG:
        _WATCHDOG.append(threading.Thread(target=_watchdog, args=(limit,), daemon=True, name="zoo-rss-watchdog"))
        _WATCHDOG[0].start()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if item.get_closest_marker("zoo") is None or not hasattr(item, "callspec"):
        return
    if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
        from tests.zoo.cells import RESULTS

        entry = RESULTS.setdefault(item.callspec.id, {"checks": {}})
        msg = ""
        if report.outcome == "skipped" and isinstance(report.longrepr, tuple):
            msg = str(report.longrepr[2])
        elif report.outcome == "failed":
            msg = str(getattr(report.longrepr, "reprcrash", None) and report.longrepr.reprcrash.message)
        entry.setdefault("tests", {})[item.originalname] = {
            "outcome": report.outcome,
            "message": msg[:500],
            "duration_s": round(report.duration, 2),
        }


def pytest_sessionfinish(session, exitstatus):
    path = os.environ.get("LS_ZOO_RESULTS")
    if not path:
        return
    from tests.zoo.cells import CELLS, RESULTS
    from tests.zoo.models import ARCHS
    from tests.zoo.techniques import TECHNIQUES, expected

    ids = {c.id: c for c in CELLS}
    for cid, entry in RESULTS.items():
        if cid in ids:
            entry.update(arch=ids[cid].arch, tech=ids[cid].tech, expected=str(expected(ids[cid].arch, ids[cid].tech)))
    out = {
        "archs": [[a.name, a.source] for a in ARCHS.values()],
        "techs": [[t.name, t.note] for t in TECHNIQUES.values() if not t.combo],
        "combos": [[t.name, list(t.archs or ARCHS)] for t in TECHNIQUES.values() if t.combo],
        "cells": RESULTS,
    }
    Path(path).write_text(json.dumps(out, indent=1, sort_keys=True))
