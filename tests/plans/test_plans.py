"""gac run PLAN.toml: expansion, bad input, skip of finished cells, resume after SIGKILL, report."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

try:  # Python 3.11+
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

from gac.errors import GacError
from gac.plans.executors import run_local
from gac.plans.schema import load_plan, parse_plan
from gac.plans.store import open_plan_dir, status_table

TINY = """
[plan]
name = "tiny"
[axes]
models = ["tiny:llama"]
compressors = ["svd"]
ratios = [0.8, 0.7]
align = ["none", "knapsack", "gac"]
[compress]
profile = "h200-bfloat16"
allow_slower = true  # tiny dims: every factorization is predicted slower on the H200
[[evals]]
kind = "ppl"
source = "britannica"
seq_len = 64
windows = 1
[[evals]]
kind = "predict"
"""


def _plan(tmp_path: Path, text: str = TINY) -> Path:
    p = tmp_path / "plan.toml"
    p.write_text(text)
    return p


def _results(d: Path) -> dict[str, object]:
    """Every cell's deterministic part (status + results), by cell id."""
    out = {}
    for p in sorted((d / "cells").rglob("*.json")):
        rec = json.loads(p.read_text())
        out[rec["id"]] = (rec["status"], rec["input_hash"], rec["results"])
    return out


def test_expansion_groups_and_registry(tmp_path):
    plan = load_plan(_plan(tmp_path))
    cells = plan.cells()
    assert len(cells) == 1 + 2 * 3  # base + ratios x aligns
    assert len({c.id for c in cells}) == len(cells)
    groups = plan.groups()
    assert list(groups) == ["tiny-llama/base", "tiny-llama/svd-r0.8", "tiny-llama/svd-r0.7"]
    assert [c.align for c in groups["tiny-llama/svd-r0.8"]] == ["none", "knapsack", "gac"]
    from gac.compressors.base import available_compressors

    star = load_plan(_plan(tmp_path, TINY.replace('["svd"]', '["*"]')))
    assert star.compressors == available_compressors()  # discovered, never a list


@pytest.mark.parametrize(
    "old, new, msg",
    [
        ('name = "tiny"', 'name = "tiny"\ncolour = 1', "unknown key 'colour'"),
        ('["svd"]', '["svd", "zip"]', "unknown compressor 'zip'"),
        ('["tiny:llama"]', '["no-such-model"]', "unknown model"),
        ('["tiny:llama"]', '["tiny:gpt9"]', "unknown tiny model family"),
        ('kind = "ppl"', 'kind = "hellaswag-ish"', "unknown kind"),
        ("[0.8, 0.7]", "[0.8, 1.5]", "strictly between 0 and 1"),
        ("windows = 1", "windows = 0", "positive integer"),
        ('"none", "knapsack"', '"none", "sideways"', "unknown align strategy"),
        ('profile = "h200-bfloat16"', 'profile = "h200-bfloat16"\nn_samples = -3', "n-samples"),
        ('profile = "h200-bfloat16"', "[compress.options.svd]\nbogus = 1", "bogus"),
    ],
)
def test_bad_plans_refused_before_work(tmp_path, old, new, msg):
    assert old in TINY
    with pytest.raises(GacError, match=msg):
        load_plan(_plan(tmp_path, TINY.replace(old, new)))


def test_plan_dir_of_another_plan_refused(tmp_path):
    d = tmp_path / "out"
    open_plan_dir(load_plan(_plan(tmp_path)), d)
    other = parse_plan({"axes": {"models": ["tiny:llama"], "compressors": ["svd"], "ratios": [0.5]}})
    with pytest.raises(GacError, match="another plan"):
        open_plan_dir(other, d)
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "x.txt").write_text("mine")
    with pytest.raises(GacError, match="not a plan directory"):
        open_plan_dir(other, tmp_path / "junk")


def test_run_skips_finished_and_reports(tmp_path):
    plan = load_plan(_plan(tmp_path))
    d = open_plan_dir(plan, tmp_path / "out")
    first = run_local(plan, d)
    assert set(first.values()) == {"ok"}
    stamps = {p: p.stat().st_mtime_ns for p in (d / "cells").rglob("*.json")}
    assert len(stamps) == 7
    again = run_local(plan, d)
    assert set(again.values()) == {"done"}  # second run does no work
    assert {p: p.stat().st_mtime_ns for p in (d / "cells").rglob("*.json")} == stamps
    res = _results(d)
    gac = res["tiny-llama/svd-r0.8-gac"][2]
    assert gac["pct_aligned"] == 100.0 and gac["cost"] <= gac["budget"]
    assert res["tiny-llama/svd-r0.8-knapsack"][2]["cost"] <= gac["budget"]
    # shared calibration: one plan per group, so every align of a group spends the same budget
    assert {res[f"tiny-llama/svd-r0.8-{a}"][2]["budget"] for a in ("none", "knapsack", "gac")} == {
        gac["budget"]
    }
    # a failed cell is re-run; the others are not
    rec_p = d / "cells" / "tiny-llama" / "svd-r0.7-gac.json"
    rec = json.loads(rec_p.read_text())
    rec["status"], rec["error"] = "failed", "injected"
    rec_p.write_text(json.dumps(rec))
    st = {cid: s for _, cid, s in status_table(plan, d)}
    assert st["tiny-llama/svd-r0.7-gac"] == "failed"
    third = run_local(plan, d)
    assert third["tiny-llama/svd-r0.7-gac"] == "ok"
    assert sum(v == "ok" for v in third.values()) == 1
    assert _results(d) == res

    from gac.plans.report import report

    md = report(d)
    text = md.read_text()
    assert "| svd | 0.8 | gac |" in text and "| base | 1 | base |" in text
    assert list(d.glob("frontier_*.png"))


def test_sigkill_midway_then_rerun_is_identical(tmp_path):
    plan_file = _plan(tmp_path)
    ref = tmp_path / "ref"
    plan = load_plan(plan_file)
    run_local(plan, open_plan_dir(plan, ref))
    d = tmp_path / "killed"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2] / "src"), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "gac", "run", str(plan_file), "--out", str(d)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        if (d / "cells").is_dir() and len(list((d / "cells").rglob("*.json"))) >= 2:
            break
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    partial = len(list((d / "cells").rglob("*.json")))
    assert partial >= 2
    rest = run_local(plan, open_plan_dir(plan, d))
    assert sum(v == "done" for v in rest.values()) == partial  # finished cells not redone
    assert _results(d) == _results(ref)


@pytest.mark.parametrize("name", ["demo", "paper"])
def test_shipped_plans_expand_and_dry_run(tmp_path, name):
    from gac.plans.executors import run_plan

    plan_file = Path(__file__).parents[2] / "plans" / f"{name}.toml"
    plan = load_plan(plan_file)
    assert {"none", "knapsack", "gac"} <= set(plan.aligns)
    states = run_plan(plan_file, tmp_path / "out", dry_run=True)
    assert len(states) == len(plan.cells()) and set(states.values()) == {"pending"}
    assert not (tmp_path / "out").exists()  # a dry run writes nothing
    if name == "paper":
        assert all("source" in v for v in plan.published.values())  # published values carry their source


REPO = Path(__file__).parents[2]


@pytest.mark.parametrize("path", sorted(REPO.glob("plans/*.toml")), ids=lambda p: p.name)
def test_every_shipped_plan_parses(path):
    plan = load_plan(path)
    assert plan.cells() and plan.hash == parse_plan(tomllib.loads(path.read_text()), str(path)).hash


def test_committed_plan_directories_keep_loading():
    """Saved plan directories load with the hash they were written under, and each cell file they
    hold reads back as a cell of that plan with the same inputs (done or failed, never stale)."""
    from gac.plans.store import cell_path, plan_from_dir, read_cell

    dirs = sorted(p.parent for p in (REPO / "benchmarks" / "results").rglob("plan.json"))
    assert dirs, "no committed plan directory"
    done = 0
    for d in dirs:
        plan = plan_from_dir(d)
        assert plan.hash == json.loads((d / "plan.json").read_text())["plan_hash"], d
        for _, cid, state in status_table(plan, d):
            cell = next(c for c in plan.cells() if c.id == cid)
            if cell_path(d, cell).exists():
                assert read_cell(d, cell) is not None and state in ("done", "failed"), (d, cid, state)
                done += state == "done"
    assert done >= 1


def test_star_axis_keeps_plan_identity_when_compressors_join(tmp_path, monkeypatch):
    from gac.compressors import base as registry

    star = TINY.replace('["svd"]', '["*"]')
    plan = load_plan(_plan(tmp_path, star))
    d = open_plan_dir(plan, tmp_path / "out")
    monkeypatch.setitem(registry._REGISTRY, "zz-new", registry._REGISTRY["svd"])
    grown = load_plan(_plan(tmp_path, star))
    assert "zz-new" in grown.compressors and grown.hash == plan.hash
    open_plan_dir(grown, d)  # same plan: its new cells are simply pending
    assert len(grown.cells()) == len(plan.cells()) + 2 * 3


def test_last_cell_of_a_group_is_evaluated_without_the_plan_or_the_dense_model(tmp_path, monkeypatch):
    """The calibrated plan (SVD-LLM's whitening state: tens of GiB on a GPU) and the dense model are
    freed before the group's last cell is evaluated; earlier cells still share them."""
    import gc
    import weakref

    import gac.api
    import gac.plans.cells as E

    refs: list[weakref.ref] = []
    real_plan, real_eval = gac.api.plan, E._evaluate

    def plan(model, *a, **k):  # noqa: ANN001, ANN202
        p = real_plan(model, *a, **k)
        refs.extend([weakref.ref(p), weakref.ref(model)])
        return p

    alive = []

    def evaluate(plan_, cell, *a, **k):  # noqa: ANN001, ANN202
        gc.collect()
        if cell.compressor != "base":
            alive.append((cell.align, [r() is not None for r in refs]))
        return real_eval(plan_, cell, *a, **k)

    monkeypatch.setattr(gac.api, "plan", plan)
    monkeypatch.setattr(E, "_evaluate", evaluate)
    text = TINY.replace("ratios = [0.8, 0.7]", "ratios = [0.8]").replace(
        '"none", "knapsack", "gac"', '"none", "gac"'
    )
    plan_ = load_plan(_plan(tmp_path, text))
    out = run_local(plan_, open_plan_dir(plan_, tmp_path / "out"))
    assert set(out.values()) == {"ok"}
    assert alive == [("none", [True, True]), ("gac", [False, False])]


def test_serving_frontier_in_the_report(tmp_path):
    """``gac run`` records each allocation's per-shape prediction and guard; ``gac report`` draws
    perplexity against the worst serving-shape speedup (none, gac, gac without its guard)."""
    from gac.cli import main

    text = (
        TINY.replace("ratios = [0.8, 0.7]", "ratios = [0.7]")
        .replace('align = ["none", "knapsack", "gac"]', 'align = ["none", "gac", "gac-allow-slower"]')
        .replace("allow_slower = true", 'serve = "prefill:1x64,decode:1x64"')
    )
    plan = load_plan(_plan(tmp_path, text))
    d = open_plan_dir(plan, tmp_path / "out")
    st = run_local(plan, d)
    assert st["tiny-llama/svd-r0.7-gac-allow-slower"] == "ok" and st["tiny-llama/svd-r0.7-none"] == "ok"
    assert st["tiny-llama/svd-r0.7-gac"] == "failed"  # tiny dims: slower than dense on the H200, refused
    cell = json.loads((d / "cells" / "tiny-llama" / "svd-r0.7-gac.json").read_text())
    assert "cannot be met without a slowdown" in cell["error"]
    free = json.loads((d / "cells" / "tiny-llama" / "svd-r0.7-gac-allow-slower.json").read_text())["results"]
    assert free["serve"] == "prefill:1x64,decode:1x64" and free["guard"]["allow_slower"]
    assert set(free["predicted_serve"]) == {"prefill_b1_s64", "decode_b1_kv64"} and free["guard"]["slower"]
    assert free["options"] == {"svd_dtype": None}  # the compressor's options, as it ran
    assert main(["report", str(d)]) == 0
    md = (d / "report.md").read_text()
    assert "Worst serving-shape speedup" in md and "| tiny-llama/svd-r0.7-gac-allow-slower |" in md
    assert (d / "serving_tiny-llama.png").stat().st_size > 0


TWO_MODELS = """
[plan]
name = "two"
device = "cpu"
[axes]
models = ["tiny:llama", "tiny:qwen2"]
compressors = ["svd"]
ratios = [0.8]
align = ["gac"]
[compress]
allow_slower = true
[[evals]]
kind = "predict"
"""


def test_run_on_several_gpus_keeps_each_models_cells_on_one(tmp_path, capsys):
    """``gac run --gpus 0,1``: one process per GPU (its CUDA_VISIBLE_DEVICES), each model's groups (its dense
    base with them) in one process; the cells land in one directory, a re-run skips them; bad --gpus refused."""
    from gac.plans.executors import run_plan, share_models

    plan_file = _plan(tmp_path, TWO_MODELS)
    d = tmp_path / "out"
    for bad in ("0,0", "x", "", "-1"):
        with pytest.raises(GacError, match="--gpus takes distinct GPU indices"):
            run_plan(plan_file, d, gpus=bad)
    with pytest.raises(GacError, match="local executor"):
        run_plan(plan_file, d, executor="slurm", gpus="0,1")
    assert not d.exists()  # refused before any work
    share = share_models(load_plan(plan_file).groups(), [0, 1, 2])
    assert sorted(len(g) for g in share.values()) == [2, 2] and 2 not in share
    res = run_plan(plan_file, d, gpus="0,1,2")
    assert set(res.values()) == {"ok"} and len(res) == 4
    assert "GPU(s) 2 idle" in capsys.readouterr().err
    for gpu, gids in share.items():
        log = (d / "gpus" / f"gpu{gpu}.log").read_text()
        assert log.startswith(f"CUDA_VISIBLE_DEVICES={gpu} ")
        assert all(f"--only {g}" in log.splitlines()[0] for g in gids)
        assert {g.split("/")[0] for g in gids} == {gids[0].split("/")[0]}  # one model per process
    assert set(run_plan(plan_file, d, gpus="0,1").values()) == {"done"}
