"""`gac report RESULTS_DIR`: the report of a plan directory or of any directory of gac results
(:func:`gac.plans.report.report`)."""

from __future__ import annotations

from typing import Annotated

import typer

from gac.commands.options import OUT


def register(app: typer.Typer) -> None:
    @app.command("report")
    def report_cmd(
        results_dir: str = typer.Argument(
            ..., help="Directory of results written by gac eval / llm_eval / llm_run."
        ),
        out: Annotated[str | None, OUT(shown_default="RESULTS_DIR")] = None,  # report.md, plots
    ) -> None:
        """Markdown + PNG comparison of variants: params, alignment, perplexity, accuracy, speedups."""
        from gac.plans.report import report

        md = report(results_dir, out)
        typer.echo(str(md))
