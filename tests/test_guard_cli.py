"""The latency guard end to end on a tiny model: ``gac compress`` refuses a budget it cannot meet
without a slowdown and names one that it can, ``--allow-slower`` proceeds and says where it is
slower, and the serving shapes round-trip through ``gac_config.json`` and ``gac analyze``."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest

from gac.api import CompressConfig
from gac.cli import main
from gac.hardware.profile import default_profile
from gac.testing import char_tokenizer, tiny_model

SERVE = "decode:1x64,prefill:1x16"


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("guard")
    tiny = root / "tiny"
    tiny_model("llama").save_pretrained(tiny)
    char_tokenizer().save_pretrained(tiny)
    # synthetic GPU: 20 us per GEMM launch, 1 GB/s: on the tiny dims a factorized weight pays its
    # second launch back only well below its break-even rank
    prof = dataclasses.replace(
        default_profile("bfloat16"),
        id="synthetic-guard",
        measured=True,
        launch_us=20.0,
        copy_gbps=1.0,
        aux_us=0.5,
        latency_fit={"guard_margin": {"value": 0.0, "source": "synthetic: the model is exact here"}},
    )
    pf = root / "synthetic.json"
    prof.save(pf)
    return {"tiny": str(tiny), "profile": str(pf), "root": root}


def _compress(setup, out, *extra) -> int:
    return main(["compress", setup["tiny"], "-c", "svd", "--profile", setup["profile"], "--serve", SERVE,
                 "--out", str(out), *extra])  # fmt: skip


def test_infeasible_budget_refused_naming_a_feasible_one(setup, capsys):
    out = setup["root"] / "refused"
    assert _compress(setup, out, "-r", "0.9") == 2
    err = capsys.readouterr().err
    line = [x for x in err.splitlines() if x.startswith("error:")]
    assert len(line) == 1 and "cannot be met without a slowdown" in line[0]
    assert "decode_b1_kv64" in line[0] or "prefill_b1_s16" in line[0]
    assert not out.exists()  # stopped before any factorization, nothing written
    named = re.search(r"a deeper one does: [0-9.]+% \(--param-ratio ([0-9.]+)\)", " ".join(err.split()))
    assert named, err
    ok = setup["root"] / "named"
    assert _compress(setup, ok, "-r", named.group(1)) == 0  # the ratio it names is met
    rep = json.loads((ok / "gac_report.json").read_text())["allocation"]
    assert rep["guard"]["guarded"] and rep["guard"]["slower"] == []
    assert all(r["speedup"] >= 1.0 for r in rep["serve"]) and rep["cost"] <= rep["budget"]


def test_allow_slower_proceeds_and_names_the_shapes(setup, capsys):
    out = setup["root"] / "slower"
    assert _compress(setup, out, "-r", "0.9", "--allow-slower") == 0
    rep = json.loads((out / "gac_report.json").read_text())["allocation"]
    assert rep["guard"] == {"guarded": False, "allow_slower": True, "slower": rep["guard"]["slower"]}
    assert rep["guard"]["slower"] and rep["worst_serve_speedup"] < 1.0
    text = " ".join(capsys.readouterr().out.split())
    assert "predicted slower than dense at" in text and rep["guard"]["slower"][0] in text


def test_serve_round_trips_through_gac_config_and_analyze(setup, capsys):
    out = setup["root"] / "rt"
    assert _compress(setup, out, "-r", "0.5") == 0
    cfg = json.loads((out / "gac_config.json").read_text())
    assert cfg["serve"] == SERVE and cfg["compress_config"]["serve"] == SERVE
    assert cfg["guard"]["guarded"] and set(cfg["predicted_serve"]) == {"decode_b1_kv64", "prefill_b1_s16"}
    back = CompressConfig.from_dict(cfg["compress_config"])
    assert back.serve == SERVE and back.to_dict() == cfg["compress_config"]
    capsys.readouterr()
    assert main(["analyze", str(out), "--profile", setup["profile"]]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert f"serving shapes: {SERVE}; guarded" in text


@pytest.mark.gpu
def test_verify_times_the_serving_shapes_against_dense(setup, tmp_path):
    """``--verify`` on a GPU: every serving shape timed against dense on the default path, recorded
    in gac_report.json beside the prediction (the synthetic profile is only for the allocation)."""
    out = tmp_path / "verified"
    assert _compress(setup, out, "-r", "0.5", "--device", "cuda", "--dtype", "bfloat16", "--verify") == 0
    v = json.loads((out / "gac_report.json").read_text())["verify"]
    assert v["schema"] == "gac.verify/1" and [r["point"] for r in v["shapes"]] == [
        "decode_b1_kv64",
        "prefill_b1_s16",
    ]
    for r in v["shapes"]:
        assert (
            r["status"] == "ok" and r["speedup"] > 0 and r["interval"][0] <= r["speedup"] <= r["interval"][1]
        )
        assert r["slower"] == (r["interval"][1] < 1.0) and r["predicted_speedup"] is not None
