"""`gac report RESULTS_DIR`: the report of a plan directory or of any directory of gac results
(:func:`gac.plans.report.report`)."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    @app.command("report")
    def report_cmd(
        results_dir: str = typer.Argument(
            ..., help="Directory of results written by gac eval / llm_eval / llm_run."
        ),
        out: str | None = typer.Option(
            None, "--out", help="Where to write report.md and plots (default: RESULTS_DIR)."
        ),
    ) -> None:
        """Markdown + PNG comparison of variants: params, alignment, perplexity, accuracy, speedups."""
        from gac.plans.report import report

        md = report(results_dir, out)
        typer.echo(str(md))
