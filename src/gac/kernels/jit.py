"""Triton, where it is installed: ``triton``, ``tl`` and :data:`HAVE_TRITON` for every kernel file.

Triton is optional: only the GPU path needs it (and the CPU interpreter in tests).  Without it the
names are None and each kernel file defines no kernel (its ``if HAVE_TRITON:`` block is skipped); its
entry point raises, and the runtime switches nothing, saying why.
"""

from __future__ import annotations

from typing import Any

triton: Any
tl: Any
try:
    import triton
    import triton.language as tl

    HAVE_TRITON = True
except ImportError:  # pragma: no cover - depends on the install
    triton = tl = None
    HAVE_TRITON = False

__all__ = ["HAVE_TRITON", "tl", "triton"]
