"""Hard faults: a training process killed with SIGKILL mid-epoch resumes from its last checkpoint.

For each stateful technique, the resumed run ends with the same weights as a run stopped cleanly at the same step
and resumed from its checkpoint (the kill leaves a complete checkpoint and nothing the resume depends on in memory).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


def _worker(*args: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    return subprocess.Popen(
        [sys.executable, "-m", "tests.faults.worker", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def _run(*args: str) -> None:
    proc = _worker(*args)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]


@pytest.mark.slow
@pytest.mark.parametrize("technique", ["pruning", "freezing", "qat", "batch_size"])
def test_sigkill_mid_epoch_resumes_like_a_clean_stop(tmp_path, technique):
    pytest.importorskip("torch_pruning" if technique == "pruning" else "torch")
    if technique == "qat":
        pytest.importorskip("torchao")
    killed = tmp_path / "killed"
    clean = tmp_path / "clean"
    killed.mkdir(), clean.mkdir()
    proc = _worker(technique, str(killed), "kill")
    deadline = time.monotonic() + 300
    while not (killed / "ready").exists():
        assert proc.poll() is None, proc.stderr.read()[-3000:] if proc.stderr else "worker exited"
        assert time.monotonic() < deadline, "the worker never reached the kill point"
        time.sleep(0.2)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    ckpt = killed / "ckpts" / "step=6.ckpt"
    assert ckpt.exists(), sorted(p.name for p in (killed / "ckpts").iterdir())
    _run(technique, str(killed), f"resume={ckpt}")
    _run(technique, str(clean), "stop")
    _run(technique, str(clean), f"resume={clean / 'ckpts' / 'step=6.ckpt'}")
    after_kill = torch.load(killed / "final.pt", weights_only=True)
    after_stop = torch.load(clean / "final.pt", weights_only=True)
    assert after_kill.keys() == after_stop.keys()
    for key in after_kill:
        torch.testing.assert_close(after_kill[key], after_stop[key], msg=key)
