"""``gac run --executor slurm`` against a REAL single-node Slurm (Debian slurm-wlm + munge).

The fixture starts munged, slurmctld and slurmd on loopback in a temp dir (CPU only) and stops
exactly the processes it started. Skipped, with the reason, where Slurm, munge or submitit is
absent or the daemons cannot start (they need root here: SlurmUser=root). ``.ci/run`` installs
the Debian packages so CI runs it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from gac.errors import GacError

pytestmark = pytest.mark.slow

PLAN = """
[plan]
name = "slurmtest"
[axes]
models = ["tiny:llama"]
compressors = ["svd"]
ratios = [0.8]
align = ["none", "gac"]
[compress]
profile = "h200-bfloat16"
allow_slower = true  # tiny dims: every factorization is predicted slower on the H200
[[evals]]
kind = "predict"
[slurm]
time_min = 5
cpus = 1
"""


def _port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def _skip_reason() -> str | None:
    for exe in ("munged", "slurmctld", "slurmd", "sbatch", "squeue"):
        if shutil.which(exe) is None:
            return f"no {exe} on PATH (apt-get install slurm-wlm munge)"
    try:
        import submitit  # noqa: F401
    except ImportError:
        return "submitit is not installed (pip install 'gac[slurm]')"
    if os.geteuid() != 0:
        return "the single-node Slurm fixture runs its daemons as root (SlurmUser=root)"
    return None


@pytest.fixture(scope="module")
def slurm_cluster(tmp_path_factory):
    """A one-node Slurm cluster on 127.0.0.1; yields the env that points clients at it."""
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    t = tmp_path_factory.mktemp("slurm")
    key = t / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    for d in ("state", "spool", "log"):
        (t / d).mkdir()
    host = socket.gethostname()
    sock = t / "munge.sock"
    (t / "plugstack.conf").write_text("")
    conf = t / "slurm.conf"
    conf.write_text(
        "\n".join([
            "ClusterName=gactest", f"SlurmctldHost={host}(127.0.0.1)",
            f"SlurmctldPort={_port()}", f"SlurmdPort={_port()}", "SlurmUser=root", "SlurmdUser=root",
            "AuthType=auth/munge", f"AuthInfo=socket={sock}", "CredType=cred/munge",
            f"StateSaveLocation={t}/state", f"SlurmdSpoolDir={t}/spool",
            f"SlurmctldPidFile={t}/slurmctld.pid", f"SlurmdPidFile={t}/slurmd.pid",
            f"SlurmctldLogFile={t}/log/slurmctld.log", f"SlurmdLogFile={t}/log/slurmd.log",
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU", "SchedulerType=sched/builtin", "MpiDefault=none",
            "ReturnToService=2", "JobCompType=jobcomp/none", "AccountingStorageType=accounting_storage/none",
            "JobAcctGatherType=jobacct_gather/none", f"PlugStackConfig={t}/plugstack.conf",
            f"NodeName={host} NodeAddr=127.0.0.1 CPUs={os.cpu_count()} RealMemory=2000 State=UNKNOWN",
            "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP", "",
        ])
    )  # fmt: skip
    env = {**os.environ, "SLURM_CONF": str(conf)}
    procs: list[subprocess.Popen] = []
    munged_pid = None
    try:
        r = subprocess.run(
            ["munged", "--force", f"--socket={sock}", f"--key-file={key}", f"--pid-file={t}/munged.pid",
             f"--log-file={t}/log/munged.log", f"--seed-file={t}/munge.seed"],
            capture_output=True, text=True,
        )  # fmt: skip
        if r.returncode != 0:
            pytest.skip(f"munged did not start: {(r.stderr or r.stdout).strip()[-200:]}")
        munged_pid = int((t / "munged.pid").read_text().split()[0])
        for cmd in (["slurmctld", "-D", "-i", "-f", str(conf)], ["slurmd", "-D", "-f", str(conf)]):
            log = open(t / "log" / f"{cmd[0]}.out", "w")  # noqa: SIM115 - closed with the process
            procs.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT))
        deadline = time.time() + 60
        while time.time() < deadline:
            r = subprocess.run(["sinfo", "-h", "-o", "%T"], env=env, capture_output=True, text=True)
            if r.returncode == 0 and "idle" in r.stdout:
                break
            time.sleep(0.5)
        else:
            pytest.skip(f"the Slurm node did not come up: {r.stdout.strip()} {r.stderr.strip()[-200:]}")
        yield env
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
        if munged_pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(munged_pid, signal.SIGTERM)


def _cells(d: Path) -> dict[str, str]:
    return {
        json.loads(p.read_text())["id"]: json.loads(p.read_text())["status"]
        for p in (d / "cells").rglob("*.json")
    }


def test_slurm_executor_runs_reports_failures_and_resubmits(slurm_cluster, tmp_path, monkeypatch, capsys):
    from gac.plans.executors import run_plan

    for k, v in slurm_cluster.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).parents[2] / "src"))
    d = tmp_path / "out"
    # 1. a job that dies before gac runs: reported with its log tail, its cells left to re-run
    bad = tmp_path / "bad.toml"
    bad.write_text(PLAN + 'setup = ["echo injected-failure-marker >&2", "exit 3"]\n')
    with pytest.raises(GacError, match="failed"):
        run_plan(bad, d, executor="slurm")
    err = capsys.readouterr().err
    assert "injected-failure-marker" in err  # the job's log tail
    assert _cells(d) == {}
    # 2. the same plan (Slurm resources are not part of its hash) re-submits and completes
    good = tmp_path / "good.toml"
    good.write_text(PLAN)
    res = run_plan(good, d, executor="slurm")
    assert set(res.values()) == {"ok"}
    assert _cells(d) == {
        "tiny-llama/base": "ok",
        "tiny-llama/svd-r0.8-none": "ok",
        "tiny-llama/svd-r0.8-gac": "ok",
    }
    assert list((d / "slurm").rglob("*_log.out"))  # job logs land in the plan directory
    # 3. nothing left: nothing submitted
    assert set(run_plan(good, d, executor="slurm").values()) == {"done"}


def test_slurm_without_controller_refused(tmp_path, monkeypatch):
    pytest.importorskip("submitit")
    if shutil.which("squeue") is None:
        pytest.skip("no squeue on PATH")
    conf = tmp_path / "slurm.conf"
    conf.write_text(f"ClusterName=none\nSlurmctldHost=localhost(127.0.0.1)\nSlurmctldPort={_port()}\n")
    monkeypatch.setenv("SLURM_CONF", str(conf))
    from gac.plans.executors import check_slurm

    with pytest.raises(GacError, match="not reachable"):
        check_slurm()
