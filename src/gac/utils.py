"""Plumbing shared by every command: atomic outputs, the console, progress bars."""

from __future__ import annotations

import contextlib
import io
import os
import sys
import time
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
from gac.guard import atomic_dir, atomic_write_text, parse_device  # noqa: F401 - re-exported

console = Console(stderr=True)
#: Results (the report tables a command exists to print) go to stdout; progress and notes to stderr.
out_console = Console()
T = TypeVar("T")


def cache_root() -> Path:
    """The gac cache directory: ``$GAC_CACHE`` or ``~/.cache/gac`` (models, dispatch tables)."""
    return Path(os.environ.get("GAC_CACHE") or Path.home() / ".cache" / "gac").expanduser()


def quiet_hf() -> contextlib.AbstractContextManager[Any]:
    """Silence transformers' own progress bars (gac prints its own); ``GAC_VERBOSE=1`` keeps its stderr."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    return (
        contextlib.redirect_stderr(io.StringIO())
        if os.environ.get("GAC_VERBOSE") != "1"
        else contextlib.nullcontext()
    )


def _fmt_s(s: float) -> str:
    s = int(round(s))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


class PlainProgress:
    """Progress for logs (stderr is not a terminal): plain lines instead of a live bar.

    One line when a task starts (with its total: the work estimate), then at most one line every
    ``GAC_PROGRESS_INTERVAL`` seconds (default 30) with the count, percent, elapsed time and ETA,
    and one when it ends. Same ``add_task`` / ``advance`` / ``update`` calls as rich's Progress.
    """

    def __init__(self, interval: float | None = None) -> None:
        self.interval = float(os.environ.get("GAC_PROGRESS_INTERVAL", 30)) if interval is None else interval
        self.tasks: dict[int, dict[str, Any]] = {}

    def __enter__(self) -> PlainProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None:
            for t in self.tasks.values():
                if not t["done"]:
                    self._line(t, final=True)

    def _line(self, t: dict[str, Any], final: bool = False) -> None:
        el = time.monotonic() - t["t0"]
        n, total = t["n"], t["total"]
        if total:
            eta = "" if final or not n else f", eta {_fmt_s(el * (total - n) / n)}"
            msg = f"{t['desc']}: {n:,}/{total:,} ({100 * n / total:.0f}%), {_fmt_s(el)} elapsed{eta}"
        else:
            msg = f"{t['desc']}: {n:,} done, {_fmt_s(el)} elapsed"
        if final:
            t["done"] = True
        console.print(msg, markup=False, highlight=False, soft_wrap=True)
        t["last"] = time.monotonic()

    def add_task(self, description: str, total: float | None = None, **_: Any) -> int:
        tid = len(self.tasks)
        now = time.monotonic()
        t = {"desc": description, "total": int(total) if total else None, "n": 0, "t0": now, "last": now}
        t["done"] = False
        self.tasks[tid] = t
        what = f"{int(total):,} steps" if total else "starting"
        console.print(f"{description}: {what}", markup=False, highlight=False, soft_wrap=True)
        return tid

    def advance(self, task: int, advance: float = 1) -> None:
        t = self.tasks[task]
        t["n"] += int(advance)
        if t["total"] and t["n"] >= t["total"]:
            self._line(t, final=True)
        elif time.monotonic() - t["last"] >= self.interval:
            self._line(t)

    def update(self, task: int, **kw: Any) -> None:
        t = self.tasks[task]
        if "description" in kw:
            t["desc"] = kw["description"]
        if "total" in kw and kw["total"]:
            t["total"] = int(kw["total"])
        if "completed" in kw:
            t["n"] = int(kw["completed"])
        if "advance" in kw:
            self.advance(task, kw["advance"])


def progress() -> Progress | PlainProgress:
    """Progress on stderr: rich's live bar in a terminal, plain periodic lines in a log.

    ``GAC_NO_PROGRESS=1`` turns both off.
    """
    if os.environ.get("GAC_NO_PROGRESS") != "1" and not console.is_terminal:
        return PlainProgress()
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


#: The dtypes gac loads, compresses and measures in; ``auto`` and the short spellings map onto them.
DTYPE_NAMES = ("float32", "bfloat16", "float16")
DTYPE_ALIASES = {
    "fp16": "float16",
    "half": "float16",
    "bf16": "bfloat16",
    "fp32": "float32",
    "float": "float32",
}


def parse_dtype(name: str, device: Any = "cpu") -> Any:
    """The one dtype parser: a name (``auto``, ``float32``, ``bfloat16``, ``float16``, or ``bf16``,
    ``fp16``, ``half``, ``fp32``, ``float``) -> torch dtype; ``auto`` is bfloat16 on a GPU
    (``device``), float32 elsewhere.

    Raises:
        GacError: an unknown name.
    """
    import torch

    key = str(name).strip().lower()
    if key == "auto":
        return torch.bfloat16 if str(device).startswith("cuda") else torch.float32
    key = DTYPE_ALIASES.get(key, key)
    if key not in DTYPE_NAMES:
        raise GacError(f"unknown dtype {name!r}; use auto, {', '.join(DTYPE_NAMES)}")
    return getattr(torch, key)


def resolve_device_dtype(device: str, dtype: str) -> tuple[str, Any]:
    """``auto`` device = CUDA when available, else CPU (:func:`gac.guard.parse_device`); the dtype
    by :func:`parse_dtype` on that device."""
    dev = parse_device(device)
    return dev, parse_dtype(dtype, dev)


def physical_cores() -> int:
    """Physical CPU cores this process may run on (hyper-threads counted once)."""
    try:
        allowed = os.sched_getaffinity(0)
    except AttributeError:  # not Linux
        return max(1, (os.cpu_count() or 1))
    cores: set[tuple[str, str]] = set()
    try:
        with open("/proc/cpuinfo") as f:
            cpu, phys = None, "0"
            for line in f:
                key, _, val = line.partition(":")
                key, val = key.strip(), val.strip()
                if key == "processor":
                    cpu = int(val)
                elif key == "physical id":
                    phys = val
                elif key == "core id" and cpu in allowed:
                    cores.add((phys, val))
    except (OSError, ValueError):
        pass
    return max(1, min(len(cores), len(allowed)) if cores else len(allowed))


def pick_threads() -> int | None:
    """Use one CPU thread per physical core unless ``OMP_NUM_THREADS`` says otherwise.

    PyTorch's default counts every logical CPU and oversubscribes a shared or hyper-threaded
    machine (stages 10-100x slower when other work runs beside it). Set before torch is imported
    (the environment variable), else through ``torch.set_num_threads``. Returns the count set, or
    None when the user's ``OMP_NUM_THREADS`` stands.
    """
    if os.environ.get("OMP_NUM_THREADS"):
        return None
    n = physical_cores()
    os.environ["OMP_NUM_THREADS"] = str(n)
    if "torch" in sys.modules:
        import torch

        torch.set_num_threads(n)
    return n
