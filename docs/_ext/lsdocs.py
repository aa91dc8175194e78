"""Sphinx extension for the lightning-speedups site: generated includes, checks and the ``bad-input`` directive.

At ``builder-inited`` it writes (into ``docs/_auto/``, git-ignored, rebuilt every build):

- ``measured/<technique>.md`` + ``.png``: the rows of the full-run measured table (``docs/_data/measured.json``, also
  in ``docs/evidence.md``) for that technique, and a chart of them;
- ``info/<technique>.md``: the facts of its technique registry record (``lightning_speedups._registry``);
- ``bench/*.png`` + ``bench/summary.md``: the charts and table of the committed bench JSON (``docs/_data/bench.json``,
  written by ``lightning-speedups bench --json``);
- ``api_index.md``: an autosummary of every public name: the ``__all__`` of the package and of each public subpackage
  (``PUBLIC_MODULES``);

and copies ``notebooks/*.ipynb`` into ``docs/notebooks/`` (myst-nb renders their stored outputs, no execution).

Checks (they warn, so ``-W`` fails the build): every public name is documented, every registered technique has its
page. A reference to an object under another import path (``lightning_speedups.optim.SpeedupMixin`` for the
documented ``lightning_speedups.SpeedupMixin``) resolves to where the object is documented; a deprecated top-level
path (``lightning_speedups.freeze``, moved to ``lightning_speedups.functional``) resolves to nothing, so a page that
still uses one fails the build.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import math
import os
import re
import sys
from pathlib import Path
from typing import Any

from docutils import nodes
from sphinx.application import Sphinx
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective

logger = logging.getLogger(__name__)

DOCS = Path(__file__).resolve().parents[1]
ROOT = DOCS.parent
AUTO = DOCS / "_auto"
BENCH_JSON = DOCS / "_data" / "bench.json"
MEASURED_JSON = DOCS / "_data" / "measured.json"

# The public namespaces: the package's top level and the subpackages a user imports from. Every name in their
# `__all__` is documented: on a page, or in the API page's "other public names" section.
PUBLIC_MODULES = (
    "lightning_speedups",
    "lightning_speedups.functional",
    "lightning_speedups.data",
    "lightning_speedups.measure",
    "lightning_speedups.optim",
    "lightning_speedups.autotune",
    "lightning_speedups.recipes",
    "lightning_speedups.settings",
    "lightning_speedups.tuner",
)


def public_names() -> list[tuple[str, str, Any]]:
    """(module, name, object) of every name in the ``__all__`` of the public namespaces, in ``PUBLIC_MODULES`` order."""
    out = []
    for module in PUBLIC_MODULES:
        mod = importlib.import_module(module)
        out += [(module, name, getattr(mod, name)) for name in mod.__all__]
    return out


# registered technique -> its page (docname) and the measured-table technique names it shows
TECHNIQUE_PAGES: dict[str, tuple[str, tuple[str, ...]]] = {
    "trainer_settings": ("trainer_settings", ("precision",)),
    "advisor": ("techniques/advisor", ("advisor",)),
    "batch_size_finder": ("techniques/batch_size_finder", ("batch_size_finder",)),
    "channels_last": ("techniques/channels_last", ("channels_last",)),
    "channels_last_trial": ("techniques/channels_last", ()),
    "compile": ("techniques/compile", ("compile",)),
    "optim": ("techniques/optim", ("optim",)),
    "schedule_free": ("techniques/optim", ()),
    "muon": ("techniques/optim", ()),
    "optimizer_race": ("techniques/optim", ()),
    "finetune": ("techniques/finetune", ("finetune",)),
    "lr_finder": ("techniques/lr_finder", ()),
    "pruning": ("techniques/pruning", ("pruning",)),
    "qat": ("techniques/qat", ("qat",)),
    "float8": ("techniques/float8", ()),
    "speed_flags": ("techniques/speed_flags", ()),
    "device_data": ("techniques/device_data", ("device_data",)),
    "recipes": ("techniques/recipes", ("recipe",)),
}


def _page(technique: str) -> tuple[str, tuple[str, ...]]:
    """(docname, measured-table technique names) of a registered technique; new techniques default to their own name."""
    return TECHNIQUE_PAGES.get(technique, (f"techniques/{technique}", (technique,)))


def _write_if_changed(path: Path, data: str | bytes) -> None:
    """Keep mtimes (and Sphinx's incremental build) stable when nothing changed."""
    raw = data.encode() if isinstance(data, str) else data
    if path.exists() and path.read_bytes() == raw:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(raw)
    os.replace(tmp, path)  # atomic: a build running at the same time never reads half a file


# ---------------------------------------------------------------- notebooks


def copy_notebooks() -> list[str]:
    target = DOCS / "notebooks"
    sources = sorted((ROOT / "notebooks").glob("*.ipynb"))
    for src in sources:
        _write_if_changed(target / src.name, src.read_bytes())
    for stale in target.glob("*.ipynb"):
        if not (ROOT / "notebooks" / stale.name).exists():
            stale.unlink()
    return [s.stem for s in sources]


# ---------------------------------------------------------------- measured table (docs/_data/measured.json)


def readme_measured() -> tuple[str, list[dict[str, str]]]:
    """The machine line and the rows of the full-run measured table (``docs/_data/measured.json``, also rendered in
    ``docs/evidence.md``)."""
    if not MEASURED_JSON.exists():
        logger.warning("docs/_data/measured.json is missing", type="lsdocs")
        return "", []
    payload = json.loads(MEASURED_JSON.read_text())
    machine = f"Machine: {payload['machine']}, {payload['date']}."
    return machine, [dict(zip(payload["columns"], row)) for row in payload["rows"]]


def _ratio(value: str) -> float:
    try:
        return float(value.rstrip("x"))
    except ValueError:
        return math.nan


def _speedup_chart(path: Path, labels: list[str], ratios: list[float], title: str) -> None:
    """Horizontal bars of "times faster" on a log axis centred on 1x (green: faster, gray: no speedup)."""
    import textwrap

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    labels = [textwrap.fill(lb, 48) for lb in labels]
    finite = [r for r in ratios if math.isfinite(r) and r > 0] or [1.0]
    lines = sum(lb.count("\n") + 1 for lb in labels)
    fig, ax = plt.subplots(figsize=(10, max(1.6, 0.3 * lines + 0.25 * len(labels) + 0.9)))
    ax.barh(
        range(len(labels)),
        [r - 1.0 if math.isfinite(r) else 0 for r in ratios],
        left=1.0,
        height=0.7,
        color=["tab:green" if r >= 1.05 else "tab:gray" for r in ratios],
    )  # bars grow from 1x either way
    ax.set_yticks(range(len(labels)), labels, fontsize=8)
    ax.axvline(1.0, color="black", lw=1)
    ax.set_xscale("log")
    ax.set_xlim(min(0.5, min(finite) / 1.5), max(2.0, max(finite) * 1.8))
    ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}x"))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("times faster than the baseline (same run, medians; log scale)", fontsize=9)
    ax.set_title(title, fontsize=10)
    for y, r in enumerate(ratios):
        if math.isfinite(r):
            ax.annotate(
                f"{r:.2f}x", (max(r, 1.0), y), xytext=(3, 0), textcoords="offset points", va="center", fontsize=8
            )
    ax.invert_yaxis()
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, metadata={"Software": None})
    plt.close(fig)
    _write_if_changed(path, buf.getvalue())


def write_measured_includes() -> None:
    machine, rows = readme_measured()
    out = AUTO / "measured"
    header = ["variant", "metric", "speedup", "acc base", "acc cand", "acc delta", "note"]
    from lightning_speedups._registry import list_techniques

    for technique in list_techniques():
        readme_names = _page(technique)[1]
        mine = [r for r in rows if r.get("technique") in readme_names]
        if not mine:
            body = "The measured table has no row for this technique.\n"
        else:
            body = (
                f"From the full bench run in {{doc}}`/evidence` ({machine.removeprefix('Machine: ').rstrip('.')}). "
                "Regenerate with `lightning-speedups bench`.\n\n"
                + "| "
                + " | ".join(header)
                + " |\n|"
                + "---|" * len(header)
                + "\n"
                + "".join("| " + " | ".join(r.get(h, "") for h in header) + " |\n" for r in mine)
            )
            chart = out / f"{technique}.png"
            _speedup_chart(
                chart,
                [r["variant"] for r in mine],
                [_ratio(r["speedup"]) for r in mine],
                f"{technique}: measured table (full bench run)",
            )
            body += (
                f"\n```{{figure}} /_auto/measured/{technique}.png\n:alt: speedups of {technique}\n\n"
                f"The rows above as a chart (green: faster than the baseline, gray: no speedup).\n```\n"
            )
        _write_if_changed(out / f"{technique}.md", body)


# ---------------------------------------------------------------- technique facts


def _xref(obj: Any) -> str:
    if obj is None:
        return "none"
    role = "py:class" if isinstance(obj, type) else "py:func"
    return f"{{{role}}}`~{obj.__module__}.{obj.__qualname__}`"


def write_technique_info() -> None:
    from lightning_speedups._registry import WAYS, get_technique, is_hardware_requirement, list_techniques

    public = {id(obj) for _, _, obj in public_names()}
    for name in list_techniques():
        info = get_technique(name)
        rows = [
            ("name", f"`{info.name}`"),
            ("summary", info.summary.replace("|", "/")),
            ("callback", _xref(info.callback)),
            ("functional", _xref(info.functional)),
            ("ways", "; ".join(f"{n}. {WAYS[n]}" for n in info.ways)),
            (
                "requires",
                ", ".join(
                    f"`{r}` ({'hardware' if is_hardware_requirement(r) else 'python module'})" for r in info.requires
                )
                or "nothing extra: runs anywhere",
            ),
            ("benchmark", f"`{info.bench}`" if info.bench else "none in `lightning-speedups bench`"),
        ]
        text = "| registry field | value |\n|---|---|\n" + "".join(f"| {k} | {v} |\n" for k, v in rows)
        _write_if_changed(AUTO / "info" / f"{name}.md", text)
        # the registry's functional entry, documented where it lives now (it may move between modules)
        fn = info.functional
        if fn is None or id(fn) in public:
            text = "" if fn is None else f"The registry's functional entry is {_xref(fn)}.\n"
        else:
            kind = "autoclass" if isinstance(fn, type) else "autofunction"
            text = (
                "The registry's functional entry:\n\n```{eval-rst}\n"
                f".. {kind}:: {fn.__module__}.{fn.__qualname__}\n```\n"
            )
        _write_if_changed(AUTO / "info" / f"{name}_functional.md", text)


# ---------------------------------------------------------------- bench JSON


def write_bench_includes() -> None:
    out = AUTO / "bench"
    if not BENCH_JSON.exists():
        _write_if_changed(out / "summary.md", "No `docs/_data/bench.json` is committed yet.\n")
        return
    from lightning_speedups.benchmarks._common import BenchRow
    from lightning_speedups.benchmarks.runner import format_markdown

    payload = json.loads(BENCH_JSON.read_text())
    rows = [BenchRow(**{k: v for k, v in r.items() if k != "accuracy_delta"}) for r in payload["rows"]]
    machine = payload["machine"]
    mode = "quick" if payload.get("quick") else "full"
    parts = [
        f"Mode: **{mode}** (`lightning-speedups bench{' --quick' if mode == 'quick' else ''}`).\n",
    ]
    by_technique: dict[str, list[Any]] = {}
    for r in rows:
        by_technique.setdefault(r.technique, []).append(r)
    _speedup_chart(
        out / "speedups.png",
        [f"{r.technique}: {r.variant}" for r in rows],
        [r.ratio for r in rows],
        f"all techniques, {mode} run",
    )
    parts.append("```{figure} /_auto/bench/speedups.png\n:alt: all speedups\n\nEvery row of the run.\n```\n")
    for technique, mine in by_technique.items():
        _speedup_chart(
            out / f"{technique}.png", [r.variant for r in mine], [r.ratio for r in mine], f"{technique}, {mode} run"
        )
        parts.append(f"## {technique}\n\n```{{image}} /_auto/bench/{technique}.png\n:alt: {technique} speedups\n```\n")
    curves = [r for r in rows if r.extra.get("curves")]
    if curves:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 4))
        for r in curves:
            for label, (times, accs) in r.extra["curves"].items():
                ax.plot(times, accs, marker=".", label=f"{r.technique}: {label}")
        ax.set_xlabel("wall-clock seconds")
        ax.set_ylabel("validation accuracy")
        ax.legend(fontsize=8)
        fig.tight_layout()
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=90, metadata={"Software": None})
        plt.close(fig)
        _write_if_changed(out / "accuracy_vs_time.png", buf.getvalue())
        parts.insert(
            2,
            "```{figure} /_auto/bench/accuracy_vs_time.png\n:alt: accuracy vs time\n\n"
            "Validation accuracy against wall-clock time, baseline and candidate.\n```\n",
        )
    parts.append("## The table\n\n" + format_markdown(rows, machine))
    if payload.get("errors"):
        parts.append(
            "\nBenchmarks that failed in this run: "
            + ", ".join(f"`{k}` ({v})" for k, v in payload["errors"].items())
            + "\n"
        )
    keep = {"speedups.png", "accuracy_vs_time.png", *(f"{t}.png" for t in by_technique)}
    for stale in out.glob("*.png"):  # charts of techniques no longer in the JSON
        if stale.name not in keep:
            stale.unlink()
    head = (
        f"Machine: {machine['cpu']}, {machine['cpu_count']} cores, {machine['torch_threads']} torch threads, "
        f"torch {machine['torch']}, device {machine['device']}.\n\n"
    )
    _write_if_changed(out / "summary.md", head + "\n".join(parts))


# ---------------------------------------------------------------- API index and checks


def _page_directives() -> list[str]:
    """The dotted paths that the hand-written pages document with an ``auto*::`` directive (a short name is read in
    the page's ``currentmodule`` at that point)."""
    paths = []
    for page in DOCS.rglob("*.md"):
        if "_build" in page.parts or "_auto" in page.parts:
            continue
        current = "lightning_speedups"
        for line in page.read_text().splitlines():
            if m := _CURRENT.match(line):
                current = m.group(1)
            elif m := _DIRECTIVE.match(line):
                name = m.group(2)
                paths.append(name if "." in name else f"{current}.{name}")
    return paths


def _autodoc_targets() -> set[int]:
    """ids of the objects that the hand-written pages document with an ``auto*::`` directive."""
    ids = set()
    for path in _page_directives():
        obj = _import_path(path)
        if obj is not None:
            ids.add(id(obj))
    return ids


def _autodoc_kind(obj: Any) -> str:
    if isinstance(obj, type) and issubclass(obj, BaseException):
        return "exception"
    if isinstance(obj, type):
        return "class"
    return "function" if callable(obj) else "data"


def write_api_index() -> None:
    """The table of every public name, namespace by namespace, and the autodoc of public names no page documents yet
    (so a name added to an ``__all__`` is documented from its docstring the day it is added; a missing docstring is a
    build warning)."""
    names = public_names()
    tables = []
    for module in PUBLIC_MODULES:
        mine = [(n, obj) for m, n, obj in names if m == module]
        rows = "\n".join(f"   {n}" for n, obj in mine if _autodoc_kind(obj) != "data")
        table = (
            f"## `{module}`\n\n```{{eval-rst}}\n.. currentmodule:: {module}\n\n.. autosummary::\n"
            f"   :nosignatures:\n\n{rows}\n```\n"
        )
        # constants: a summary line would be their type's docstring (a dict's), so they are listed by name
        constants = [f"{{py:data}}`~{module}.{n}`" for n, obj in mine if _autodoc_kind(obj) == "data"]
        if constants:
            table += f"\nConstants: {', '.join(constants)}.\n"
        tables.append(table)
    _write_if_changed(AUTO / "api_index.md", "\n".join(tables))
    on_pages = _autodoc_targets()
    rest: dict[str, list[str]] = {}
    for module, name, obj in names:
        if id(obj) in on_pages:
            continue
        on_pages.add(id(obj))  # once, under the first namespace that exports it
        kind = _autodoc_kind(obj)
        if kind == "data":  # a constant has no docstring of its own: show its value
            rest.setdefault(module, []).append(f".. py:data:: {name}\n   :value: {_value(obj)}\n")
            continue
        if not (getattr(obj, "__doc__", None) or "").strip():
            logger.warning(f"public name {module}.{name} has no docstring", type="lsdocs")
        rest.setdefault(module, []).append(f".. auto{kind}:: {name}")
    blocks = [f".. py:currentmodule:: {module}\n\n" + "\n".join(lines) for module, lines in rest.items()]
    text = (
        "```{eval-rst}\n" + "\n\n".join(blocks) + "\n```\n"
        if blocks
        else "Every public name is documented on a technique page or above.\n"
    )
    _write_if_changed(AUTO / "api_other.md", text)


_ROLE = re.compile(r":(?:py:)?(func|class|meth|attr|data|exc|obj|const|mod):`~?([\w.]+)`")
_DIRECTIVE = re.compile(r"^\s*\.\. auto(class|function|data|exception)::\s+([\w.]+)", re.M)
_CURRENT = re.compile(r"^\s*\.\. (?:py:)?currentmodule::\s+([\w.]+)")


def _is_ours(obj: Any) -> bool:
    return (getattr(obj, "__module__", "") or "").startswith("lightning_speedups") and callable(obj)


def _resolve_in(target: str, modules: list[str]) -> tuple[Any, str] | None:
    """The object a docstring reference names (tried as written, then in ``modules``), and its dotted path."""
    names = [target] + [f"{m}.{target}" for m in modules]
    if "." not in target:
        names += [f"{m}.{target}" for m in sorted(sys.modules) if m.startswith("lightning_speedups.")]
    for name in names:
        obj = _import_path(name)
        if obj is not None and not isinstance(obj, type(sys)):
            return obj, name
    return None


def _canonical(obj: Any, found_as: str) -> str:
    """The shortest public import path of ``obj`` (a module without ``_`` parts that re-exports it)."""
    name = getattr(obj, "__name__", found_as.rsplit(".", 1)[-1])
    public = [
        f"{m}.{name}"
        for m, mod in list(sys.modules.items())
        if m.startswith("lightning_speedups")
        and not any(p.startswith("_") for p in m.split("."))
        and getattr(mod, name, None) is obj
    ]
    defined = f"{getattr(obj, '__module__', '')}.{name}"
    if defined in public:
        return defined
    if public:  # a re-export: the functional/data/optim module rather than the callback that imports it
        return min(public, key=lambda p: (p.count("."), ".callbacks." in p, p))
    if hasattr(obj, "__qualname__") and hasattr(obj, "__module__"):
        return f"{obj.__module__}.{obj.__qualname__}"
    return found_as  # data (a tuple of allowed values): documented where the reference found it


def _value(obj: Any) -> str:
    if isinstance(obj, dict):  # a registry of functions: its keys are what a user passes
        return "{" + ", ".join(f"{k!r}: ..." for k in obj) + "}"
    return repr(obj)


def write_related() -> None:
    """Autodoc every object of this package that documented pages mention (in docstrings or type hints) but no page
    documents: result records, config types, helpers named in docstrings. Keeps nitpicky references resolvable while
    modules move."""
    import typing

    from lightning_speedups._registry import get_technique, list_techniques

    documented: set[int] = set()
    roots: list[Any] = [obj for _, _, obj in public_names()]  # on their pages or in the API page's "other" section
    documented.update(id(o) for o in roots)
    for path in _page_directives():
        obj = _import_path(path)
        if obj is not None:
            documented.add(id(obj))
            roots.append(obj)
    for name in list_techniques():
        fn = get_technique(name).functional
        if fn is not None:
            documented.add(id(fn))
            roots.append(fn)
    found: dict[int, tuple[Any, str, str]] = {}  # id -> (obj, dotted path, kind)
    modules_referenced: set[str] = set()
    queue = list(roots)
    seen: set[int] = set()
    while queue:
        obj = queue.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        members = [obj]
        if isinstance(obj, type):
            members += [v for k, v in vars(obj).items() if not k.startswith("_") or k == "__init__"]
            members = [getattr(m, "fget", m) for m in members]
        module = obj.__name__ if isinstance(obj, type(sys)) else getattr(obj, "__module__", "") or ""
        modules = [module, module.rsplit(".", 1)[0]] if module else []
        refs: list[tuple[str, str]] = []
        for m in members:
            refs += _ROLE.findall(getattr(m, "__doc__", None) or "")
            if callable(m):
                try:
                    hints = typing.get_type_hints(m)
                except Exception:
                    hints = {}
                for hint in hints.values():
                    for h in (hint, *typing.get_args(hint)):
                        for hh in (h, *typing.get_args(h)):
                            if isinstance(hh, type) and _is_ours(hh):
                                refs.append(("class", f"{hh.__module__}.{hh.__qualname__}"))
        for role, target in refs:
            if role in ("meth", "attr"):
                continue  # members of documented classes
            if role == "mod":
                new = target not in modules_referenced
                if target.startswith("lightning_speedups.") and target in sys.modules and new:
                    modules_referenced.add(target)
                    queue.append(sys.modules[target])  # its docstring's references too
                continue
            hit = _resolve_in(target, modules)
            if hit is None:
                continue
            ref_obj, path = hit
            if id(ref_obj) in documented or id(ref_obj) in found:
                continue
            if not (path.startswith("lightning_speedups") and _is_ours(ref_obj) or role in ("data", "const")):
                continue
            if not path.startswith("lightning_speedups") or any(p.startswith("_") for p in path.split(".")[-1:]):
                continue
            kind = (
                "exception"
                if isinstance(ref_obj, type) and issubclass(ref_obj, BaseException)
                else "class"
                if isinstance(ref_obj, type)
                else "function"
                if callable(ref_obj)
                else "data"
            )
            found[id(ref_obj)] = (ref_obj, _canonical(ref_obj, path), kind)
            queue.append(ref_obj)
    lines = ["```{eval-rst}"]
    by_module: dict[str, list[tuple[str, str]]] = {}
    for _obj, path, kind in found.values():
        by_module.setdefault(path.rsplit(".", 1)[0], []).append((path, kind))
    for module in sorted(by_module):
        lines += ["", module, "-" * len(module), "", f".. py:currentmodule:: {module}", ""]
        if module in modules_referenced:
            modules_referenced.discard(module)
            lines += [f".. automodule:: {module}", "   :no-members:", ""]
        for path, kind in sorted(by_module[module]):
            if kind == "data":  # a constant has no docstring of its own: show its value
                short = path.rsplit(".", 1)[1]
                lines += [f".. py:data:: {short}", f"   :value: {_value(_import_path(path))}", ""]
            else:
                lines.append(f".. auto{kind}:: {path}")
    for module in sorted(modules_referenced):
        lines += ["", module, "-" * len(module), "", f".. automodule:: {module}", "   :no-members:", ""]
    lines.append("```")
    _write_if_changed(AUTO / "related.md", "\n".join(lines) + "\n")


def _import_path(path: str) -> Any:
    """The object named by a dotted path, as Python reads it (an attribute before a submodule of the same name:
    ``lightning_speedups.autotune`` is the function), or None. None also for a deprecated path: a name that left a
    module's top level and is still served there, with a warning, by its ``__getattr__`` (the module's ``_MOVED``)."""
    parts = path.split(".")
    try:
        obj: Any = importlib.import_module(parts[0])
    except Exception:
        return None
    for i, attr in enumerate(parts[1:], start=1):
        if isinstance(obj, type(sys)) and attr in getattr(obj, "_MOVED", {}):
            return None
        try:
            obj = getattr(obj, attr)
            continue
        except AttributeError:
            pass
        try:  # the module under the shadowing attribute (`lightning_speedups.autotune.TunePlan`), or a submodule
            obj = getattr(importlib.import_module(".".join(parts[:i])), attr)
        except Exception:
            try:
                obj = importlib.import_module(".".join(parts[: i + 1]))
            except Exception:
                return None
    return obj


_IDENTITY: dict[int, str] = {}  # id(object) -> documented name; per process (ids do not survive a pickled env)


def _documented_by_identity(env: Any) -> dict[int, str]:
    if not _IDENTITY:
        for fullname in env.get_domain("py").objects:
            obj = _import_path(fullname)
            if obj is not None and not isinstance(obj, (int, float, str, bool, type(None))):
                _IDENTITY.setdefault(id(obj), fullname)
    return _IDENTITY


def resolve_alias(app: Sphinx, env: Any, node: Any, contnode: Any) -> Any:
    """Resolve a reference to a documented object under another import path (or a short name in a module)."""
    if node.get("refdomain") != "py":
        return None
    target = node["reftarget"]
    candidates = [target]
    module = node.get("py:module")
    cls = node.get("py:class")
    objects = env.get_domain("py").objects
    if cls and "." not in target:
        for name in (f"{module}.{cls}.{target}", f"lightning_speedups.{cls}.{target}"):
            if name in objects:
                return env.get_domain("py").resolve_xref(
                    env, node["refdoc"], app.builder, node["reftype"], name, node, contnode
                )
    if module and "." not in target:
        candidates.append(f"{module}.{target}")
    if "." not in target:
        # a short name in a docstring: the public package, then any of its loaded submodules
        candidates.append(f"lightning_speedups.{target}")
        candidates += [f"{m}.{target}" for m in sorted(sys.modules) if m.startswith("lightning_speedups.")]
    documented = _documented_by_identity(env)
    for cand in candidates:
        obj = _import_path(cand)
        if obj is None:
            continue
        name = documented.get(id(obj))
        if name is None or name == target:
            continue
        return env.get_domain("py").resolve_xref(
            env, node["refdoc"], app.builder, node["reftype"], name, node, contnode
        )
    return None


def check_public_names(app: Sphinx, env: Any) -> None:
    from lightning_speedups._registry import list_techniques

    documented = _documented_by_identity(env)
    objects = env.get_domain("py").objects
    for module, name, obj in public_names():
        if f"{module}.{name}" not in objects and id(obj) not in documented:
            logger.warning(f"public name {module}.{name} is not documented on any page", type="lsdocs")
    for technique in list_techniques():
        page = _page(technique)[0]
        if page not in env.found_docs:
            logger.warning(
                f"registered technique {technique!r} has no page docs/{page}.md. HINT: copy "
                "docs/techniques/channels_last.md, fill it in and list it in docs/techniques/index.md",
                type="lsdocs",
            )


# ---------------------------------------------------------------- bad-input directive


class BadInputDirective(SphinxDirective):
    """Run each line (a call with a bad argument) and show the ``SpeedupConfigError`` it raises, verbatim.

    The lines run at build time in a namespace holding every public name (``PUBLIC_MODULES``; and ``torch``, ``nn``);
    a line that does not raise ``SpeedupConfigError`` is a build warning, so the page cannot drift from the code.
    """

    has_content = True

    def run(self) -> list[nodes.Node]:
        import torch

        import lightning_speedups as ls

        ns: dict[str, Any] = {}
        for _, name, obj in reversed(public_names()):  # the top level wins a name two namespaces share
            ns[name] = obj
        ns.update(torch=torch, nn=torch.nn)
        out = []
        for line in self.content:
            if not line.strip():
                continue
            if line.startswith("# setup: "):
                exec(line.removeprefix("# setup: "), ns)
                continue
            try:
                with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                    exec(line, ns)
            except ls.SpeedupConfigError as err:
                out.append(f">>> {line}\nSpeedupConfigError: {err}")
            except Exception as err:  # the docs promise SpeedupConfigError for bad input
                logger.warning(
                    f"bad-input line {line!r} raised {type(err).__name__}: {err}",
                    location=self.get_location(),
                    type="lsdocs",
                )
            else:
                logger.warning(f"bad-input line {line!r} did not raise", location=self.get_location(), type="lsdocs")
        block = nodes.literal_block("\n\n".join(out), "\n\n".join(out))
        block["language"] = "pycon"
        return [block]


# ---------------------------------------------------------------- setup


def generate(app: Sphinx) -> None:
    _IDENTITY.clear()
    copy_notebooks()
    write_measured_includes()
    write_technique_info()
    write_bench_includes()
    write_api_index()
    write_related()
    placeholder = DOCS / "_generated" / "tested_architectures.md"
    if not placeholder.exists():
        _write_if_changed(placeholder, "*The tested-architectures table has not been generated yet.*\n")


def setup(app: Sphinx) -> dict[str, Any]:
    app.connect("builder-inited", generate)
    app.connect("missing-reference", resolve_alias)
    app.connect("env-check-consistency", check_public_names)
    app.add_directive("bad-input", BadInputDirective)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
