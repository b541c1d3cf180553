"""`gac analyze` and `gac repair` from the command line, on tiny local models."""

from __future__ import annotations

import json

import pytest
import torch

from gac.cli import main
from gac.models import load_model
from gac.testing import tiny_model


@pytest.fixture
def misaligned_dir(tmp_path):
    model = tiny_model("qwen3", hidden=120, intermediate=200, heads=5, kv_heads=1, head_dim=24)
    model.save_pretrained(tmp_path / "m")
    return tmp_path / "m", model


def test_repair_cli_round_trip(misaligned_dir, tmp_path, capsys) -> None:
    src, model = misaligned_dir
    out = tmp_path / "rep"
    assert main(["repair", str(src), "--strategy", "optimal", "--profile", "default", "--out", str(out)]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    doc = json.loads(line)
    assert doc["dims_changed"] == 4 and doc["memory_overhead_pct"] > 0 and doc["strategy"] == "optimal"
    lm = load_model(out)
    assert lm.model.config.hidden_size == 128 and lm.model.config.head_dim == 32
    ids = torch.randint(0, 250, (2, 32))
    with torch.no_grad():
        diff = (model(ids).logits - lm.model(ids).logits).abs().max().item()
    assert diff <= 1e-5


def test_repair_cli_bad_inputs(misaligned_dir, tmp_path, capsys) -> None:
    src, _ = misaligned_dir
    out = tmp_path / "never"
    assert main(["repair", str(tmp_path / "nope"), "--out", str(out)]) == 2
    assert "not a model" in capsys.readouterr().err
    assert main(["repair", str(src), "--strategy", "fastest", "--out", str(out)]) == 2
    assert "strategy" in capsys.readouterr().err
    assert not out.exists()
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "x").write_text("keep me")
    assert main(["repair", str(src), "--out", str(busy)]) == 2
    assert "already exists" in capsys.readouterr().err
    assert (busy / "x").read_text() == "keep me"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary dirs left


def test_repair_cli_noop_writes_nothing(tmp_path, capsys) -> None:
    tiny_model(
        "llama", hidden=128, intermediate=256, heads=4, kv_heads=2, head_dim=32, vocab=256
    ).save_pretrained(tmp_path / "m")
    assert main(["repair", str(tmp_path / "m"), "--out", str(tmp_path / "r")]) == 0
    assert "no-op" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_analyze_cli(misaligned_dir, tmp_path, capsys) -> None:
    src, _ = misaligned_dir
    j, png = tmp_path / "a.json", tmp_path / "a.png"
    assert main(["analyze", str(src), "--out", str(j), "--plot", str(png)]) == 0
    cap = capsys.readouterr()
    assert "profile:" in cap.err and "aligned" in cap.out
    doc = json.loads(j.read_text())
    assert doc["family"] == "qwen3" and doc["model"]["kind"] == "hf_dir"
    assert 0 < doc["pct_aligned"] < 100 and doc["n_misaligned"] > 0
    assert png.stat().st_size > 1000


def test_analyze_cli_unsupported_architecture(tmp_path, capsys) -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=50)).save_pretrained(tmp_path / "g")
    assert main(["analyze", str(tmp_path / "g")]) == 2
    assert "transformer.h hold no nn.Linear projections" in capsys.readouterr().err


def test_analyze_prints_sliding_window_layers_and_tied_embeddings(tmp_path, capsys) -> None:
    from transformers import AutoModelForCausalLM

    from gac.testing import tiny_config

    cfg = tiny_config("qwen3", layers=3)
    cfg.use_sliding_window, cfg.sliding_window, cfg.max_window_layers = True, 64, 1
    cfg.layer_types = ["full_attention", "sliding_attention", "sliding_attention"]
    cfg.tie_word_embeddings = True
    AutoModelForCausalLM.from_config(cfg).save_pretrained(tmp_path / "swa")
    j = tmp_path / "a.json"
    assert main(["analyze", str(tmp_path / "swa"), "--profile", "default", "--out", str(j)]) == 0
    out = capsys.readouterr().out
    assert "sliding-window attention (window 64): 2 of 3 layers (1, 2)" in out
    assert "tied embeddings: lm_head is the input embedding matrix" in out
    s = json.loads(j.read_text())["structure"]
    assert s == {"sliding_window": 64, "sliding_layers": [1, 2], "n_layers": 3, "tied_embeddings": True}
    tiny_model("llama").save_pretrained(tmp_path / "full")  # untied, full attention
    assert main(["analyze", str(tmp_path / "full"), "--profile", "default"]) == 0
    out = capsys.readouterr().out
    assert "sliding-window attention: none (all 2 layers" in out and "tied embeddings: no" in out
