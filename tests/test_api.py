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


# ------------------------------------------------------------- the workflow gac compress runs
def test_compress_refuses_an_already_compressed_model(tmp_path):
    """The one-line refusal of ``gac compress`` on a compressed directory, before any work, in the API too."""
    from gac import io

    m = tiny_model("llama")
    compress_(m, CompressConfig(compressor="svd", param_ratio=0.9, profile="default"))
    io.save(m, tmp_path / "m", {"compressor": "svd"})
    loaded = io.load(tmp_path / "m")
    before = {n: p.clone() for n, p in loaded.named_parameters()}
    with pytest.raises(GacError) as e:
        compress_(loaded, CompressConfig(compressor="svd", param_ratio=0.9, profile="default"))
    name = loaded.name_or_path or type(loaded).__name__  # the model's name, else its class
    assert str(e.value) == f"{name} is already compressed; compress its base model instead"
    assert all(torch.equal(p, before[n]) for n, p in loaded.named_parameters())  # untouched
    with pytest.raises(GacError, match=r"^\S+ is already compressed; compress its base model instead$"):
        compress_(m, CompressConfig(compressor="svd", param_ratio=0.9, profile="default"))  # in memory


def test_compress_verify_refused_without_a_gpu_before_any_work():
    m = tiny_model("llama")
    before = {n: p.clone() for n, p in m.named_parameters()}
    with pytest.raises(GacError, match="--verify times the model"):
        compress_(
            m, CompressConfig(compressor="svd", param_ratio=0.9, profile="default", verify=True), device="cpu"
        )
    assert all(torch.equal(p, before[n]) for n, p in m.named_parameters())


def test_compress_lora_recovery_merges(tmp_path):
    """``recover="lora"`` on a tiny LLM-Pruner model: the LoRA fine-tune runs after pruning and merges
    (the pruned shapes stay, no peft module remains), lowers the loss, and is recorded in the report,
    gac_config.json and gac_report.json; the saved model reloads to the same logits."""
    pytest.importorskip("peft")
    import copy

    from gac import io
    from gac.api import gac_config_for_save

    ids = torch.randint(0, 250, (2, 24), generator=torch.Generator().manual_seed(0))
    base = tiny_model(heads=6, kv_heads=3, head_dim=20, layers=3)  # n_rep 2, head_dim 20, MLP 200
    kw = dict(
        compressor="llm-pruner",
        param_ratio=0.8,
        profile="default",
        options={"layer_start": 0, "layer_end": 3},
    )
    plain, m = copy.deepcopy(base), copy.deepcopy(base)
    compress_(plain, CompressConfig(**kw), calib_batches=[ids])
    with pytest.raises(GacError, match="needs calibration text"):
        compress_(m, CompressConfig(**kw, recover="lora"))
    cfg = CompressConfig(**kw, recover="lora", recover_steps=4, recover_rank=4, recover_lr=1e-2)
    r = compress_(m, cfg, calib_batches=[ids])
    shapes = {n: tuple(p.shape) for n, p in plain.named_parameters()}
    assert {n: tuple(p.shape) for n, p in m.named_parameters()} == shapes  # merged: no peft modules left
    assert not torch.equal(m.model.layers[0].mlp.down_proj.weight, plain.model.layers[0].mlp.down_proj.weight)
    rec = r.recovery
    assert rec["method"] == "lora" and rec["steps"] == 4 and rec["rank"] == 4
    assert rec["loss_last"] < rec["loss_first"]
    assert r.to_dict()["recovery"] == rec and gac_config_for_save(r)["recovery"] == rec
    io.save(m, tmp_path / "m", gac_config_for_save(r))
    assert io.read_gac_config(tmp_path / "m")["recovery"] == rec
    with torch.no_grad():
        torch.testing.assert_close(io.load(tmp_path / "m")(ids).logits, m(ids).logits, rtol=0, atol=0)


def test_config_round_trips_through_gac_config_json(tmp_path):
    """The config a compressed model records (gac_config.json's ``compress_config``) rebuilds the
    config that made it, the workflow fields included; a report without recovery or verification
    records neither."""
    from gac import io
    from gac.api import gac_config_for_save

    m = tiny_model("llama")
    cfg = CompressConfig(
        compressor="svd",
        param_ratio=0.8,
        profile="default",
        serve="prefill:1x64,decode:4x128",
        max_gpu_memory=64.0,
        recover_steps=7,
        recover_rank=2,
        recover_lr=3e-4,
        allow_slower=True,
    )
    r = compress_(m, cfg)
    io.save(m, tmp_path / "m", gac_config_for_save(r))
    doc = io.read_gac_config(tmp_path / "m")
    assert CompressConfig.from_dict(doc["compress_config"]) == cfg
    assert "recovery" not in doc and "recovery" not in r.to_dict() and "verify" not in r.to_dict()
