"""Plumbing shared by every command: atomic outputs, the console, progress bars."""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
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
from gac.guard import atomic_dir, atomic_write_text, parse_device  # noqa: F401 - re-exported

console = Console(stderr=True)
T = TypeVar("T")


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

    dev = parse_device(device)
    dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if dtype == "auto":
        return dev, (torch.bfloat16 if dev.startswith("cuda") else torch.float32)
    if dtype not in dtypes:
        raise GacError(f"unknown dtype {dtype!r}; use auto, {', '.join(dtypes)}")
    return dev, dtypes[dtype]
