"""Plumbing shared by every command: atomic outputs, the console, progress bars."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from gac.errors import GacError

console = Console(stderr=True)
T = TypeVar("T")


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file and an atomic rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def atomic_dir(out: str | Path, overwrite: bool = False) -> Iterator[Path]:
    """Yield a temporary directory next to ``out``; rename it to ``out`` only on success.

    On any exception the temporary directory is removed, so no half-written output remains.
    """
    out = Path(out)
    if out.exists() and not overwrite and (not out.is_dir() or any(out.iterdir())):
        raise GacError(f"output {out} already exists and is not empty (pass --overwrite to replace it)")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp, out)


def progress() -> Progress:
    """A rich progress bar with count, elapsed time and ETA (prints to stderr)."""
    return Progress(
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("eta"),
        TimeRemainingColumn(),
        console=console,
        transient=False,
        disable=os.environ.get("GAC_NO_PROGRESS") == "1",
    )


def track(items: Iterable[T], description: str, total: int | None = None) -> Iterator[T]:
    """Iterate with a progress bar (ETA included)."""
    if total is None:
        try:
            total = len(items)  # type: ignore[arg-type]
        except TypeError:
            total = None
    with progress() as p:
        task = p.add_task(description, total=total)
        for x in items:
            yield x
            p.advance(task)


def resolve_device_dtype(device: str, dtype: str) -> tuple[str, Any]:
    """``auto`` device = CUDA when available, else CPU; ``auto`` dtype = bfloat16 on GPU, float32 on CPU."""
    import torch

    dev = ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device
    if dev.startswith("cuda") and not torch.cuda.is_available():
        raise GacError(f"device {dev} requested but CUDA is not available")
    dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if dtype == "auto":
        return dev, (torch.bfloat16 if dev.startswith("cuda") else torch.float32)
    if dtype not in dtypes:
        raise GacError(f"unknown dtype {dtype!r}; use auto, {', '.join(dtypes)}")
    return dev, dtypes[dtype]
