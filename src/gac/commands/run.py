"""`gac run PLAN.toml`: expand a declarative experiment plan into cells and run the unfinished ones."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from gac.commands.options import OUT


def run_plan(
    plan_file: str | Path,
    out: str | Path | None = None,
    executor: str = "local",
    dry_run: bool = False,
    only: list[str] | None = None,
) -> dict[str, str]:
    """Validate ``plan_file``, then run (or, ``dry_run``, list) its cells into ``out``.

    Everything is checked before any work: the plan's keys and values, the executor, and that
    ``out`` holds no other plan's results.
    """
    from rich.table import Table

    from gac.errors import GacError
    from gac.executors import EXECUTORS, check_slurm, execute
    from gac.experiments import check_only, load_plan, open_plan_dir, status_table
    from gac.utils import console, out_console

    plan = load_plan(plan_file)
    if executor not in EXECUTORS:
        raise GacError(f"unknown executor {executor!r}; choose one of: {', '.join(EXECUTORS)}")
    check_only(plan, only)
    plan_dir = Path(out) if out else Path("runs") / plan.name
    if executor == "slurm" and not dry_run:
        check_slurm()
    d = open_plan_dir(plan, plan_dir, create=not dry_run)
    rows = status_table(plan, d, only)
    n_groups = len({g for g, _, _ in rows})
    todo = [r for r in rows if r[2] != "done"]
    if dry_run:
        t = Table(title=f"plan {plan.name}: {len(rows)} cells in {n_groups} groups, {len(todo)} to run")
        for c in ("group", "cell", "state"):
            t.add_column(c)
        for g, cid, st in rows:
            t.add_row(g, cid, st)
        out_console.print(t)
        return {cid: st for _, cid, st in rows}
    console.print(
        f"plan {plan.name} ({plan.hash}): {len(rows)} cells in {n_groups} groups; "
        f"{len(rows) - len(todo)} done, {len(todo)} to run; results in {d}"
    )
    res = execute(plan, d, executor, only)
    failed = [k for k, v in res.items() if v == "failed"]
    ran = sum(v == "ok" for v in res.values())
    console.print(f"ran {ran} cells, skipped {sum(v == 'done' for v in res.values())}, failed {len(failed)}")
    if failed:
        raise GacError(f"{len(failed)} cell(s) failed ({', '.join(failed[:3])}...); re-run to retry them")
    return res


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
    ) -> None:
        """Run an experiment plan: every cell once, resumable, shared calibration per group."""
        run_plan(plan_file, out, executor, dry_run, only or None)
