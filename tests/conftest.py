"""Shared fixtures: a quiet Trainer factory, a clean working directory, deterministic seeds."""

from __future__ import annotations

import lightning as L
import pytest
import torch

from tests.helpers import quiet_trainer

# tiny test models run fastest on one thread, and DDP tests spawn 2 processes that would otherwise oversubscribe
torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _isolate(tmp_path, monkeypatch):
    """Each test runs in its own temporary directory and starts from the same seed."""
    monkeypatch.chdir(tmp_path)
    # Lightning stores the DDP port it picked in os.environ; a later DDP test reusing it can hit a port still in use
    monkeypatch.delenv("MASTER_PORT", raising=False)
    # recipes and autotune cache what they measured: per test, never in the user's ~/.cache
    monkeypatch.setenv("LIGHTNING_SPEEDUPS_CACHE", str(tmp_path / ".ls_cache"))
    L.seed_everything(0, workers=True, verbose=False)
    yield


@pytest.fixture
def trainer_factory():
    return quiet_trainer


def pytest_collection_modifyitems(config, items):
    cuda = torch.cuda.is_available()
    sm89 = cuda and torch.cuda.get_device_capability() >= (8, 9)
    for item in items:
        if "requires_cuda" in item.keywords and not cuda:
            item.add_marker(pytest.mark.skip(reason="requires_cuda: no CUDA GPU on this machine"))
        if "requires_sm89" in item.keywords and not sm89:
            item.add_marker(pytest.mark.skip(reason="requires_sm89: float8 needs CUDA compute capability >= 8.9"))
