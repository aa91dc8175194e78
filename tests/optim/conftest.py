"""Tiny tensors: one intra-op thread is faster than two and immune to OpenMP spin-waits on a busy machine."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
