"""Shared fixtures and tiers: fast by default; ``-m slow`` for SmolLM2; ``gpu`` skips without CUDA."""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("GAC_NO_PROGRESS", "1")
os.environ.setdefault("MPLBACKEND", "Agg")

# One intra-op thread: the test models are tiny, and on a shared 2-core machine two OpenMP
# threads competing with another process make small SVDs ~100x slower (measured: a 1536x576
# SVD took 0.12 s on one thread and 15.9 s on two while another job held a core).
torch.set_num_threads(1)


def pytest_collection_modifyitems(config, items):
    if not torch.cuda.is_available():
        skip = pytest.mark.skip(reason="needs CUDA")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
