"""gac.io: exact save/load round trips, sharding, tied weights, corrupt or missing shards."""

from __future__ import annotations

import json

import pytest
import torch

from gac import io
from gac.errors import GacError
from gac.nn import FactorizedLinear, replace_module
from gac.testing import tiny_model


def _factorize(model, names_ranks):
    for name, r in names_ranks:
        lin = model.get_submodule(name)
        u, s, vh = torch.linalg.svd(lin.weight.detach(), full_matrices=False)
        fl = FactorizedLinear.from_factors(
            u[:, :r] * s[:r], vh[:r], lin.bias.detach() if lin.bias is not None else None
        )
        replace_module(model, name, fl)
    return model


def _logits(model, ids):
    with torch.no_grad():
        return model(ids).logits


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
def test_round_trip_is_exact(tmp_path, family):
    m = _factorize(
        tiny_model(family), [("model.layers.0.self_attn.q_proj", 37), ("model.layers.1.mlp.down_proj", 51)]
    )
    ids = torch.randint(0, 250, (2, 19))
    ref = _logits(m, ids)
    out = io.save(m, tmp_path / "m", {"compressor": "test", "param_ratio": 0.9})
    cfg = json.loads((out / "gac_config.json").read_text())
    assert cfg["schema"] == io.SCHEMA and cfg["compressor"] == "test"
    assert {s["name"]: s["rank"] for s in cfg["factorized"]} == {
        "model.layers.0.self_attn.q_proj": 37,
        "model.layers.1.mlp.down_proj": 51,
    }
    m2 = io.load(out)
    assert isinstance(m2.get_submodule("model.layers.1.mlp.down_proj"), FactorizedLinear)
    assert torch.equal(_logits(m2, ids), ref)


def test_tied_embeddings_and_rotary_buffers(tmp_path):
    m = tiny_model("llama", vocab=250)
    m.config.tie_word_embeddings = True
    m.lm_head.weight = m.model.embed_tokens.weight
    # an edited non-persistent buffer must survive the round trip
    rot = m.model.rotary_emb
    rot.inv_freq.mul_(0.5)
    ids = torch.randint(0, 250, (1, 23))
    ref = _logits(m, ids)
    out = io.save(m, tmp_path / "tied")
    cfg = io.read_gac_config(out)
    assert cfg["tied"] == {"lm_head.weight": "model.embed_tokens.weight"}
    m2 = io.load(out)
    assert m2.lm_head.weight is m2.model.embed_tokens.weight
    assert torch.equal(m2.model.rotary_emb.inv_freq, rot.inv_freq)
    assert torch.equal(_logits(m2, ids), ref)


def test_sharded_save_and_dtype(tmp_path):
    m = _factorize(tiny_model("llama"), [("model.layers.0.mlp.up_proj", 40)])
    ids = torch.randint(0, 250, (1, 11))
    ref = _logits(m, ids)
    out = io.save(m, tmp_path / "sh", max_shard_bytes=200_000)
    shards = sorted(p.name for p in out.glob("model-*.safetensors"))
    assert len(shards) > 1 and (out / io.INDEX).is_file()
    assert torch.equal(_logits(io.load(out), ids), ref)
    m16 = io.load(out, dtype=torch.bfloat16)
    assert m16.model.layers[0].mlp.up_proj.u.weight.dtype == torch.bfloat16
    assert torch.allclose(_logits(m16, ids).float(), ref, atol=0.5)


def test_missing_and_corrupt_shards_name_the_file(tmp_path):
    m = tiny_model("llama")
    out = io.save(m, tmp_path / "sh", max_shard_bytes=200_000)
    shards = sorted(out.glob("model-*.safetensors"))
    victim = shards[1]
    data = victim.read_bytes()
    victim.write_bytes(data[: len(data) // 2])  # truncated
    with pytest.raises(GacError, match=victim.name):
        io.load(out)
    victim.write_bytes(b"\x00" * 4)
    with pytest.raises(GacError, match=victim.name):
        io.load(out)
    victim.unlink()
    with pytest.raises(GacError, match=f"missing weight file .*{victim.name}"):
        io.load(out)


def test_save_is_atomic_and_refuses_to_overwrite(tmp_path):
    m = tiny_model("llama")
    out = io.save(m, tmp_path / "a")
    with pytest.raises(GacError, match="already exists"):
        io.save(m, out)
    io.save(m, out, overwrite=True)

    class Boom:
        def save_pretrained(self, d):
            raise RuntimeError("tokenizer failure")

    with pytest.raises(RuntimeError):
        io.save(m, tmp_path / "b", tokenizer=Boom())
    assert not (tmp_path / "b").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_not_a_gac_dir(tmp_path):
    with pytest.raises(GacError, match="not a gac-saved"):
        io.load(tmp_path)


@pytest.mark.slow
def test_smollm2_compress_save_load_round_trip(tmp_path):
    """The embedded SmolLM2 (tied embeddings, 30 layers): svd + gac, save, load, identical logits."""
    from gac import CompressConfig, compress_
    from gac.models import load_model

    lm = load_model("smollm2")
    rep = compress_(
        lm.model, CompressConfig(compressor="svd", param_ratio=0.9, align="gac", profile="default")
    )
    assert rep.pct_aligned == 100.0 and rep.allocation["cost"] <= rep.allocation["budget"]
    out = io.save(lm.model, tmp_path / "s", {"compressor": "svd"}, tokenizer=lm.tokenizer)
    m2 = load_model(str(out)).model
    ids = lm.tokenizer(
        "The Encyclopaedia Britannica is a general knowledge reference work.", return_tensors="pt"
    )["input_ids"]
    assert torch.equal(_logits(m2, ids), _logits(lm.model, ids))
    assert m2.lm_head.weight is m2.model.embed_tokens.weight
