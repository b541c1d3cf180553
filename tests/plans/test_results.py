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


def test_report_shows_peak_memory_per_decode_point_and_the_capacity_point():
    """The report puts each decode point's peak memory beside the dense base's and the capacity point's
    largest batch and tokens/s against the base's, with every try of the search."""
    from types import SimpleNamespace

    from gac.plans.report import memory_lines

    def cell(comp, peaks, cap):
        pts = [{"phase": "decode", "batch": b, "kv": 4096, "status": "ok", "median_ms": 1.0, "peak_mem_gib": p}
               for b, p in peaks]  # fmt: skip
        c = SimpleNamespace(id=f"m/{comp}", model="m", compressor=comp, bench=None)
        inf = {"prefill": [], "decode": pts, "capacity": cap}
        return c, {"status": "ok", "results": {"evals": {"infer": inf}}}

    cap = {"context": 32768, "budget_gib": 78.6, "kv_bytes_per_token": 32768, "max_batch": 72,
           "tokens_per_s": 2418.0, "ms_per_token": 29.8, "peak_mem_gib": 77.4,
           "tries": [{"batch": 62, "status": "ok"}, {"batch": 72, "status": "ok"}, {"batch": 73, "status": "oom"}]}  # fmt: skip
    base = cell("base", [(1, 5.49), (64, 69.37)], cap)
    palu = cell(
        "palu", [(1, 5.41), (64, 37.28)], {**cap, "max_batch": 137, "tokens_per_s": 1564.7, "tries": []}
    )
    failed = (SimpleNamespace(id="m/svd", model="m", compressor="svd", bench=None), {"status": "failed"})
    text = "\n".join(memory_lines("m", [base, palu, failed]))
    assert "| m/palu | 5.41 (5.49) | 37.28 (69.37) |" in text
    assert "| m/base | 32768 | 78.6 | 32,768 | 72 | 2,418 |" in text and "62 ok, 72 ok, 73 oom" in text
    assert "| 137 (1.90×) | 1,565 (0.65×) |" in text and "m/svd" not in text
    assert memory_lines("m", [failed]) == []  # nothing recorded: no section
    assert "timed steps alone" not in text  # cells from before the steady peaks were recorded: one table
    for _, d in (base, palu):  # the timed steps' peaks beside them, where both cells recorded them
        for r, steady in zip(d["results"]["evals"]["infer"]["decode"], (0.02, 1.5), strict=True):
            r["steady_peak_mem_gib"] = r["peak_mem_gib"] - steady
    text = "\n".join(memory_lines("m", [base, palu, failed]))
    assert "| m/palu | 5.41 (5.49) | 37.28 (69.37) |" in text
    assert "timed steps alone" in text and "| m/palu | 5.39 (5.47) | 35.78 (67.87) |" in text
