"""The ``gac`` command line: a thin layer over the Python API.

Each command group lives in ``gac/commands/<name>.py`` and exposes ``register(app)``.
Errors follow one contract (see :func:`main`): ``error: ...`` on one line, exit status 2.
"""

from __future__ import annotations

import importlib
import sys

import typer

from gac import __version__
from gac.guard import run_main

app = typer.Typer(
    name="gac",
    help="GPU-Aligned Compression: profile GPU shape penalties, analyze and repair model dims, compress with aligned ranks.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)

# One module per command group; each defines register(app).
COMMAND_MODULES = (
    "bench",
    "profile",
    "analyze",
    "repair",
    "compress",
    "eval",
    "generate",
    "demo",
    "report",
    "run",
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"gac {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """GPU-Aligned Compression."""


for _name in COMMAND_MODULES:
    importlib.import_module(f"gac.commands.{_name}").register(app)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``gac`` console script; returns the exit status.

    Usage errors (missing or unknown arguments, a non-number for a number) print typer's usage
    message with exit status 2: ``standalone_mode=True`` is typer's public way to report them,
    so we never touch click's exception classes (typer vendors its own copy). Everything else
    follows :func:`gac.guard.run_main` (``error: ...`` on one line, 130 on SIGINT, 1 for a bug).
    """
    from gac.utils import pick_threads

    pick_threads()
    return run_main(lambda: app(args=argv, prog_name="gac", standalone_mode=True))


if __name__ == "__main__":
    sys.exit(main())
