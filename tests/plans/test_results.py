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


def test_report_marks_a_point_that_fell_back_from_the_default_path():
    """A point timed eagerly (its compile or graph capture failed: ``fallback`` in the record) is not the
    default path's speed: the measured table marks it and names why, and the worst serving shape says so."""
    from types import SimpleNamespace

    from gac.plans.report import _measured_lines, infer_speedups, worst_serving

    def cell(comp, ms, fb=None):
        pts = [{"phase": "decode", "batch": 64, "kv": 4096, "status": "ok", "median_ms": ms, "weight_bytes": 10,
                "kv_bytes": 10, **({"fallback": fb} if fb else {})},
               {"phase": "decode", "batch": 1, "kv": 512, "status": "ok", "median_ms": ms / 2, "weight_bytes": 10,
                "kv_bytes": 1}]  # fmt: skip
        c = SimpleNamespace(id=f"m/{comp}", model="m", compressor=comp, bench=None)
        return c, {
            "status": "ok",
            "results": {"params": 1, "evals": {"infer": {"prefill": [], "decode": pts}}},
        }

    base, comp = cell("base", 5.0), cell("asvd", 11.0, "eager: AssertionError: Guard failed")
    speed = infer_speedups([base, comp])
    sp = speed["m/asvd"]
    assert abs(sp["decode_b64_kv4096"] - 5 / 11) < 1e-9
    assert sp["fallback_decode_b64_kv4096"].startswith("eager") and "fallback_decode_b1_kv512" not in sp
    text = "\n".join(_measured_lines("m", [(base[0], speed["m/base"]), (comp[0], sp)], base[1]))
    assert "0.455 † (" in text and "m/asvd at decode_b64_kv4096: eager: AssertionError" in text
    assert "fallback_" not in text.split("†")[0]  # no column for the mark itself
    cell_rec = {"results": {"predicted_serve": {"decode_b64_kv4096": 1.03, "decode_b1_kv512": 1.1}}}
    assert worst_serving(cell_rec, sp)[2] == "measured († not the default path)"


def test_report_names_cells_timed_on_another_card_than_their_base():
    from gac.plans.report import other_card_lines

    base = {"id": "m/base", "env": {"gpu": "NVIDIA H100 80GB HBM3", "gpu_uuid": "GPU-a"}}
    same = {"id": "m/svd-r0.8-gac", "env": {"gpu_uuid": "GPU-a"}}
    other = {"id": "m/palu-r0.5-gac", "env": {"gpu_uuid": "GPU-b"}}
    old = {"id": "m/asvd-r0.8-gac", "env": {}}  # recorded before the uuid was kept: says nothing
    assert other_card_lines(base, [same, old]) == []
    line = other_card_lines(base, [same, other, old])[0]
    assert "m/palu-r0.5-gac" in line and "m/svd" not in line and "NVIDIA H100" in line
    assert other_card_lines({"id": "m/base", "env": {}}, [other]) == []
