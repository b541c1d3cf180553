"""`python -m gac.llm_run` / `gac.llm_eval` and `gac eval infer|lm_eval`: variants, errors, outputs."""

from __future__ import annotations

import json

import pytest

from gac.cli import main as gac_main
from gac.errors import GacError
from gac.llm_eval import main as eval_main
from gac.llm_run import main as run_main
from gac.plans.variants import parse_variant
from gac.testing import tiny_model

GRID = ["--prefill-batches", "1", "--prefill-seqs", "8", "--decode-batches", "1", "--decode-kv", "40",
        "--prefill-reps", "2", "--decode-reps", "3", "--device", "cpu"]  # fmt: skip


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny")
    tiny_model("llama").save_pretrained(d)
    return d


def test_parse_variant(tmp_path):
    assert parse_variant("baseline").kind == "baseline"
    s = parse_variant("asvd:0.85:gac")
    assert (s.kind, s.compressor, s.ratio, s.align) == ("spec", "asvd", 0.85, "gac")
    with pytest.raises(GacError, match=r"must lie in \(0, 1\)"):
        parse_variant("asvd:1.5:gac")
    (tmp_path / "empty").mkdir()
    with pytest.raises(GacError, match="not a model directory"):
        parse_variant(str(tmp_path / "empty"))
    with pytest.raises(GacError, match="neither 'baseline'"):
        parse_variant("what?")


def test_llm_run_baseline_and_dir_variant(tmp_path, model_dir):
    out = tmp_path / "run"
    assert run_main(["--variant", str(model_dir), "--suite", "infer_sweep", "--baseline-model-id", str(model_dir),
                     "--out", str(out), *GRID]) == 0  # fmt: skip
    res = json.loads((out / "infer.json").read_text())
    assert list(res["variants"]) == ["baseline", model_dir.name]  # dense baseline first, same process
    assert res["variants"][model_dir.name]["decode"][0]["status"] == "ok"
    assert (out / "infer.csv").exists() and (out / "prefill_latency.png").exists()
    # results are not overwritten silently
    assert (
        run_main(["--variant", "baseline", "--baseline-model-id", str(model_dir), "--out", str(out), *GRID])
        == 2
    )


def test_gac_eval_infer_fuse_and_errors(tmp_path, model_dir, capsys):
    out = tmp_path / "fused"
    assert (
        gac_main(["eval", "infer", "--baseline-model-id", str(model_dir), "--out", str(out), "--fuse", *GRID])
        == 0
    )
    res = json.loads((out / "infer.json").read_text())
    assert list(res["variants"]) == ["baseline"]
    assert res["options"]["fuse"] is True
    # the fast path is the default: fused unless --no-fuse; compile falls back on CPU with a notice
    cap = capsys.readouterr()
    assert "--compile needs CUDA" not in cap.out + cap.err  # no request, no notice
    out2 = tmp_path / "unfused"
    assert (
        gac_main(
            [
                "eval",
                "infer",
                "--baseline-model-id",
                str(model_dir),
                "--out",
                str(out2),
                "--no-fuse",
                "--compile",
                *GRID,
            ]
        )
        == 0
    )
    res2 = json.loads((out2 / "infer.json").read_text())
    assert res2["options"]["fuse"] is False
    cap = capsys.readouterr()
    assert "--compile needs CUDA" in cap.out + cap.err
    p = res2["variants"]["baseline"]["prefill"][0]
    assert p["status"] == "ok" and p["compiled"] is False and p["setup_s"] >= 0
    assert (
        gac_main(
            [
                "eval",
                "infer",
                "--baseline-model-id",
                str(model_dir),
                "--out",
                str(tmp_path / "g"),
                "--graphs",
                *GRID,
            ]
        )
        == 0
    )  # graphs on CPU: a one-line notice, uncaptured steps, labelled
    assert "notice: --graphs needs CUDA" in capsys.readouterr().err
    g = json.loads((tmp_path / "g" / "infer.json").read_text())
    assert all(not r["graphs"] for v in g["variants"].values() for r in v["prefill"] + v["decode"])
    bad = tmp_path / "notamodel"
    bad.mkdir()
    assert (
        run_main(
            [
                "--variant",
                str(bad),
                "--baseline-model-id",
                str(model_dir),
                "--out",
                str(tmp_path / "x"),
                *GRID,
            ]
        )
        == 2
    )
    assert "not a model directory" in capsys.readouterr().err


def test_llm_eval_unknown_task_fails_before_loading(tmp_path, capsys):
    pytest.importorskip("lm_eval")
    rc = eval_main(["--variant", "baseline", "--suite", "lm_eval", "--baseline-model-id", "no/such-model-xyz",
                    "--out", str(tmp_path / "e"), "--tasks", "no_such_task_xyz"])  # fmt: skip
    assert rc == 2
    assert "unknown lm-eval task(s): no_such_task_xyz" in capsys.readouterr().err
