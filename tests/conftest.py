"""Shared fixtures and tiers: fast by default; ``-m slow`` for SmolLM2; ``gpu`` skips without CUDA."""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("GAC_NO_PROGRESS", "1")
os.environ.setdefault("MPLBACKEND", "Agg")


def pytest_collection_modifyitems(config, items):
    if not torch.cuda.is_available():
        skip = pytest.mark.skip(reason="needs CUDA")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
