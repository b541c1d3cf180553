"""Running a kernel test's script under Triton's CPU interpreter, in a subprocess of its own."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

HAVE_TRITON = importlib.util.find_spec("triton") is not None
#: a test that runs a Triton kernel in the interpreter
needs_triton = pytest.mark.skipif(
    not HAVE_TRITON,
    reason="Triton is not installed (pip install triton): its CPU interpreter runs the kernel",
)


def pythonpath() -> str:
    """This checkout's ``src`` first, then the caller's ``PYTHONPATH``."""
    src = os.path.join(os.path.dirname(__file__), "..", "..", "src")
    return os.pathsep.join([os.path.abspath(src), os.environ.get("PYTHONPATH", "")])


def run_interpreted(code: str, threads: int = 2, timeout: float = 900) -> str:
    """Run ``code`` with ``TRITON_INTERPRET=1`` and no Inductor caches; assert it printed ``ok``.

    No caches: a cached compiled graph (its backward included) would hide a changed autograd formula.
    Returns the script's stdout.
    """
    env = {
        **os.environ,
        "TRITON_INTERPRET": "1",
        "OMP_NUM_THREADS": str(threads),
        "PYTHONPATH": pythonpath(),
        "TORCHINDUCTOR_FORCE_DISABLE_CACHES": "1",
    }
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.startswith("ok"), r.stdout[-3000:]
    return r.stdout
