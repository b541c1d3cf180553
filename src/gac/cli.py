"""The ``gac`` command line: a thin layer over the Python API.

Each command group lives in ``gac/commands/<name>.py`` and exposes ``register(app)``.
Errors follow one contract (see :func:`main`): ``error: ...`` on one line, exit status 2.
"""

from __future__ import annotations

import importlib
import os
import signal
import sys
import traceback

import typer

from gac import __version__
from gac.errors import GacError
from gac.guard import Interrupted, install_signal_handlers

app = typer.Typer(
    name="gac",
    help="GPU-Aligned Compression: profile GPU shape penalties, analyze and repair model dims, compress with aligned ranks.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)

# One module per command group; each defines register(app).
COMMAND_MODULES = ("bench", "profile", "analyze", "repair", "compress", "eval", "demo", "report")


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


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``gac`` console script; returns the exit status.

    The error contract (see the README):

    * usage errors (missing or unknown arguments, a non-number for a number): typer's usage
      message, exit status 2;
    * :class:`GacError` (bad input caught where it is first seen): ``error: ...`` on one line, 2;
    * SIGINT / SIGTERM: ``error: interrupted ...`` on one line, ``128 + signum`` (130 for Ctrl-C);
      outputs are atomic, so nothing half-written remains;
    * anything else is a bug: one line plus a hint, exit status 1; ``GAC_DEBUG=1`` shows the
      traceback.
    """
    restore = install_signal_handlers()
    try:
        # standalone_mode=True is typer's public way to report usage errors (usage line, exit 2)
        # without us touching click's exception classes (typer vendors its own copy).
        app(args=argv, prog_name="gac", standalone_mode=True)
    except SystemExit as e:
        if e.code is None:
            return 0
        if isinstance(e.code, int):
            return e.code
        print(e.code, file=sys.stderr)
        return 1
    except GacError as e:
        print(f"error: {_one_line(e)}", file=sys.stderr)
        return 2
    except (Interrupted, KeyboardInterrupt) as e:
        name = "SIGINT" if isinstance(e, KeyboardInterrupt) else signal.Signals(e.signum).name
        code = 130 if isinstance(e, KeyboardInterrupt) else e.exit_code
        print(f"error: interrupted by {name}; no partial output was left behind", file=sys.stderr)
        return code
    except Exception as e:  # noqa: BLE001 - the last line of defence: a bug, reported in one line
        if os.environ.get("GAC_DEBUG", "") not in ("", "0"):
            traceback.print_exc()
        else:
            msg = _one_line(e)[:300]
            print(
                f"error: internal error: {type(e).__name__}{': ' + msg if msg else ''} "
                "(run with GAC_DEBUG=1 for the traceback)",
                file=sys.stderr,
            )
        return 1
    finally:
        restore()
    return 0


if __name__ == "__main__":
    sys.exit(main())
