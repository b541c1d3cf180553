"""gac.load: one loader for every directory gac writes and plain Hugging Face directories;
pickles, remote code and newer schemas are refused with one line each."""

from __future__ import annotations

import json

import pytest
import torch

import gac
from gac import io
from gac.errors import GacError
from gac.nn import FactorizedLinear, replace_module
from gac.surgery.repair import repair_, save_repaired
from gac.testing import tiny_model


def _logits(model, ids):
    with torch.no_grad():
        return model(ids).logits


def _factorized(model):
    lin = model.get_submodule("model.layers.0.mlp.down_proj")
    u, s, vh = torch.linalg.svd(lin.weight.detach(), full_matrices=False)
    replace_module(
        model, "model.layers.0.mlp.down_proj", FactorizedLinear.from_factors(u[:, :37] * s[:37], vh[:37])
    )
    return model


def _write(kind, model, path):
    if kind == "compressed":
        io.save(_factorized(model), path, {"compressor": "test", "param_ratio": 0.9})
    elif kind == "repaired":
        repair_(model, "minimal")
        save_repaired(model, path)
    else:
        model.save_pretrained(path)
    return model


@pytest.mark.parametrize("kind", ["compressed", "repaired", "hf"])
def test_gac_load_reads_every_kind(kind, tmp_path):
    model = tiny_model("llama", hidden=120, intermediate=200, heads=4, kv_heads=2, head_dim=30)
    ids = torch.randint(0, 250, (2, 11), generator=torch.Generator().manual_seed(3))
    model = _write(kind, model, tmp_path / "m")
    ref = _logits(model, ids)
    loaded = gac.load(tmp_path / "m")
    assert (_logits(loaded, ids) - ref).abs().max().item() <= 1e-5
    assert loaded.gac_source["kind"] == {"compressed": "gac", "repaired": "repaired", "hf": "hf_dir"}[kind]


def test_pickle_weights_are_refused(tmp_path):
    model = tiny_model("llama")
    model.save_pretrained(tmp_path)
    for f in tmp_path.glob("*.safetensors"):
        f.unlink()
    torch.save({}, tmp_path / "pytorch_model.bin")
    with pytest.raises(GacError, match=r"pickle weights \(pytorch_model.bin\)"):
        gac.load(tmp_path)


def test_remote_code_is_refused(tmp_path):
    tiny_model("llama").save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["auto_map"] = {"AutoModelForCausalLM": "modeling_evil.EvilForCausalLM"}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(GacError, match="remote code \\(modeling_evil.EvilForCausalLM\\)"):
        gac.load(tmp_path)


@pytest.mark.parametrize(
    "kind,file,schema",
    [("compressed", "gac_config.json", io.SCHEMA), ("repaired", "gac_repair.json", "gac.repair/1")],
)
def test_newer_schema_names_both_versions(kind, file, schema, tmp_path):
    _write(
        kind,
        tiny_model("llama", hidden=120, intermediate=200, heads=4, kv_heads=2, head_dim=30),
        tmp_path / "m",
    )
    doc = json.loads((tmp_path / "m" / file).read_text())
    newer = schema.rpartition("/")[0] + "/99"
    doc["schema"] = newer
    (tmp_path / "m" / file).write_text(json.dumps(doc))
    with pytest.raises(GacError, match=f"newer gac \\(schema {newer}; this gac reads {schema}\\)"):
        gac.load(tmp_path / "m")
