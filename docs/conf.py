"""Sphinx configuration of the lightning-speedups site (furo theme, myst-nb for Markdown and notebooks).

Build: ``sphinx-build -W --keep-going -b html docs docs/_build/html`` (needs ``pip install -e ".[docs]"``).
"""

from __future__ import annotations

import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
sys.path.insert(0, str(DOCS / "_ext"))
sys.path.insert(0, str(DOCS.parent))

import lightning_speedups  # noqa: E402

project = "lightning-speedups"
author = "lightning-speedups contributors"
copyright = "lightning-speedups contributors"
release = version = lightning_speedups.__version__

extensions = [
    "myst_nb",  # Markdown pages (MyST) and .ipynb notebooks, rendered from their stored outputs
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",  # Google-style Args / Returns / Raises
    "lsdocs",  # docs/_ext/lsdocs.py: generated includes, public-name and technique-page checks, bad-input
]

source_suffix = {".rst": "restructuredtext", ".md": "myst-nb", ".ipynb": "myst-nb"}
root_doc = "index"
exclude_patterns = ["_build", "_auto", "_generated", "_data", "_ext", "**.ipynb_checkpoints", "Thumbs.db"]

# notebooks: render what is stored, never execute (tools/execute_notebooks.py executes them in place)
nb_execution_mode = "off"
nb_merge_streams = True
myst_enable_extensions = ["colon_fence", "deflist", "fieldlist"]
myst_heading_anchors = 3

# autodoc: signatures as written, types in the description, members in source order
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_typehints_description_target = "documented_params"
autodoc_default_options = {"members": True, "show-inheritance": True}
autodoc_class_signature = "separated"
autodoc_inherit_docstrings = False  # Lightning hook overrides (setup, on_fit_start, ...) stay out of the API pages
autosummary_generate = False
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False
napoleon_attr_annotations = True
add_module_names = False
python_use_unqualified_type_names = True

# Every reference into this package must resolve (nitpicky); names of other libraries cannot, because the site is
# built offline (no intersphinx inventories), so those are ignored by package prefix.
nitpicky = True
nitpick_ignore_regex = [
    (
        r"py:.*",
        r"(torch|lightning|pytorch_lightning|lightning_fabric|torchvision|torchmetrics|torchao|torch_pruning"
        r"|numpy|np|matplotlib|kornia|jsonargparse|typing_extensions|typing|collections|pathlib|os|types|dataclasses"
        r"|enum|abc|contextlib|argparse|io|timm|transformers)(\..*)?",
    ),
    # builtins and typing names that autodoc writes into signatures and descriptions
    (
        r"py:.*",
        r"(int|float|str|bool|bytes|dict|list|tuple|set|frozenset|object|type|callable|None|Any|Callable"
        r"|Iterable|Iterator|Sequence|Mapping|MutableMapping|Literal|Optional|Union|ClassVar|Protocol|Self"
        r"|Generator|TypeVar|T|ValueError|RuntimeError|ImportError|TypeError|KeyError|Exception|FileNotFoundError"
        r"|OSError|NotImplementedError|TimeoutError|MemoryError|AttributeError|IndexError|PathLike|Path|Module"
        r"|Tensor|Trainer|LightningModule|LightningDataModule|Callback|Optimizer|DataLoader|Dataset|device|dtype"
        r"|nn\..*|optional|default|function|iterable|sequence|mapping)",
    ),
    # string annotations written with the usual aliases: `import lightning as L`, matplotlib's `Figure`
    (r"py:.*", r"(L|F|v2)\..*|Figure|Axes"),
    # private names of this package (a private base class in show-inheritance, `_Candidate`, or one in a private
    # module, `_in_fit_trial.InFitTrial`): not documented by design
    (r"py:.*", r"lightning_speedups(\.\w+)*\._\w+(\.\w+)*"),
    # the inner modules of a technique's folder: its public names are documented where the folder re-exports them
    (
        r"py:.*",
        r"lightning_speedups\.(functional\.|callbacks\.)?(batch_size|advisor|autotune|measure|pruning)\.\w+\.\w+",
    ),
    # type aliases of this package (`Scheduler`, `DeviceLike`, `BackboneSpec`): unions of library types, not classes
    (r"py:.*", r"(lightning_speedups(\.\w+)*\.)?(Scheduler|DeviceLike|BackboneSpec|Factory|Rule|Batch)"),
]

html_theme = "furo"
html_title = f"lightning-speedups {release}"
html_static_path = ["_static"]
html_favicon = "_static/favicon.png"  # a local icon: the browser then asks for no /favicon.ico (a 404 in the console)
html_show_sourcelink = False
html_copy_source = False
html_theme_options = {"navigation_with_keys": True}
pygments_style = "friendly"
pygments_dark_style = "monokai"
