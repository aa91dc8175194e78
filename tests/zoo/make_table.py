"""Regenerate the README's "Tested architectures" table from the zoo (tests/zoo).

Usage::

    python tests/zoo/make_table.py                       # runs the zoo (pytest tests/zoo), then prints the table
    python tests/zoo/make_table.py -- -m "not slow"      # extra pytest arguments after --
    python tests/zoo/make_table.py --json results.json   # render a results file instead of running
    python tests/zoo/make_table.py --footnotes            # refusal reasons as numbered notes under the table
    LS_ZOO_RESULTS=results.json pytest tests/zoo -q -p no:cacheprovider   # how such a file is written

Each cell reads ``works`` (trained 2 epochs, reloaded with ``load_checkpoint`` to the same outputs, resumed to the same
weights), ``refused: <reason>`` (``setup()`` refused the combination with the reason, before any step, model
unchanged), ``fails (<checks>)`` (it does not conform yet; ``--failures`` prints the errors), or ``-`` (not run).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def run_zoo(pytest_args: list[str]) -> dict[str, Any]:
    """Run the zoo in a subprocess with ``LS_ZOO_RESULTS`` set and return the results it wrote."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "zoo.json"
        env = {**os.environ, "LS_ZOO_RESULTS": str(path)}
        cmd = [sys.executable, "-m", "pytest", "tests/zoo", "-q", "-p", "no:cacheprovider", *pytest_args]
        print("running:", " ".join(cmd), file=sys.stderr)
        subprocess.run(cmd, cwd=ROOT, env=env, check=False)  # failing cells are results, not errors
        if not path.exists():
            raise SystemExit("the zoo run wrote no results (did pytest crash before the end of the session?)")
        return json.loads(path.read_text())


def _reason(outcome: str, width: int = 48) -> str:
    msg = re.sub(r"^refused:\s*(SpeedupConfigError:\s*)?", "", outcome)
    msg = re.sub(r"^`\w+`:\s*", "", msg)  # "`Float8Training`: float8 training needs ..." -> "float8 training ..."
    msg = msg.split(" HINT:")[0]
    first = re.split(r"(?<=[a-z0-9)`'\]])\. ", msg)[0].rstrip(".")
    if len(first) > width:
        first = first[:width].rsplit(" ", 1)[0].rstrip(",;:") + " …"
    return first.replace("|", "\\|")


def cell_text(entry: dict[str, Any] | None, width: int = 48) -> str:
    """The table text of one cell from its results entry (refusal reasons cut to ``width`` characters)."""
    if entry is None or "fit" not in entry.get("checks", {}):
        tests = (entry or {}).get("tests", {})
        skipped = [t["message"] for t in tests.values() if t["outcome"] == "skipped"]
        return f"skipped: {_reason(skipped[0], 40)}" if skipped else "-"
    checks = entry["checks"]
    failed = [name for name, status in checks.items() if status.startswith("fail")]
    outcome = entry.get("outcome", "")
    wording = checks.get("fit", "").startswith("fail: message does not name the module (") and ";" not in checks["fit"]
    if failed == ["fit"] and wording and outcome.startswith("refused"):  # right refusal, message to complete
        return f"refused: {_reason(outcome, width)} (message lacks the module name)"
    if failed:
        return f"fails ({', '.join(failed)})"
    if outcome.startswith("refused"):
        return f"refused: {_reason(outcome, width)}"
    if outcome.startswith("works ("):  # quantize_for_inference: which int8 path won is a timing, machine-dependent
        return "works"
    unchecked = [name for name in ("resume", "reload") if not checks.get(name, "").startswith("ok")]
    return "works" if not unchecked else f"works ({', '.join(unchecked)} not checked)"


class _Notes:
    """Footnote numbers for long refusal reasons (``--footnotes``): each distinct reason is written once."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.reasons = {}  # type: ignore[var-annotated]

    def __call__(self, text: str) -> str:
        m = re.match(r"^refused: (.*?)( \(message lacks the module name\))?$", text)
        if not self.enabled or m is None:
            return text
        n = self.reasons.setdefault(m.group(1), len(self.reasons) + 1)
        return f"refused [{n}]" + ("*" if m.group(2) else "")

    def lines(self) -> list[str]:
        if not self.reasons:
            return []
        out = ["", "Refusal reasons (`*`: the message does not name the module yet):", ""]
        return out + [f"[{n}] {reason}  " for reason, n in self.reasons.items()]


LEGEND = (
    "`works`: trained 2 epochs, reloaded to the same outputs, resumed to the same weights; `refused`: refused "
    "at setup with the reason, before any step, model unchanged; `fails (...)`: does not conform yet (the "
    "checks that fail); `-`: not run on this row."
)


def render(results: dict[str, Any], footnotes: bool = False) -> str:
    note = _Notes(footnotes)
    width = 160 if footnotes else 48
    cells: dict[str, Any] = results["cells"]
    archs = dict(results["archs"])  # [[name, source], ...] in the zoo's order
    notes = dict(results.get("techs") or [])  # [[name, what the column runs], ...]
    techs = list(notes) or sorted({e["tech"] for e in cells.values() if "tech" in e})
    by_key = {(e.get("arch"), e.get("tech")): e for e in cells.values()}
    lines = ["| architecture | " + " | ".join(f"`{t}`" for t in techs) + " |", "|---|" + "---|" * len(techs)]
    for arch, source in archs.items():
        row = [note(cell_text(by_key.get((arch, t)), width)) for t in techs]
        lines.append(f"| `{arch}`: {source} | " + " | ".join(row) + " |")
    legend = [f"- `{t}`: {notes[t]}" for t in techs if notes.get(t)]
    lines += [""] + legend if legend else []
    combos = results.get("combos") or []  # [[name, [archs]], ...]: several techniques in one fit, a few rows
    if combos:
        rows = [a for a in archs if any(a in c_archs for _, c_archs in combos)]
        header = "| architecture | " + " | ".join(f"`{c}`" for c, _ in combos) + " |"
        lines += ["", "Techniques combined in one fit:", "", header, "|---|" + "---|" * len(combos)]
        for arch in rows:
            row = [note(cell_text(by_key.get((arch, c)), width)) if arch in c_archs else "-" for c, c_archs in combos]
            lines.append(f"| `{arch}` | " + " | ".join(row) + " |")
    return "\n".join([LEGEND, "", *lines, *note.lines()])


def failures(results: dict[str, Any]) -> str:
    out = []
    for cid, entry in results["cells"].items():
        for check, status in entry.get("checks", {}).items():
            if status.startswith("fail"):
                out.append(f"- `{cid}` {check}: {status[len('fail: ') :]}")
    return "\n".join(out) or "(no failing checks)"


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    pytest_args = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, help="render this results file instead of running the zoo")
    parser.add_argument("--failures", action="store_true", help="also list every failing check with its error")
    parser.add_argument("--footnotes", action="store_true", help="numbered refusal reasons under the table")
    args = parser.parse_args(argv)
    results = json.loads(args.json.read_text()) if args.json else run_zoo(pytest_args)
    print(render(results, footnotes=args.footnotes))
    if args.failures:
        print("\n" + failures(results))


if __name__ == "__main__":
    main()
