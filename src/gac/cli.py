"""The ``gac`` command line: a thin layer over the Python API.

Each command group lives in ``gac/commands/<name>.py`` and exposes ``register(app)``.
Errors of type :class:`gac.GacError` print as one line (``error: ...``) with exit status 2.
"""

from __future__ import annotations

import importlib
import sys

import typer

from gac import __version__
from gac.errors import GacError

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


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``gac`` console script."""
    try:
        app(args=argv, standalone_mode=False)
    except GacError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted (results written so far are kept)", file=sys.stderr)
        return 130
    except typer.Exit as e:
        return int(e.exit_code or 0)
    except typer.Abort:
        return 1
    except Exception as e:  # click usage errors
        import click

        if isinstance(e, click.ClickException):
            e.show()
            return e.exit_code
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
