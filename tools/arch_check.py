"""The package's structure checks, with a verdict: import circles and arrows up the layers.

Stdlib only; reads code, runs nothing. It prints, and exits 1 when there is an error:

- an import circle between modules of the package (lazy imports inside functions count too);
- an import that goes up the layers of ``ARCHITECTURE.md`` (``functional`` importing ``callbacks``, ...).

It does not count lines: ``ruff format`` decides the layout, and a module is split where a natural seam is, never to
meet a number.

When the workspace's shared tool is there (``../shared/tools/arch_check.py`` next to the repository), its report is
printed first: private framework names outside ``_compat.py``, runtime modules importing the benchmarks, long
functions.

Usage: ``python tools/arch_check.py [PACKAGE_DIR]`` (default: ``lightning_speedups``).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "tools" / "arch_check.py"

# the top-level modules and packages of lightning_speedups on each layer of ARCHITECTURE.md, from the bottom (names
# starting with a prefix listed here, such as `_measure`, share its layer); modules not listed are not checked for
# arrows up
LAYER_MODULES: tuple[tuple[str, ...], ...] = (
    (
        "_errors",
        "_registry",
        "_compat",
        "_structure",
        "_inputs",
        "_rebuild",
        "_settings_vocab",
        "_heads",
        "_strategies",
        "_tokens",
    ),
    ("measure", "_measure", "_peak"),
    ("optim", "data", "demo"),
    ("functional",),
    ("settings",),
    ("callbacks",),
    ("recipes", "_recipe", "tuner", "autotune", "_autotune"),
    ("benchmarks",),
    ("cli",),
)
LAYERS: dict[str, int] = {name: layer for layer, names in enumerate(LAYER_MODULES) for name in names}


def layer_of(module: str) -> int | None:
    """The layer of a dotted module name (``lightning_speedups.functional.pruning`` -> 3); ``None`` if unplaced."""
    parts = module.split(".")
    if len(parts) < 2:
        return None  # the package's __init__ re-exports everything: it is above every layer
    top = parts[1]
    if top in LAYERS:
        return LAYERS[top]
    return next((n for name, n in LAYERS.items() if top.startswith(name + "_")), None)


def module_name(package: Path, path: Path) -> str:
    parts = list(path.relative_to(package.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(tree: ast.AST, here: str, is_package: bool) -> set[str]:
    """Every module and ``module.name`` this file imports, relative imports resolved."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = here.split(".") if is_package else here.split(".")[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            out.add(base)
            out.update(f"{base}.{alias.name}" for alias in node.names)
    return out


def import_graph(package: Path) -> dict[str, set[str]]:
    """``{module: modules of the package it imports}``; an edge to the package root (its re-exports) is left out."""
    files = {module_name(package, p): p for p in sorted(package.rglob("*.py"))}
    graph = {}
    for name, path in files.items():
        found = imports_of(ast.parse(path.read_text()), name, path.name == "__init__.py")
        graph[name] = {m for m in found if m in files and m != name and m != package.name}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def arrows_up(graph: dict[str, set[str]]) -> list[str]:
    """``"a (layer 3) -> b (layer 5)"`` for every import that goes up the layers."""
    out = []
    for module, targets in sorted(graph.items()):
        here = layer_of(module)
        for target in sorted(targets):
            there = layer_of(target)
            if here is not None and there is not None and there > here:
                out.append(f"{module} (layer {here}) -> {target} (layer {there})")
    return out


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    package = Path(args[0] if args else ROOT / "lightning_speedups").resolve()
    if SHARED.exists():  # the workspace's fuller report (it informs, it never fails)
        report = subprocess.run([sys.executable, str(SHARED), str(package)], capture_output=True, text=True)
        print(report.stdout.rstrip() + "\n")
    graph = import_graph(package)
    errors = 0
    for title, items in (
        ("import circles", [" <-> ".join(c) for c in circles(graph)]),
        ("imports up the layers", arrows_up(graph)),
    ):
        print(f"{title}: {len(items)}")
        print("".join(f"  {item}\n" for item in items), end="")
        errors += len(items)
    print("arch_check: " + ("FAILED" if errors else "ok"))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
