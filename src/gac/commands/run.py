"""`gac run PLAN.toml`: expand a declarative experiment plan into cells and run the unfinished ones
(:func:`gac.plans.executors.run_plan`)."""

from __future__ import annotations

from typing import Annotated

import typer

from gac.commands.options import OUT


def register(app: typer.Typer) -> None:
    @app.command("run")
    def run_cmd(
        plan_file: str = typer.Argument(..., help="The plan (TOML): axes, compress settings, evals."),
        out: Annotated[str | None, OUT(shown_default="runs/<plan name>")] = None,  # the plan directory
        executor: str = typer.Option("local", "--executor", help="local | slurm (submitit)."),
        dry_run: bool = typer.Option(
            False, "--dry-run", help="List the cells and what is done; run nothing."
        ),
        only: list[str] = typer.Option(
            [],
            "--only",
            help="Run only the groups with a cell matching this shell pattern (repeatable), "
            "e.g. 'kernels/*' or 'shape-llama3-8b-8/*': split one plan over machines.",
        ),
        gpus: str | None = typer.Option(
            None,
            "--gpus",
            help="Local: one process per GPU of this host (e.g. 0,1,2,3), each model's cells on one GPU, "
            "so compressed cells are timed on their dense base's card.",
        ),
    ) -> None:
        """Run an experiment plan: every cell once, resumable, shared calibration per group."""
        from gac.plans.executors import run_plan

        run_plan(plan_file, out, executor, dry_run, only or None, gpus)
