"""gac.api: config round trip and validation, compress_ end to end, CLI bad input."""

from __future__ import annotations

import json

import pytest
import torch

from gac import CompressConfig, compress_
from gac.cli import main
from gac.errors import GacError
from gac.testing import tiny_model


def test_config_round_trip_and_version():
    c = CompressConfig(
        compressor="svd-llm", param_ratio=0.8, align="gac-latency", options={"svd_dtype": "float64"}
    )
    d = json.loads(json.dumps(c.to_dict()))
    assert CompressConfig.from_dict(d) == c
    with pytest.raises(GacError, match="version"):
        CompressConfig.from_dict({**d, "version": 99})
    with pytest.raises(GacError, match="unknown CompressConfig field"):
        CompressConfig.from_dict({**d, "ratio": 0.5})


@pytest.mark.parametrize("ratio", [0.0, 1.0, 1.5, -0.2, float("nan")])
def test_ratio_outside_open_interval(ratio):
    with pytest.raises(GacError, match="strictly between 0 and 1"):
        CompressConfig(param_ratio=ratio)


def test_unknown_align_and_compressor():
    with pytest.raises(GacError, match="align"):
        CompressConfig(align="nearest")
    with pytest.raises(GacError, match="unknown compressor"):
        compress_(tiny_model("llama"), CompressConfig(compressor="nope", param_ratio=0.9))


def test_compress_in_place_report(tmp_path):
    m = tiny_model("qwen2")  # q/k/v carry biases
    before = sum(p.numel() for p in m.parameters())
    r = compress_(m, CompressConfig(compressor="svd", param_ratio=0.9, align="gac", profile="default"))
    after = sum(p.numel() for p in m.parameters())
    assert r.model_params_before == before and r.model_params_after == after
    assert r.targeted_after <= r.allocation["budget"] <= r.budget
    assert r.targeted_ratio <= 0.9 and r.model_ratio == pytest.approx(after / before)
    assert r.pct_aligned == 100.0 and r.predicted_speedup > 0
    d = json.loads(r.save(tmp_path / "r.json").read_text())
    assert d["allocation"]["sites"][0]["native"] > 0 and "model_ratio" in d


def test_per_site_table_names_sites_compactly_in_80_columns():
    """``gac compress``'s per-site table, as a log (no terminal) of 80 columns shows it."""
    import io

    from rich.console import Console

    m = tiny_model("llama")
    r = compress_(m, CompressConfig(compressor="svd", param_ratio=0.9, align="gac", profile="default"))
    buf = io.StringIO()
    r.print(to=Console(file=buf, width=80, force_terminal=False, color_system=None))
    lines = buf.getvalue().splitlines()
    assert max(len(ln) for ln in lines) <= 80
    text = buf.getvalue()
    for name in ("L0.q_proj", "L0.k_proj", "L0.o_proj", "L1.mlp.gate", "L1.mlp.up", "L1.mlp.down"):
        assert f" {name} " in text, name
    assert "model.layers" not in text and "…" not in text


def test_calibrating_compressor_needs_data():
    with pytest.raises(GacError, match="needs calibration data"):
        compress_(tiny_model("llama"), CompressConfig(compressor="svd-llm", param_ratio=0.9))


def test_unmeetable_budget():
    with pytest.raises(GacError, match="cannot be met"):
        compress_(tiny_model("llama"), CompressConfig(compressor="svd", param_ratio=0.001))


@pytest.fixture
def tiny_dir(tmp_path):
    d = tmp_path / "tiny"
    tiny_model("llama").save_pretrained(d)
    return d


def test_cli_compress_and_bad_input(tiny_dir, tmp_path, capsys):
    out = tmp_path / "out"
    args = ["compress", str(tiny_dir), "--compressor", "svd", "--align", "gac", "--profile", "default"]
    assert main([*args, "--param-ratio", "0.9", "--out", str(out)]) == 0
    assert {"config.json", "gac_config.json", "gac_report.json", "model.safetensors"} <= {
        p.name for p in out.iterdir()
    }
    from gac import load

    m = load(out)
    ids = torch.randint(0, 250, (1, 9))
    with torch.no_grad():
        assert torch.isfinite(m(ids).logits).all()
    capsys.readouterr()
    cases = [
        (["--param-ratio", "1.2"], "strictly between 0 and 1"),
        (["--param-ratio", "0.9", "--compressor", "nope"], "unknown compressor"),
        (["--param-ratio", "0.0005"], "cannot be met"),
    ]
    for extra, msg in cases:
        bad = tmp_path / "bad"
        assert main([*args, *extra, "--out", str(bad)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err[-1].startswith("error: ") and msg in err[-1]
        assert not bad.exists()
    # a corrupt shard of a saved model: one-line error naming the file, nothing written
    shard = out / "model.safetensors"
    shard.write_bytes(shard.read_bytes()[:1000])
    assert main(["compress", str(out), "--compressor", "svd", "--out", str(tmp_path / "bad2")]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "model.safetensors" in err and not (tmp_path / "bad2").exists()


def test_cli_calibration_text_too_short(tiny_dir, tmp_path, capsys, monkeypatch):
    """A calibrating compressor with too little text: one-line error, nothing written."""
    import gac.models as models

    class ByteTok:
        def __call__(self, text, add_special_tokens=False):
            return {"input_ids": list(text.encode("utf-8", "replace"))}

        def save_pretrained(self, d):
            pass

    real = models.load_model

    def fake(spec, **kw):
        lm = real(spec, **kw)
        lm.tokenizer = ByteTok()
        return lm

    monkeypatch.setattr(models, "load_model", fake)
    txt = tmp_path / "short.txt"
    txt.write_text("Too short a text to calibrate anything at all.")
    out = tmp_path / "o"
    rc = main(
        [
            "compress",
            str(tiny_dir),
            "--compressor",
            "svd-llm",
            "--param-ratio",
            "0.9",
            "--calib",
            f"text:{txt}",
            "--n-samples",
            "4",
            "--seq-len",
            "64",
            "--out",
            str(out),
        ]
    )
    assert rc == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("error: ") and "short" in err.lower() and not out.exists()
