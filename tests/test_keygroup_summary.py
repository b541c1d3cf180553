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
    root = ROOT / "benchmarks/results/h100/palu-default"
    rows = {(r["shape"], r["key_group"]): r for r in (tool.grid_row(root, *g) for g in tool.GRID)}
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
    caps = {c["key_group"]: c for c in (tool.capacity_row(root, sub, kg) for sub, kg in tool.CAPACITY)}
    assert round(caps[2]["tokens_per_s_vs_dense"], 2) == 0.95 and caps[2]["palu"]["batch"] == 139
    assert round(caps[1]["tokens_per_s_vs_dense"], 2) == round(caps[4]["tokens_per_s_vs_dense"], 2) == 0.86
