"""`gac profile` (being written)."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    pass
