"""Where the cells of an experiment plan run: ``local`` (in order, in this process) or ``slurm``.

The Slurm executor submits one job per *group* (the cells sharing one calibration) through
``submitit``; each job runs :func:`gac.plans.cells.run_group`, which writes its cells' JSON into the
plan directory. Job logs land in ``PLAN_DIR/slurm/``. A job that fails (or dies) leaves its cells
failed or missing; they are reported with the job's log tail and re-submitted on the next run.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from gac.errors import GacError
from gac.plans.cells import run_group
from gac.plans.schema import ExperimentPlan, check_only, load_plan
from gac.plans.store import cell_state, open_plan_dir, plan_from_dir, status_table

EXECUTORS = ("local", "slurm")


def run_local(plan: ExperimentPlan, plan_dir: str | Path, only: list[str] | None = None) -> dict[str, str]:
    """Run every (selected) group in order on this machine; returns cell id -> state."""
    out: dict[str, str] = {}
    for g in plan.groups(only):
        out.update(run_group(plan, plan_dir, g))
    return out


def _group_job(plan_dir: str, group: str) -> dict[str, str]:
    """The function a Slurm job runs (re-reads the plan from its directory)."""
    return run_group(plan_from_dir(plan_dir), plan_dir, group)


def check_slurm() -> None:
    """Refuse the Slurm executor without ``submitit`` or without a reachable controller."""
    try:
        import submitit  # noqa: F401
    except ImportError:
        raise GacError("--executor slurm needs submitit: pip install 'gac[slurm]'") from None
    if shutil.which("sbatch") is None or shutil.which("squeue") is None:
        raise GacError("--executor slurm: no sbatch/squeue on PATH (is Slurm installed here?)")
    try:
        r = subprocess.run(["squeue", "--noheader", "--me"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise GacError(f"--executor slurm: the Slurm controller is not reachable ({e})") from None
    if r.returncode != 0:
        line = (r.stderr or r.stdout).strip().splitlines()
        raise GacError(
            "--executor slurm: the Slurm controller is not reachable" + (f" ({line[-1]})" if line else "")
        )


def _read(p: Path) -> str:
    try:
        return Path(p).read_text(errors="replace")
    except OSError:
        return ""


def _active_jobs() -> set[str] | None:
    """Job ids (array tasks expanded, ``1_0``) still queued or running; None if squeue fails."""
    r = subprocess.run(["squeue", "--noheader", "-r", "-o", "%i"], capture_output=True, text=True, timeout=30)
    return set(r.stdout.split()) if r.returncode == 0 else None


def _tail(text: str | None, n: int = 15) -> str:
    return "\n".join((text or "").rstrip().splitlines()[-n:])


def run_slurm(
    plan: ExperimentPlan, plan_dir: str | Path, poll_s: float = 2.0, only: list[str] | None = None
) -> dict[str, str]:
    """Submit one job per unfinished group, wait for all, report failures with their log tail."""
    import submitit

    from gac.utils import console

    check_slurm()
    plan_dir = Path(plan_dir).resolve()
    groups = plan.groups(only)
    pending = [
        g for g, cells in groups.items() if any(cell_state(plan, plan_dir, c) != "done" for c in cells)
    ]
    out = {c.id: "done" for g, cells in groups.items() if g not in pending for c in cells}
    if not pending:
        return out
    ex = submitit.AutoExecutor(folder=str(plan_dir / "slurm" / "%j"), cluster="slurm")
    s = plan.slurm
    params: dict[str, Any] = {"timeout_min": int(s.get("time_min", 60)), "slurm_job_name": f"gac-{plan.name}"}
    if s.get("partition"):
        params["slurm_partition"] = s["partition"]
    if s.get("gpus"):
        params["gpus_per_node"] = int(s["gpus"])
    if s.get("cpus"):
        params["cpus_per_task"] = int(s["cpus"])
    if s.get("mem_gb"):
        params["mem_gb"] = int(s["mem_gb"])
    if s.get("array_parallelism"):
        params["slurm_array_parallelism"] = int(s["array_parallelism"])
    if s.get("setup"):
        params["slurm_setup"] = list(s["setup"])
    ex.update_parameters(**params)
    with ex.batch():
        jobs = [ex.submit(_group_job, str(plan_dir), g) for g in pending]
    for g, j in zip(pending, jobs, strict=True):
        console.print(f"submitted {g}: Slurm job {j.job_id}")
    finished: dict[str, bool] = {}  # job id -> has a result file
    while len(finished) < len(jobs):
        time.sleep(poll_s)
        active = _active_jobs()
        for j in jobs:
            if j.job_id in finished:
                continue
            has_result = j.paths.result_pickle.exists()
            # without Slurm accounting (sacct) submitit cannot tell a job that died before
            # writing its result: a job that left the queue without one has failed
            if has_result or (active is not None and j.job_id not in active):
                finished[j.job_id] = has_result or j.paths.result_pickle.exists()
    for g, j in zip(pending, jobs, strict=True):
        err: str | None = None
        if finished[j.job_id]:
            try:
                out.update(j.result())
            except Exception as e:  # noqa: BLE001 - a failed job: report, its cells re-run next time
                err = str(e)
        else:
            err = "the job ended without a result"
        if err is not None:
            tail = _tail(_read(j.paths.stderr)) or _tail(_read(j.paths.stdout)) or err
            console.print(
                f"[red]Slurm job {j.job_id} ({g}) failed[/red]: {err.splitlines()[0] if err else ''}; log tail:\n{tail}"
            )
            for c in plan.groups()[g]:
                if cell_state(plan, plan_dir, c) != "done":
                    out[c.id] = "failed"
    return out


def execute(
    plan: ExperimentPlan, plan_dir: str | Path, executor: str = "local", only: list[str] | None = None
) -> dict[str, str]:
    """Run ``plan``'s unfinished cells (of the groups ``only`` selects) with ``executor``."""
    if executor == "local":
        return run_local(plan, plan_dir, only)
    if executor == "slurm":
        return run_slurm(plan, plan_dir, only=only)
    raise GacError(f"unknown executor {executor!r}; choose one of: {', '.join(EXECUTORS)}")


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
