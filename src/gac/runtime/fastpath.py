"""Each fast-path switch, declared once: name, default, help, one polarity.

:class:`FastPath` is the only place a switch of the fast path is declared.  Every surface that
exposes one is generated from it:

* the typer options of ``gac eval infer`` and ``gac generate`` (:func:`typer_options`);
* the argparse parser of ``python -m gac.llm_run`` (:func:`add_arguments`);
* the fields of :class:`gac.eval.infer.SweepConfig` (a subclass);
* the keys an ``[[evals]] kind = "infer"`` table of a plan may hold (:func:`plan_keys`).

A boolean switch ``x`` is spelled ``--x/--no-x`` on every command line (the default is on for
most; the flag that turns it off is the one users script).  ``None`` means "on where CUDA is".
Not every surface exposes every switch: ``surfaces`` in a field's metadata says where it appears
(``generate`` does not fuse, the plan does not take ``triton`` or ``compile_mode``).
"""

from __future__ import annotations

import argparse
import functools
import inspect
from collections.abc import Callable
from dataclasses import Field, asdict, dataclass, field, fields, replace
from typing import Any, TypeVar

#: Where a switch appears: ``gac eval infer`` and ``python -m gac.llm_run`` (one surface: the
#: second is the first's seed entry point), ``gac generate``, and a plan's infer evals.
INFER, GENERATE, PLAN = "infer", "generate", "plan"
SURFACES = (INFER, GENERATE, PLAN)

_ALL = frozenset(SURFACES)


def _switch(default: Any, help: str, surfaces: frozenset[str] = _ALL) -> Any:
    return field(default=default, metadata={"help": help, "surfaces": surfaces})


@dataclass
class FastPath:
    """The fast path's switches; the defaults are the default path (the product)."""

    compile: bool | None = _switch(
        None,
        "torch.compile each step at its static shape (default: on where CUDA is; on CPU, eager with a notice).",
    )
    graphs: bool | None = _switch(
        None, "Capture decode steps as CUDA graphs and replay them (default: on where CUDA is)."
    )
    compile_mode: str | None = _switch(
        None,
        "torch.compile mode: default | max-autotune-no-cudagraphs (Inductor autotunes its GEMMs).",
        frozenset({INFER}),
    )
    fuse: bool = _switch(
        True,
        "Fuse q/k/v and gate/up into one GEMM each (exact; the factors' first stages of a compressed model).",
        frozenset({INFER, PLAN}),
    )
    triton: bool = _switch(
        False,
        "The earlier fused low-rank Triton GEMV (split over the rank, atomics; CUDA only).",
        frozenset({INFER}),
    )
    gqa_decode: bool = _switch(
        True,
        "Decode attention on the KV heads of a grouped-query cache (exact, no repeat_kv copy); "
        "off keeps transformers' sdpa.",
    )
    gemv: bool = _switch(
        True,
        "Decode GEMVs through the Triton kernel where it was measured faster than cuBLAS on this GPU (CUDA).",
    )
    fused_lowrank: bool = _switch(
        True,
        "Decode: both stages of each factorized site in one Triton launch where measured faster (CUDA).",
    )
    branches: bool = _switch(
        True,
        "Second stages of a fused group's factorized members on parallel CUDA streams where measured faster.",
    )
    combo_kernels: bool = _switch(
        True,
        "Compiled steps: Inductor launches kernels that do not depend on each other together (combo kernels).",
    )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def of(cls, fast: FastPath | None = None, **switches: Any) -> FastPath:
        """``fast`` (default: the default path) with ``switches`` overridden; an unknown name raises TypeError."""
        return replace(fast if fast is not None else cls(), **switches)

    def only(self, surface: str) -> dict[str, Any]:
        """The switches ``surface`` exposes, as keyword arguments."""
        return {f.name: getattr(self, f.name) for f in switches(surface)}


def switches(surface: str | None = None) -> list[Field[Any]]:
    """The fields of :class:`FastPath` (those ``surface`` exposes), in declaration order."""
    if surface is not None and surface not in SURFACES:
        raise ValueError(f"unknown surface {surface!r}; one of {SURFACES}")
    return [f for f in fields(FastPath) if surface is None or surface in f.metadata["surfaces"]]


def flag(name: str) -> str:
    """The command-line spelling of switch ``name``: ``fused_lowrank`` -> ``--fused-lowrank``."""
    return "--" + name.replace("_", "-")


def is_bool(f: Field[Any]) -> bool:
    return f.type in ("bool", "bool | None", bool)


def plan_keys() -> set[str]:
    """The fast-path keys a plan's infer eval may hold (each true or false)."""
    return {f.name for f in switches(PLAN)}


# ---------------------------------------------------------------------------- argparse


def add_arguments(ap: argparse.ArgumentParser, surface: str = INFER) -> None:
    """Add ``surface``'s switches to an argparse parser: ``--x/--no-x`` (mutually exclusive) per
    boolean switch, ``--x VALUE`` otherwise; ``dest`` is the field name."""
    for f in switches(surface):
        help = f.metadata["help"]
        if is_bool(f):
            g = ap.add_mutually_exclusive_group()
            g.add_argument(flag(f.name), dest=f.name, action="store_true", default=f.default, help=help)
            g.add_argument(flag("no_" + f.name), dest=f.name, action="store_false")
        else:
            ap.add_argument(flag(f.name), dest=f.name, default=f.default, help=help)


def from_namespace(a: argparse.Namespace, surface: str = INFER) -> FastPath:
    """The :class:`FastPath` an argparse namespace built by :func:`add_arguments` holds."""
    return FastPath(**{f.name: getattr(a, f.name) for f in switches(surface)})


# ---------------------------------------------------------------------------- typer

F = TypeVar("F", bound=Callable[..., Any])


def _typer_parameter(f: Field[Any], panel: str | None = None) -> inspect.Parameter:
    import typer

    help = f.metadata["help"]
    if is_bool(f):
        opt = typer.Option(
            f.default, f"{flag(f.name)}/{flag('no_' + f.name)}", help=help, rich_help_panel=panel
        )
        annotation: Any = bool | None if f.default is None else bool
    else:
        opt = typer.Option(f.default, flag(f.name), help=help, rich_help_panel=panel)
        annotation = str | None
    return inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=opt, annotation=annotation)


def typer_options(surface: str, panel: str | None = None) -> Callable[[F], F]:
    """Decorate a typer command taking ``fast: FastPath``: its signature gets one option per switch
    ``surface`` exposes (in place of ``fast``, shown in the help panel ``panel``), and the command
    receives them as one :class:`FastPath`."""
    names = [f.name for f in switches(surface)]

    def deco(fn: F) -> F:
        sig = inspect.signature(fn, eval_str=True)
        if "fast" not in sig.parameters:
            raise TypeError(f"{fn.__name__} takes no 'fast' parameter")
        params: list[inspect.Parameter] = []
        for p in sig.parameters.values():
            if p.name == "fast":
                params += [_typer_parameter(f, panel) for f in switches(surface)]
            else:
                params.append(p.replace(kind=inspect.Parameter.KEYWORD_ONLY))

        @functools.wraps(fn)
        def wrapper(*args: Any, **kw: Any) -> Any:
            fast = FastPath(**{n: kw.pop(n) for n in names if n in kw})
            return fn(*args, fast=fast, **kw)

        del wrapper.__wrapped__  # typer reads the generated signature, not fn's
        wrapper.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
        wrapper.__annotations__ = {p.name: p.annotation for p in params}
        return wrapper  # type: ignore[return-value]

    return deco
