"""`gac report` reads the results our tools write and renders Markdown + PNG."""

from __future__ import annotations

import json

import pytest

from gac.cli import main
from gac.errors import GacError
from gac.eval.infer import SweepConfig, Variant, run_sweep, write_results
from gac.plans.report import report
from gac.plans.results import collect
from gac.testing import tiny_model


def test_report_from_sweep_lm_eval_and_ppl(tmp_path):
    cfg = SweepConfig(prefill_batches=(1,), prefill_seqs=(8,), decode_batches=(1,), decode_kv=(8,),
                      prefill_reps=2, decode_reps=3, decode_warmup=1, profile_kernels=False)  # fmt: skip
    res = run_sweep(
        [Variant("baseline", tiny_model), Variant("small", lambda: tiny_model(intermediate=64))], cfg, "cpu"
    )
    write_results(res, tmp_path / "speed", plots=False)
    (tmp_path / "q").mkdir()
    (tmp_path / "q" / "lm_eval.json").write_text(
        json.dumps(
            {"schema": "gac.lm_eval/1", "meta": {"variant": "small"}, "tasks": {"piqa": {"value": 0.625}}}
        )
    )
    (tmp_path / "q" / "ppl.json").write_text(
        json.dumps({"schema": "gac.ppl/1", "ppl": 12.5, "meta": {"variant": "small"}})
    )
    (tmp_path / "q" / "variant.json").write_text(json.dumps({"variant": "small", "pct_aligned": 100.0}))
    rows = collect(tmp_path)
    s = rows["small"]
    assert s["ppl"] == 12.5 and s["tasks"]["piqa"] == 0.625 and s["pct_aligned"] == 100.0
    sp = res["variants"]["small"]["prefill"][0]["speedup"]
    assert s["prefill_speedup"] == pytest.approx(sp)
    assert s["params"] < rows["baseline"]["params"]
    md = report(tmp_path)
    text = md.read_text()
    assert "| small |" in text and "12.500" in text and "0.6250" in text
    assert (tmp_path / "report_speedup.png").stat().st_size > 1000
    assert (tmp_path / "report_quality.png").stat().st_size > 1000


def test_report_errors(tmp_path, capsys):
    with pytest.raises(GacError, match="no gac results"):
        report(tmp_path)
    assert main(["report", str(tmp_path / "missing")]) == 2
    assert "not a directory" in capsys.readouterr().err
