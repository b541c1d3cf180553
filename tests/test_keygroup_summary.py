"""The PaLU key-group record's numbers, re-derived from its committed cells by its summary tool."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _tool():
    spec = importlib.util.spec_from_file_location(
        "palu_keygroup_summary", ROOT / "benchmarks/tools/palu_keygroup_summary.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_key_group_record_says_what_its_cells_hold():
    tool = _tool()
    root, runs = ROOT / "benchmarks/results/h100/palu-default", tool.RUNS["h100"]
    rows = {(r["shape"], r["key_group"]): r for r in (tool.grid_row(root, *g) for g in runs["grid"])}
    # the README's counts: points at >= 0.9x dense and within the memory bound
    assert {k: r["at_least_0.9"] for k, r in rows.items()} == {
        ("shape-llama3-8b-8", 4): 3, ("shape-llama3-8b-8", 2): 6, ("shape-llama3-8b-8", 1): 3,
        ("shape-qwen2.5-7b-8", 4): 3, ("shape-qwen2.5-7b-8", 2): 1, ("shape-qwen2.5-7b-8", 1): 7,
    }  # fmt: skip
    assert sum(r["memory_within"] for k, r in rows.items() if k[1] == 4) == 18
    assert sum(r["memory_within"] for k, r in rows.items() if k[1] != 4) == 34
    assert all(r["points"] == 9 for r in rows.values())
    # none reaches 1.1x from 16 sequences
    assert max(x["speedup"] for r in rows.values() for x in r["decode"] if x["batch"] >= 16) < 1.0
    caps = {c["key_group"]: c for c in (tool.capacity_row(root, *c) for c in runs["capacity"])}
    assert round(caps[2]["tokens_per_s_vs_dense"], 2) == 0.95 and caps[2]["palu"]["batch"] == 139
    assert round(caps[1]["tokens_per_s_vs_dense"], 2) == round(caps[4]["tokens_per_s_vs_dense"], 2) == 0.86


def test_the_h200_record_of_key_and_value_groups_says_what_its_cells_hold():
    tool = _tool()
    root, runs = ROOT / "benchmarks/results/h200/palu-default", tool.RUNS["h200"]
    rows = {
        (r["shape"][6:11], r["key_group"], r["value_group"]): r
        for r in (tool.grid_row(root, *g) for g in runs["grid"])
    }
    # the README's counts (calls 34-40, Llama's default call 56): points at >= 0.9x dense, and within the memory bound
    assert {k: r["at_least_0.9"] for k, r in rows.items()} == {
        ("llama", 4, 4): 3, ("llama", 2, 4): 3, ("llama", 2, 2): 9,
        ("qwen2", 4, 4): 3, ("qwen2", 1, 4): 3, ("qwen2", 2, 2): 9,
    }  # fmt: skip
    assert {k: r["memory_within"] for k, r in rows.items() if k[1:] == (2, 2)} == {
        ("llama", 2, 2): 9,
        ("qwen2", 2, 2): 9,
    }

    # >= 1.1x from 16 sequences past 16k: Llama at 3 of its 4 points with groups of 2, Qwen at none
    def fast(k):
        return sum(x["speedup"] >= 1.1 for x in rows[k]["decode"] if x["batch"] >= 16 and x["kv"] >= 16384)

    assert (fast(("llama", 2, 2)), fast(("qwen2", 2, 2)), fast(("llama", 4, 4)), fast(("qwen2", 4, 4))) == (
        3,
        0,
        0,
        0,
    )
    # the step from 16 sequences: every point of groups of 2 above every point of the default, per shape
    for shape in ("llama", "qwen2"):
        kv2 = min(x["speedup"] for x in rows[shape, 2, 2]["decode"] if x["batch"] >= 16)
        assert kv2 > max(x["speedup"] for x in rows[shape, 4, 4]["decode"] if x["batch"] >= 16)
    caps = {
        (c["key_group"], c["value_group"]): c for c in (tool.capacity_row(root, *c) for c in runs["capacity"])
    }
    assert caps[2, 2]["palu"]["batch"] == 262 and caps[2, 2]["dense"]["batch"] == 132
    assert round(caps[2, 2]["tokens_per_s_vs_dense"], 2) == 1.65  # call 55: two warpgroups at key rank 128
    assert round(caps[4, 4]["tokens_per_s_vs_dense"], 2) == 0.88
