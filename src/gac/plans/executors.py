"""Where the cells of an experiment plan run: ``local`` (in order, in this process; or, with ``gpus``,
one process per GPU of this host) or ``slurm``.

With ``gpus`` the local executor gives each GPU a share of the plan's *models*, every group of a model
on one GPU, so that each compressed cell is timed on the same card as its dense base; each share runs
as ``gac run PLAN --out DIR --only GROUP ...`` under ``CUDA_VISIBLE_DEVICES``, its output in
``PLAN_DIR/gpus/gpu<i>.log``. Cell files are written atomically, so the processes share the directory.

The Slurm executor submits one job per *group* (the cells sharing one calibration) through
``submitit``; each job runs :func:`gac.plans.cells.run_group`, which writes its cells' JSON into the
plan directory. Job logs land in ``PLAN_DIR/slurm/``. A job that fails (or dies) leaves its cells
failed or missing; they are reported with the job's log tail and re-submitted on the next run.
"""

from __future__ import annotations

import shlex
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


def parse_gpus(spec: str) -> list[int]:
    """``"0,1,3"`` -> ``[0, 1, 3]``; anything else (empty, negative, repeated, not a number) is refused.

    >>> parse_gpus("0, 2,1")
    [0, 2, 1]
    """
    try:
        ids = [int(x) for x in spec.split(",")]
    except ValueError:
        ids = []
    if not ids or any(i < 0 for i in ids) or len(set(ids)) != len(ids):
        raise GacError(f"--gpus takes distinct GPU indices separated by commas (e.g. 0,1,2,3), got {spec!r}")
    return ids


def share_models(groups: dict[str, list[Any]], gpus: list[int]) -> dict[int, list[str]]:
    """Group ids per GPU: whole models (all their groups), the model with the most groups first, each to the
    GPU with the fewest groups so far. GPUs beyond the number of models get nothing.

    >>> share_models({"a/base": [0], "a/svd-r0.8": [0], "b/base": [0]}, [0, 1, 2])
    {0: ['a/base', 'a/svd-r0.8'], 1: ['b/base']}
    """
    by_model: dict[str, list[str]] = {}
    for gid in groups:
        by_model.setdefault(gid.split("/", 1)[0], []).append(gid)
    load = {g: 0 for g in gpus}
    out: dict[int, list[str]] = {}
    for model in sorted(by_model, key=lambda m: -len(by_model[m])):
        gpu = min(gpus, key=lambda g: (load[g], gpus.index(g)))
        out.setdefault(gpu, []).extend(by_model[model])
        load[gpu] += len(by_model[model])
    return dict(sorted(out.items(), key=lambda kv: gpus.index(kv[0])))


def run_local_gpus(
    plan_file: str | Path,
    plan: ExperimentPlan,
    plan_dir: str | Path,
    gpus: list[int],
    only: list[str] | None = None,
) -> dict[str, str]:
    """Run the (selected) groups in one ``gac run`` process per GPU (:func:`share_models`); returns cell
    id -> ``ok`` (ran), ``done`` (was done) or ``failed`` (failed, or its process died first)."""
    import os
    import sys

    from gac.utils import console

    d = Path(plan_dir)
    before = {cid: st for _, cid, st in status_table(plan, d, only)}
    share = share_models(plan.groups(only), gpus)
    idle = [g for g in gpus if g not in share]
    if idle:
        console.print(f"note: {len(share)} model(s) for {len(gpus)} GPUs; GPU(s) {', '.join(map(str, idle))} "
                      "idle (a model's cells stay on one card)")  # fmt: skip
    logs = d / "gpus"
    logs.mkdir(parents=True, exist_ok=True)
    procs: dict[int, tuple[subprocess.Popen, Path]] = {}
    try:
        for gpu, gids in share.items():
            cmd = [sys.executable, "-m", "gac", "run", str(plan_file), "--out", str(d)]
            for gid in gids:
                cmd += ["--only", gid]
            log = logs / f"gpu{gpu}.log"
            env = {**os.environ, "CUDA_VISIBLE_DEVICES": str(gpu)}
            with open(log, "w") as f:
                f.write(f"CUDA_VISIBLE_DEVICES={gpu} {shlex.join(cmd)}\n")
                f.flush()
                procs[gpu] = (subprocess.Popen(cmd, env=env, stdout=f, stderr=subprocess.STDOUT), log)
            console.print(f"GPU {gpu}: {len(gids)} group(s) ({', '.join(gids)}); log {log}")
        for gpu, (p, log) in procs.items():
            rc = p.wait()
            console.print(f"GPU {gpu}: exit {rc}" + ("" if rc == 0 else f"\n{_tail(_read(log))}"))
    except KeyboardInterrupt:
        for p, _ in procs.values():
            p.terminate()
        raise
    out: dict[str, str] = {}
    for _, cid, st in status_table(plan, d, only):
        out[cid] = ("done" if before.get(cid) == "done" else "ok") if st == "done" else "failed"
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
    plan: ExperimentPlan,
    plan_dir: str | Path,
    executor: str = "local",
    only: list[str] | None = None,
    gpus: list[int] | None = None,
    plan_file: str | Path | None = None,
) -> dict[str, str]:
    """Run ``plan``'s unfinished cells (of the groups ``only`` selects) with ``executor`` (``gpus``: the
    local executor's one process per GPU, which re-reads ``plan_file``)."""
    if executor == "local" and gpus:
        if plan_file is None:
            raise GacError("running on several GPUs needs the plan file (each GPU's process reads it)")
        return run_local_gpus(plan_file, plan, plan_dir, gpus, only)
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
    gpus: str | None = None,
) -> dict[str, str]:
    """Validate ``plan_file``, then run (or, ``dry_run``, list) its cells into ``out``.

    Everything is checked before any work: the plan's keys and values, the executor, ``gpus`` (local
    only: ``"0,1,2,3"``, one process per GPU) and that ``out`` holds no other plan's results.
    """
    from rich.table import Table

    from gac.utils import console, out_console

    plan = load_plan(plan_file)
    if executor not in EXECUTORS:
        raise GacError(f"unknown executor {executor!r}; choose one of: {', '.join(EXECUTORS)}")
    check_only(plan, only)
    gpu_ids = parse_gpus(gpus) if gpus is not None else None
    if gpu_ids and executor != "local":
        raise GacError("--gpus is for the local executor (Slurm gives each job its own GPU)")
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
        for gpu, gids in share_models(plan.groups(only), gpu_ids).items() if gpu_ids else ():
            out_console.print(f"GPU {gpu}: {', '.join(gids)}")
        return {cid: st for _, cid, st in rows}
    console.print(
        f"plan {plan.name} ({plan.hash}): {len(rows)} cells in {n_groups} groups; "
        f"{len(rows) - len(todo)} done, {len(todo)} to run; results in {d}"
    )
    res = execute(plan, d, executor, only, gpus=gpu_ids, plan_file=plan_file)
    failed = [k for k, v in res.items() if v == "failed"]
    ran = sum(v == "ok" for v in res.values())
    console.print(f"ran {ran} cells, skipped {sum(v == 'done' for v in res.values())}, failed {len(failed)}")
    if failed:
        raise GacError(f"{len(failed)} cell(s) failed ({', '.join(failed[:3])}...); re-run to retry them")
    return res
