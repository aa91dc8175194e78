"""Importing the package must stay lean: no optional heavy packages, no CUDA initialisation."""

from __future__ import annotations

import subprocess
import sys


def test_import_is_lean():
    # torchmetrics (a Lightning dependency) itself imports matplotlib whenever it is installed, so matplotlib is
    # only counted against us if `import lightning` alone did not already bring it in.
    code = (
        "import sys, torch, lightning\n"
        "baseline = set(sys.modules)\n"
        "import lightning_speedups\n"
        "added = set(sys.modules) - baseline\n"
        "optional = ('torchao', 'torch_pruning', 'matplotlib', 'kornia', 'sklearn', 'schedulefree')\n"
        "bad = [m for m in optional if m in added]\n"
        "assert not bad, bad\n"
        "assert not torch.cuda.is_initialized()\n"
        "print('lean')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "lean" in proc.stdout
