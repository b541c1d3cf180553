"""Tiny models run faster on one thread: on a busy 2-core machine, multi-threaded BLAS/LAPACK calls
on small matrices spin and can take orders of magnitude longer."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
