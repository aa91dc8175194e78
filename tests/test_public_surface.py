"""The public surface: a small top level, the rest in its subpackage, and the old top-level paths kept for one release
with a ``DeprecationWarning`` that names the new one."""

from __future__ import annotations

import ast
import importlib
import json
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import lightning_speedups as ls

ROOT = Path(__file__).resolve().parents[1]
MAX_TOP_LEVEL = 40

# the top level of the release before the split (its `__all__`): each name is still public, or still served with a
# warning, so no import that worked then fails now
OLD_TOP_LEVEL = """
AdvisorReport BatchAugment BatchSizeSearchResult ChannelsLast ChannelsLastTrial DeviceDataLoader EMA FastSchedule
Finding FineTuneConfig FineTuneFreezing Float8Training LRFinder LabelSmoothing LengthGroupedSampler MaskPruning Muon
OptimizerConfig OptimizerRace PackedBatchSampler PeakEstimate PrecisionTrial ProgressiveResizing Pruning
QuantizationAwareTraining Recipe ScheduleFreeSwitch SchedulerConfig SequenceBatching SequenceLoader SpeedAdvisor
SpeedFlags SpeedupConfigError SpeedupMixin SpeedupRuntimeError StructuredPruning TechniqueInfo
ThroughputBatchSizeFinder TokenBudgetBatchSampler TokenThroughput TorchCompile TrainerSettings TunePlan
apply_channels_last apply_label_smoothing autotune compile_model compute_mean_std cpu_bf16_is_fast create_ema_model
create_fast_schedule create_optimizer create_scheduler device_peak_flops diagnose enable_speed_flags
estimate_cpu_peak_flops explain_trainer_settings fast_finetune fast_train find_batch_size find_head freeze get_recipe
get_technique layer_groups list_candidates list_optimizers list_recipes list_schedulers list_techniques
load_checkpoint load_pretrained load_pruned load_quantized pack_collate pack_sequences packed_attention_mask
pad_collate plot_lr_schedule progressive_scale prune_structured prune_unstructured quantize_for_inference
recompute_batchnorm register_optimizer register_scheduler register_technique replace_head resize_batch save_pruned
save_quantized scale_lr schedule_free_eval schedule_free_train smooth_labels sparsity_report suggest_lr to_tensors
trainer_settings uncompile_model unfreeze
""".split()

SUBPACKAGES = ("functional", "data", "measure", "optim", "recipes", "settings", "tuner")


def test_top_level_is_small():
    assert len(ls.__all__) <= MAX_TOP_LEVEL, (
        f"lightning_speedups.__all__ has {len(ls.__all__)} names (at most {MAX_TOP_LEVEL}): the top level holds what a "
        "Lightning user adds (callbacks, autotune, settings, the mixin and configs, load_checkpoint, errors); put the "
        "rest in its subpackage"
    )
    assert len(set(ls.__all__)) == len(ls.__all__), "a name is listed twice in __all__"


def test_every_public_name_imports_without_a_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for name in ls.__all__:
            exec(f"from lightning_speedups import {name}", {})
            assert getattr(ls, name) is not None
        namespace: dict = {}
        exec("from lightning_speedups import *", namespace)
    assert set(ls.__all__) <= set(namespace)
    assert not set(ls.__all__) & set(ls._MOVED), "a public name is also listed as moved"


def test_every_old_name_still_imports():
    assert len(OLD_TOP_LEVEL) == 102
    lost = set(OLD_TOP_LEVEL) - set(ls.__all__) - set(ls._MOVED)
    assert not lost, f"these names of the last release import from nowhere at the top level: {sorted(lost)}"


@pytest.mark.parametrize("name", sorted(ls._MOVED))
def test_moved_name_warns_and_is_the_same_object(name: str):
    module = ls._MOVED[name]
    new = getattr(importlib.import_module(module), name)
    if not module.endswith("._registry"):  # the registry is internal: no __all__ promise
        assert name in importlib.import_module(module).__all__, f"{module} does not export {name} in its __all__"
    message = f"lightning_speedups.{name} is deprecated; import it from {module}"
    with pytest.warns(DeprecationWarning, match=re.escape(message)) as record:
        old = getattr(ls, name)
    assert old is new
    assert record[0].filename == __file__, "the warning should point at the caller (stacklevel=2)"
    with pytest.warns(DeprecationWarning, match=re.escape(message)):
        namespace: dict = {}
        exec(f"from lightning_speedups import {name}", namespace)
    assert namespace[name] is new


def test_dir_lists_the_public_names_and_subpackages():
    names = dir(ls)
    assert set(ls.__all__) <= set(names)
    assert set(SUBPACKAGES) <= set(names)
    assert not set(ls._MOVED) & set(names), "dir() offers deprecated names"
    assert [n for n in names if n.startswith("_")] == ["__version__"]
    assert names == sorted(names)
    for sub in SUBPACKAGES:  # reachable as attributes after a plain `import lightning_speedups`
        assert getattr(ls, sub) is importlib.import_module(f"lightning_speedups.{sub}")


def test_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="module 'lightning_speedups' has no attribute 'freez'"):
        ls.freez  # noqa: B018
    assert not hasattr(ls, "freez")
    with pytest.raises(ImportError, match="freez"):
        exec("from lightning_speedups import freez", {})


def test_subpackages_export_what_they_define():
    for sub in SUBPACKAGES:
        module = importlib.import_module(f"lightning_speedups.{sub}")
        missing = [n for n in module.__all__ if not hasattr(module, n)]
        assert not missing, f"lightning_speedups.{sub}.__all__ lists names it does not have: {missing}"


def test_import_and_old_paths_stay_lean():
    """Importing the package, and resolving every old path, warns about nothing of its own and imports no optional
    package (the resolution is lazy: it only looks the name up in its subpackage)."""
    code = (
        "import sys, warnings, torch, lightning\n"
        "baseline = set(sys.modules)\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        "    import lightning_speedups as ls\n"
        "own = [str(w.message) for w in caught if 'lightning_speedups' in str(w.message)]\n"
        "assert not own, own\n"
        "with warnings.catch_warnings():\n"
        "    warnings.simplefilter('ignore', DeprecationWarning)\n"
        "    for name in ls._MOVED:\n"
        "        getattr(ls, name)\n"
        "added = set(sys.modules) - baseline\n"
        "optional = ('torchao', 'torch_pruning', 'matplotlib', 'kornia', 'sklearn', 'schedulefree')\n"
        "bad = [m for m in optional if m in added]\n"
        "assert not bad, bad\n"
        "assert not torch.cuda.is_initialized()\n"
        "print('lean')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert "lean" in proc.stdout


# ---------------------------------------------------------------- no code of the project uses an old path


def _python_sources() -> list[tuple[str, str]]:
    """(where, source) of every Python file of the project and every code cell of its notebooks."""
    out = []
    for folder in ("lightning_speedups", "tests", "benchmarks", "tools", "docs/_ext"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            out.append((str(path.relative_to(ROOT)), path.read_text(encoding="utf-8")))
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        for i, cell in enumerate(json.loads(path.read_text(encoding="utf-8"))["cells"]):
            if cell["cell_type"] == "code":
                source = "".join(cell["source"])
                source = "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines())
                out.append((f"{path.relative_to(ROOT)} cell {i}", source))
    return out


def _old_paths_in(source: str) -> list[str]:
    tree = ast.parse(source)
    aliases = {
        a.asname or a.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for a in node.names
        if a.name == "lightning_speedups"
    }
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "lightning_speedups" and not node.level:
            found += [f"line {node.lineno}: from lightning_speedups import {a.name}" for a in node.names]
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
            found.append(f"line {node.lineno}: {node.value.id}.{node.attr}")
    return [f for f in found if f.rsplit(" ", 1)[-1].rsplit(".", 1)[-1] in ls._MOVED]


def test_no_old_path_in_code_notebooks_or_docs():
    used = []
    for where, source in _python_sources():
        if where == "tests/test_public_surface.py":
            continue  # this file uses the old paths on purpose
        used += [f"{where} {hit}" for hit in _old_paths_in(source)]
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "docs").glob("*/*.md"))]
    old = re.compile(r"(?<![\w.])lightning_speedups\.(\w+)\b|from lightning_speedups import \(?([\w, \n]+)")
    for page in pages:
        if "_auto" in page.parts or "_generated" in page.parts:
            continue
        for match in old.finditer(page.read_text(encoding="utf-8")):
            names = [match.group(1)] if match.group(1) else re.findall(r"\w+", match.group(2))
            used += [f"{page.relative_to(ROOT)}: {match.group(0).strip()}" for n in names if n in ls._MOVED]
    assert not used, "old top-level paths (import them from their subpackage):\n" + "\n".join(used)
