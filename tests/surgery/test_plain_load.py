"""Repaired directories load with plain ``AutoModelForCausalLM.from_pretrained`` (no gac import).

head_dim d -> d' stays exact in a plain config: ``rope_theta' = rope_theta^(d'/d)`` keeps every
original rotary frequency and q is scaled by ``sqrt(d'/d)`` to keep the softmax scale ``1/sqrt(d)``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import torch
from transformers import AutoModelForCausalLM

from gac.surgery.repair import load_repaired, repair_, save_repaired
from gac.testing import tiny_config, tiny_model

TOL = 1e-5

_PLAIN = textwrap.dedent(
    """
    import sys, torch
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32).eval()
    ref = torch.load(sys.argv[2])
    with torch.no_grad():
        out = model(ref["ids"]).logits
    assert not [m for m in sys.modules if m == "gac" or m.startswith("gac.")], "gac was imported"
    print((out - ref["logits"]).abs().max().item())
    """
)


def _ids(vocab: int) -> torch.Tensor:
    return torch.randint(0, vocab, (2, 12), generator=torch.Generator().manual_seed(1))


def test_head_dim_30_to_32_loads_with_plain_transformers(tmp_path) -> None:
    """The issue's case: a tiny Llama with head_dim 30 -> 32, loaded in a process that never imports gac."""
    model = tiny_model("llama", hidden=120, intermediate=256, heads=4, kv_heads=2, head_dim=30)
    ids = _ids(250)
    with torch.no_grad():
        ref = model(ids).logits
    report = repair_(model, "minimal")
    assert {(c.kind, c.before, c.after) for c in report.changes} == {("head_dim", 30, 32)}
    assert report.notes == []
    save_repaired(model, tmp_path / "rep", report=report)
    doc = json.loads((tmp_path / "rep" / "gac_repair.json").read_text())
    assert doc["plain_transformers"] is True
    cfg = json.loads((tmp_path / "rep" / "config.json").read_text())
    assert cfg["head_dim"] == 32
    torch.save({"ids": ids, "logits": ref}, tmp_path / "ref.pt")
    run = subprocess.run(
        [sys.executable, "-c", _PLAIN, str(tmp_path / "rep"), str(tmp_path / "ref.pt")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert float(run.stdout.strip().splitlines()[-1]) <= TOL


ROPES = {
    "linear": {"rope_type": "linear", "factor": 2.0},
    "llama3": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    },
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128},
}


@pytest.mark.parametrize("rope", sorted(ROPES))
def test_rope_types_stay_exact_in_plain_config(rope: str, tmp_path) -> None:
    """llama3 and yarn frequencies depend on theta and dim only through theta^(1/dim): still exact."""
    cfg = tiny_config("llama", hidden=120, intermediate=256, heads=4, kv_heads=2, head_dim=30)
    cfg.rope_parameters = {"rope_theta": 10000.0, **ROPES[rope]}
    torch.manual_seed(0)
    cfg.initializer_range = 0.1
    model = AutoModelForCausalLM.from_config(cfg).eval()
    ids = _ids(250)
    with torch.no_grad():
        ref = model(ids).logits
    repair_(model, "minimal")
    save_repaired(model, tmp_path / "rep")
    assert json.loads((tmp_path / "rep" / "gac_repair.json").read_text())["plain_transformers"] is True
    plain = AutoModelForCausalLM.from_pretrained(tmp_path / "rep", dtype=torch.float32).eval()
    with torch.no_grad():
        assert (plain(ids).logits - ref).abs().max().item() <= TOL


def test_qk_norm_padding_falls_back_to_gac_loader_saying_why(tmp_path) -> None:
    """Qwen3's q/k norms over head_dim need an eps the config cannot hold: gac's loader, and the reason."""
    model = tiny_model("qwen3", hidden=120, intermediate=256, heads=4, kv_heads=2, head_dim=30)
    ids = _ids(250)
    with torch.no_grad():
        ref = model(ids).logits
    repair_(model, "minimal")
    save_repaired(model, tmp_path / "rep")
    doc = json.loads((tmp_path / "rep" / "gac_repair.json").read_text())
    assert doc["plain_transformers"] is False
    assert "q_norm" in doc["plain_transformers_why_not"]
    with torch.no_grad():
        assert (load_repaired(tmp_path / "rep")(ids).logits - ref).abs().max().item() <= TOL
