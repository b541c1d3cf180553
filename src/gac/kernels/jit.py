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


def cubin_resources(compiled: Any) -> dict[str, int]:
    """Registers a thread, stack bytes a thread (register spills past the ABI's frame) and shared bytes a block of a
    kernel Triton compiled (``triton.compile``'s result, for any target: no GPU is needed), read from its cubin by the
    ``cuobjdump`` Triton ships."""
    import re
    import subprocess
    import tempfile
    from pathlib import Path

    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.TemporaryDirectory() as d:
        cubin = Path(d) / "k.cubin"
        cubin.write_bytes(compiled.asm["cubin"])
        out = subprocess.run([str(tool), "--dump-resource-usage", str(cubin)], capture_output=True, text=True,
                             check=True).stdout  # fmt: skip
    m = re.search(r"REG:(\d+) STACK:(\d+)", out)
    if m is None:
        raise RuntimeError(f"cuobjdump gave no resource usage: {out[:200]!r}")
    return {"registers": int(m[1]), "stack_bytes": int(m[2]), "shared_bytes": int(compiled.metadata.shared)}


__all__ = ["HAVE_TRITON", "cubin_resources", "tl", "triton"]
