"""Plan cell kinds beyond compression: kernel benches, the infer eval, shape models, --only, published comparisons."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gac.errors import GacError
from gac.plans.executors import run_local
from gac.plans.schema import load_plan, parse_plan
from gac.plans.store import open_plan_dir, status_table

PLAN = """
[plan]
name = "kinds"
[axes]
models = ["tiny:llama", "shape:llama3-8b:1:8"]
compressors = ["svd"]
ratios = [0.8]
align = ["none", "gac"]
[compress]
profile = "h200-bfloat16"
allow_slower = true  # tiny dims: every factorization is predicted slower on the H200
n_samples = 2
seq_len = 32
[[evals]]
kind = "ppl"
models = ["tiny:llama"]
seq_len = 32
windows = 1
[[evals]]
kind = "predict"
[[evals]]
kind = "infer"
models = ["shape:llama3-8b:1:8"]
prefill_batches = [1]
prefill_seqs = [16]
decode_batches = [1]
decode_kv = [16]
prefill_reps = 2
decode_reps = 2
[[benches]]
experiment = "padding_rescue"
dims = "21"
[published.rescue]
source = "made up for the test"
[[published.rescue.compare]]
label = "gemm pad"
value = 2.0
cell = "kernels/padding_rescue"
field = "summary.speedup"
where = { variant = "original", group = "gemm_n 21" }
[[published.rescue.compare]]
label = "gac prefill speedup"
value = 1.5
cell = "shape-llama3-8b-1-8/svd-r0.8-gac"
field = "speedup.prefill_b1_s16"
[[published.rescue.compare]]
label = "ratio of two points"
value = 1.0
cell = "kernels/padding_rescue"
field = "records.median_ms"
where = { group = "gemm_n 21", variant = "pad8" }
over = { where = { group = "gemm_n 21", variant = "original" } }
"""


def _plan(tmp_path: Path, text: str = PLAN) -> Path:
    p = tmp_path / "plan.toml"
    p.write_text(text)
    return p


def test_shape_specs():
    from gac.models.shapes import parse_shape_spec, shape_config, shape_model

    assert parse_shape_spec("smollm2") is None
    assert parse_shape_spec("shape:llama3-8b") == ("llama3-8b", None, 1)
    cfg = shape_config("shape:qwen2.5-7b:3:4")
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.num_key_value_heads) == (3, 896, 1)
    for bad, msg in [("shape:gpt9", "unknown model shape"), ("shape:llama3-8b:33", "LAYERS"),
                     ("shape:llama3-8b:1:3", "SCALE"), ("shape:llama3-8b:x", "unknown model shape")]:  # fmt: skip
        with pytest.raises(GacError, match=msg):
            parse_shape_spec(bad)
    a, tok = shape_model("shape:llama3-8b:1:8")
    b, _ = shape_model("shape:llama3-8b:1:8")
    assert a.config.gac_init_device == "cpu"
    assert all(
        x.equal(y) for x, y in zip(a.parameters(), b.parameters(), strict=True)
    )  # seeded: same weights
    assert a.config.intermediate_size == 14336 // 8 and tok("ab")["input_ids"]


def test_plan_without_benches_keeps_its_hash(tmp_path):
    base = {"axes": {"models": ["tiny:llama"], "compressors": ["svd"], "ratios": [0.5]}}
    p = parse_plan(base)
    assert "benches" not in p.to_dict()  # plan directories written before [[benches]] existed stay valid
    q = parse_plan({**base, "benches": [{"experiment": "gemv"}]})
    assert q.hash != p.hash and [c.id for c in q.cells()][0] == "kernels/gemv"


@pytest.mark.parametrize(
    "old, new, msg",
    [
        ('experiment = "padding_rescue"', 'experiment = "warp_drive"', "unknown experiment 'warp_drive'"),
        ('dims = "21"', 'dims = "21"\nheads = 0', "heads must be a positive integer"),
        ('dims = "21"', 'dims = "21"\nspeed = 1', "unknown key 'speed'"),
        ('dims = "21"', 'dims = "x:y"', "benches"),
        ('dims = "21"', 'dims = "21"\n[[benches]]\nexperiment = "padding_rescue"', "unique"),
        ('models = ["tiny:llama"]\nseq_len', 'models = ["smollm2"]\nseq_len', "not on the \\[axes\\] models"),
        ("prefill_seqs = [16]", "prefill_seqs = [0]", "list of positive integers"),
        ("decode_reps = 2", "decode_reps = 2\ncompile = 1", "true or false"),
        ('"shape:llama3-8b:1:8"]\ncompressors', '"shape:llama3-8b:99"]\ncompressors', "LAYERS"),
    ],
)
def test_bad_kinds_refused_before_work(tmp_path, old, new, msg):
    assert old in PLAN
    with pytest.raises(GacError, match=msg):
        load_plan(_plan(tmp_path, PLAN.replace(old, new)))


def test_benches_infer_only_and_report(tmp_path):
    from gac.plans.executors import run_plan
    from gac.plans.report import report

    plan_file = _plan(tmp_path)
    plan = load_plan(plan_file)
    d = tmp_path / "out"
    with pytest.raises(GacError, match="matches no cell"):
        run_plan(plan_file, d, only=["nothing/*"])
    # one machine runs the kernels and the shape model, another the rest, into one plan directory
    first = run_plan(plan_file, d, only=["kernels/*", "shape-*"])
    assert set(first.values()) == {"ok"} and "tiny-llama/base" not in first
    assert {cid: s for _, cid, s in status_table(plan, d)}["tiny-llama/base"] == "pending"
    rest = run_local(plan, open_plan_dir(plan, d))
    assert sum(v == "ok" for v in rest.values()) == 3 and sum(v == "done" for v in rest.values()) == 4

    bench = json.loads((d / "cells" / "kernels" / "padding_rescue.json").read_text())
    assert bench["status"] == "ok" and bench["results"]["experiment"] == "padding_rescue"
    assert bench["results"]["points_ok"] == bench["results"]["points"] > 0
    assert (d / "kernels" / "padding_rescue").is_dir() and bench["results"]["records"]
    shape_gac = json.loads((d / "cells" / "shape-llama3-8b-1-8" / "svd-r0.8-gac.json").read_text())
    ev = shape_gac["results"]["evals"]
    assert (
        "ppl:britannica" not in ev and ev["infer"]["prefill"][0]["status"] == "ok"
    )  # eval filtered by model
    assert ev["infer"]["decode"][0]["status"] == "ok"
    assert ev["infer"]["fused"] == 2  # q/k/v and gate/up of the one layer: the default gac eval infer path
    tiny = json.loads((d / "cells" / "tiny-llama" / "svd-r0.8-gac.json").read_text())
    assert "infer" not in tiny["results"]["evals"] and tiny["results"]["evals"]["ppl:britannica"]["ppl"] > 1

    text = report(d).read_text()
    assert "## Kernel-level experiments" in text and "### padding_rescue" in text
    assert "| shape-llama3-8b-1-8/base | 1.000 (1.000) | 1.000 (1.000) |" in text
    # the speed plot of the shape model (the only model with compressed infer cells)
    assert [p.name for p in d.glob("speedup_*.png")] == ["speedup_shape-llama3-8b-1-8.png"]
    assert "![speedup_shape-llama3-8b-1-8.png](speedup_shape-llama3-8b-1-8.png)" in text
    rows = {r.split(" | ")[1]: r for r in text.splitlines() if r.startswith("| rescue |")}
    assert rows["gemm pad"].split(" | ")[3] == "1"  # the original variant's speedup is 1 by definition
    assert rows["gac prefill speedup"].split(" | ")[3] not in ("not run", "no such value")
    ratio = float(rows["ratio of two points"].split(" | ")[3])
    recs = {r["variant"]: r["median_ms"] for r in bench["results"]["records"] if r["group"] == "gemm_n 21"}
    assert ratio == pytest.approx(recs["pad8"] / recs["original"], rel=1e-2)


def test_lookup_and_published_rows():
    from gac.plans.report import lookup, published_rows

    res = {"c": {"summary": [{"g": "a", "x": 2.0}, {"g": "b", "x": 4.0}], "pct_aligned": 50.0}}
    assert lookup(res["c"], "summary.x", {"g": "b"}) == 4.0
    assert lookup(res["c"], "summary.x") is None  # ambiguous without where
    pub = {"t": {"source": "s", "compare": [
        {"label": "ratio", "value": 2.0, "cell": "c", "field": "summary.x", "where": {"g": "b"},
         "over": {"where": {"g": "a"}}},
        {"label": "missing cell", "value": 1.0, "cell": "zz", "field": "pct_aligned"},
        {"label": "missing value", "value": 1.0, "cell": "c", "field": "nope"},
    ]}}  # fmt: skip
    rows = published_rows(pub, res)
    assert rows[0].split(" | ")[2:5] == ["2", "2", "1.00"]
    assert "not run" in rows[1] and "no such value" in rows[2]
