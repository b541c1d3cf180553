"""One dispatch lifecycle for every measured kernel: measure once per machine, cache, swap modules in, undo.

A kernel of the decode path (:mod:`gac.kernels`) is faster than the existing path (cuBLAS) at some
shapes and slower at others, so it is used only where it was measured faster, on this GPU.  A
:class:`Dispatch` subclass says, for one kernel:

* which modules of a model are its *sites* and what shape each has (:meth:`Dispatch.sites`, :meth:`Dispatch.key`);
* how to time one shape at one row class (:meth:`Dispatch.measure`: a record with ``use`` and ``config``)
  and whether a cached record is still current (:meth:`Dispatch.fresh`);
* which class a switched module becomes (:attr:`Dispatch.swaps`), the attribute holding its table
  (:attr:`Dispatch.attr`) and the non-persistent buffer it needs (:meth:`Dispatch.counters`).

The base does the rest, the same for every kernel: :meth:`Dispatch.decisions` measures what the
per-machine cache lacks under a progress bar (saved after each shape, so an interrupted run keeps its
work) and reads the rest from ``$GAC_CACHE/<cache>`` (``{"<gpu>|torch<v>|triton<v>|<dtype>":
{"<key>@<rows>": record}}``); :meth:`Dispatch.use_` switches each site whose shape won at some row
class; :meth:`Dispatch.switch_recorded_` switches the sites of a recorded result without measuring;
:meth:`Dispatch.undo_` gives every switched module back its class, attributes and buffers exactly.

A switched module holds ``{row class: decision}`` with every row class of :attr:`Dispatch.classes`
(None where the existing path runs), read by :func:`gac.hardware.dispatch_table.choice`: the
modules of :mod:`gac.runtime.modules` at each call, and the latency model when it prices a switched
site.  The subclasses: :mod:`gac.runtime.gemv`, :mod:`gac.runtime.lowrank_fused`,
:mod:`gac.runtime.branches`.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Hashable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from gac.hardware.dispatch_table import row_class
from gac.kernels.jit import HAVE_TRITON, triton
from gac.utils import cache_root, track

__all__ = ["Dispatch", "cache_key", "load_cache", "row_class", "tried_all"]

_LOCK = threading.Lock()
Site = tuple[str, nn.Module, Hashable]


def cache_key(device: torch.device, dtype: torch.dtype) -> str:
    """The part of a dispatch cache that holds this GPU's records: GPU, torch, Triton and dtype."""
    name = torch.cuda.get_device_name(device).replace(" ", "-") if device.type == "cuda" else device.type
    tv = triton.__version__ if HAVE_TRITON else "none"
    return f"{name}|torch{torch.__version__}|triton{tv}|{str(dtype).removeprefix('torch.')}"


def load_cache(name: str) -> dict[str, Any]:
    """A per-machine dispatch cache under ``$GAC_CACHE`` ({} when absent or unreadable)."""
    try:
        return json.loads((cache_root() / name).read_text())
    except (OSError, ValueError):
        return {}


def _save_cache(data: dict[str, Any], name: str) -> None:
    p: Path = cache_root() / name
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_name(f".{p.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
        os.replace(tmp, p)
    except OSError:  # a read-only cache costs a re-measure next time, nothing else
        pass


def tried_all(rec: dict[str, Any], configs: Any) -> bool:
    """Whether a cached dispatch record tried every configuration of ``configs``.

    A record lists what it ``tried`` as ``[config, µs | None]`` pairs, or as bare configurations (the
    fused low-rank kernel's older records).  A record without ``tried`` predates it: stale.

    >>> tried_all({"tried": [[[4, 512, 4, 3], 6.9], [[8, 512, 4, 3], None]]}, [(8, 512, 4, 3)])
    True
    >>> tried_all({"tried": [[4, 1024, 4, 1024, 4, 1, 8]]}, [(4, 1024, 4, 1024, 4, 1, 8)])
    True
    >>> tried_all({"tried": [[4, 1024, 4, 1024, 4, 1, 8]]}, [(8, 1024, 8, 1024, 4, 1, 4)])
    False
    """
    tried = {tuple(c[0] if len(c) == 2 and isinstance(c[0], list) else c) for c in rec.get("tried") or []}
    return all(tuple(c) in tried for c in configs)


class Dispatch:
    """Measure a kernel once per machine, cache the decisions, swap the winning sites in, undo.

    A subclass sets the class attributes and implements :meth:`sites`, :meth:`key` and :meth:`measure`
    (and :meth:`fresh`, :meth:`counters`, :meth:`value` where the defaults do not fit).
    """

    #: what the progress bar calls the measurement
    what: str = "dispatch"
    #: the cache file under ``$GAC_CACHE``
    cache: str = "dispatch.json"
    #: the row classes an input maps onto (:func:`row_class`); a switched module's table has each
    classes: tuple[int, ...] = (1,)
    #: the row classes measured by default (a subset of :attr:`classes`; None: all of them)
    measured_classes: tuple[int, ...] | None = None
    #: the attribute of a switched module that holds its table (row class -> decision)
    attr: str = "dispatch_table"
    #: the non-persistent buffer a switched module may hold (:meth:`counters`), removed by :meth:`undo_`
    buffer: str | None = None
    #: without Triton nothing is switched
    needs_triton: bool = True
    #: exact module type -> the class it becomes when switched (a type not listed keeps its class)
    swaps: dict[type, type] = {}

    # ------------------------------------------------------------------ what a subclass says
    def sites(self, model: nn.Module) -> list[Site]:
        """``(qualified name, module, shape)`` of every module this kernel may serve."""
        raise NotImplementedError

    def key(self, shape: Hashable) -> str:
        """The cache key of a site shape (``4096x1736``, ``4096:1736x4096+704x1024``)."""
        raise NotImplementedError

    def measure(self, shape: Hashable, rows: int, dtype: torch.dtype, device: torch.device) -> dict[str, Any]:
        """Time the kernel against the existing path at ``shape`` and ``rows`` rows: a record with
        ``use`` (faster by the margin) and ``config`` (the decision where ``use``)."""
        raise NotImplementedError

    def fresh(self, rec: dict[str, Any], rows: int) -> bool:
        """Whether a cached record still stands (measured on this kernel with today's configurations)."""
        return True

    def value(self, decision: Any) -> Any:
        """A decision (a record's ``config``, or a recorded one read from JSON) as a module's table holds it."""
        return decision

    def counters(self, module: nn.Module, table: dict[int, Any]) -> torch.Tensor | None:
        """A switched module's zeroed counters (registered as :attr:`buffer`), or None."""
        return None

    def unavailable(self, param: torch.Tensor | None) -> str | None:
        """Why a model whose first parameter is ``param`` cannot be switched, or None: the kernels run on
        CUDA, most of them through Triton."""
        if param is None or param.device.type != "cuda":
            return "not on CUDA"
        if self.needs_triton and not HAVE_TRITON:
            return "Triton is not installed"
        return None

    def sort(self, shapes: set[Hashable]) -> list[Hashable]:
        """The order shapes are measured and reported in."""
        return sorted(shapes, key=str)

    def recorded_row(self, row: dict[int, Any]) -> dict[str, Any]:
        """A table row as :meth:`use_` reports it (JSON keys)."""
        return {str(r): v for r, v in row.items()}

    # ------------------------------------------------------------------ the lifecycle
    @property
    def row_classes(self) -> tuple[int, ...]:
        """The row classes measured by default."""
        return self.measured_classes or self.classes

    def decisions(
        self,
        shapes: list[Hashable],
        dtype: torch.dtype,
        device: torch.device,
        row_classes: tuple[int, ...] | None = None,
    ) -> dict[str, dict[int, Any]]:
        """Per shape key ``{row class: decision | None}`` (None: the existing path), measured once per machine.

        What the cache lacks, or holds only in a record that is no longer :meth:`fresh`, is measured
        under a progress bar and saved after each measurement, so an interrupted run keeps its work.
        """
        keys = {self.key(s): s for s in shapes}
        classes = row_classes or self.row_classes
        with _LOCK:
            data = load_cache(self.cache)
            table = data.setdefault(cache_key(device, dtype), {})
            missing = [(k, r) for k in keys for r in classes
                       if f"{k}@{r}" not in table or not self.fresh(table[f"{k}@{r}"], r)]  # fmt: skip
            if missing:
                for k, r in track(
                    missing, f"{self.what}: measuring {len(missing)} shape(s) once on this GPU"
                ):
                    table[f"{k}@{r}"] = self.measure(keys[k], r, dtype, device)
                    _save_cache(data, self.cache)
            return {k: {r: self.value(table[f"{k}@{r}"]["config"] if table[f"{k}@{r}"].get("use") else None)
                        for r in classes} for k in keys}  # fmt: skip

    def measured(self, dtype: torch.dtype, device: torch.device) -> dict[str, Any]:
        """The cached measurements of this GPU (for reports)."""
        return dict(load_cache(self.cache).get(cache_key(device, dtype), {}))

    def use_(self, model: nn.Module, skip: tuple[str, ...] = ()) -> dict[str, Any]:
        """Switch every site of ``model`` whose shape was measured faster with the kernel, in place.

        Sites whose qualified name ends with one of ``skip`` are left alone.  Returns ``{"modules":
        switched, "of": sites, "shapes": {key: {row class: decision}}}`` (the shapes that won somewhere);
        on a model not on CUDA, or without Triton where the kernel needs it, nothing is switched and
        ``"reason"`` says why.
        """
        p = next(model.parameters(), None)
        reason = self.unavailable(p)
        if reason is not None or p is None:
            return {"modules": 0, "of": 0, "reason": reason or "no parameters"}
        sites = [s for s in self.sites(model) if not s[0].endswith(skip or ("\0",))]
        table = self.decisions(self.sort({s[2] for s in sites}), p.dtype, p.device)
        n = self.switch_sites_(sites, table)
        used = {
            key: self.recorded_row(row)
            for key, row in table.items()
            if any(v is not None for v in row.values())
        }
        return {"modules": n, "of": len(sites), "shapes": used}

    def switch_recorded_(self, model: nn.Module, shapes: dict[str, dict[str, Any]] | None) -> int:
        """Switch the sites a recorded :meth:`use_` result switched (its ``"shapes"``), measuring nothing.

        For models rebuilt from a record, e.g. the meta-device skeletons the latency model prices
        (:func:`gac.runtime.cells.cell_skeleton`).  Returns the modules switched.
        """
        rows = {key: {int(r): self.value(v) for r, v in row.items()} for key, row in (shapes or {}).items()}
        return self.switch_sites_(self.sites(model), rows)

    def switch_sites_(self, sites: list[Site], rows_of: dict[str, dict[int, Any]]) -> int:
        """Switch each of ``sites`` whose shape key has a decision somewhere in ``rows_of`` (key -> row).
        Returns the modules switched."""
        n = 0
        for _, m, shape in sites:
            row = rows_of.get(self.key(shape)) or {}
            if any(v is not None for v in row.values()):
                self.switch_(m, row)
                n += 1
        return n

    def switch_(self, module: nn.Module, row: dict[int, Any]) -> nn.Module:
        """Switch one module to the kernel for ``row`` (row class -> decision; a class it lacks: None)."""
        table = {c: self.value(row.get(c)) for c in self.classes}
        if self.buffer is not None:
            module._buffers.pop(self.buffer, None)
            buf = self.counters(module, table)
            if buf is not None:  # a non-persistent buffer: moves with the module, not in its state_dict
                module.register_buffer(self.buffer, buf, persistent=False)
        setattr(module, self.attr, table)
        to = self.swaps.get(type(module))
        if to is not None:
            module.__class__ = to
        return module

    def undo_(self, model: nn.Module) -> int:
        """Back to the existing path everywhere: each switched module gets its class, attributes and
        buffers back as they were. Returns the modules changed."""
        n = 0
        for m in model.modules():
            if self.attr not in m.__dict__:
                continue
            del m.__dict__[self.attr]
            if self.buffer is not None:
                m._buffers.pop(self.buffer, None)
            plain = getattr(type(m), "plain", None)  # a class of gac.runtime.modules
            if plain is not None and not any(a in m.__dict__ for a in type(m).tables):
                m.__class__ = plain
            n += 1
        return n
