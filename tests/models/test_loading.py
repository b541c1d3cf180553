"""load_model: local HF dirs, gac dirs, repaired dirs, GGUF files, the smollm2 alias, and bad specs."""

from __future__ import annotations

import time

import pytest
import torch

from gac.errors import GacError
from gac.models import get_adapter, load_model
from gac.models.loading import alias_file
from gac.testing import tiny_model


def logits(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(ids).logits


def test_hf_dir_round_trip(tmp_path) -> None:
    model = tiny_model("qwen2")
    model.save_pretrained(tmp_path / "m")
    lm = load_model(tmp_path / "m")
    assert lm.source["kind"] == "hf_dir" and lm.source["path"] == str(tmp_path / "m")
    assert not lm.model.training
    ids = torch.randint(0, 250, (1, 20))
    assert torch.equal(logits(model, ids), logits(lm.model, ids))


def test_dtype_argument(tmp_path) -> None:
    tiny_model("llama").save_pretrained(tmp_path / "m")
    lm = load_model(str(tmp_path / "m"), dtype=torch.bfloat16)
    assert next(lm.model.parameters()).dtype == torch.bfloat16


def test_gac_dir_is_delegated_to_gac_io(tmp_path) -> None:
    from gac import io as gac_io

    model = tiny_model("mistral")
    gac_io.save(model, tmp_path / "g", {"compressor": "none"})
    lm = load_model(tmp_path / "g")
    assert lm.source["kind"] == "gac"
    ids = torch.randint(0, 250, (1, 20))
    assert torch.equal(logits(model, ids), logits(lm.model, ids))


def test_not_a_model(tmp_path) -> None:
    (tmp_path / "notes.txt").write_text("hello")
    (tmp_path / "empty").mkdir()
    for spec, msg in (
        (tmp_path / "missing", "no such file"),
        (tmp_path / "notes.txt", "not a model"),
        (tmp_path / "empty", "not a model directory"),
        ("not a model!", "not a model"),
    ):
        with pytest.raises(GacError, match=msg):
            load_model(spec)


def test_broken_config_dir(tmp_path) -> None:
    d = tmp_path / "broken"
    d.mkdir()
    (d / "config.json").write_text('{"model_type": "no-such-arch"}')
    with pytest.raises(GacError, match="broken"):
        load_model(d)


def test_gguf_of_unsupported_architecture(tmp_path) -> None:
    import numpy as np
    from gguf import GGUFWriter

    path = tmp_path / "odd.gguf"
    w = GGUFWriter(str(path), arch="bogusarch")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(GacError, match="bogusarch"):
        load_model(path)


def test_not_a_gguf(tmp_path) -> None:
    p = tmp_path / "fake.gguf"
    p.write_bytes(b"not gguf at all" * 10)
    with pytest.raises(GacError, match="GGUF"):
        load_model(p)


def test_alias_file_is_found_without_importing() -> None:
    f = alias_file("smollm2")
    assert f.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and f.stat().st_size > 50_000_000


@pytest.mark.slow
def test_smollm2_alias_builds_and_reuses_cache(tmp_path, monkeypatch) -> None:
    """First load dequantizes the GGUF into $GAC_CACHE; the second reads the safetensors cache, same logits."""
    monkeypatch.setenv("GAC_CACHE", str(tmp_path))
    lm = load_model("smollm2")
    cache = tmp_path / "models" / "smollm2"
    assert (cache / "model.safetensors").is_file() and (cache / "gac_cache.json").is_file()
    assert not list(tmp_path.glob("models/.*.tmp"))  # atomic: no temporary left behind
    ad = get_adapter(lm.model)
    assert (ad.family, ad.num_layers, ad.hidden, ad.heads, ad.kv_heads) == ("llama", 30, 576, 9, 3)
    assert (ad.intermediate(0), ad.vocab, ad.head_dim, ad.tied_embeddings) == (1536, 49152, 64, True)
    t = time.perf_counter()
    again = load_model("smollm2")
    assert time.perf_counter() - t < 15
    ids = lm.tokenizer("The Encyclopaedia Britannica", return_tensors="pt").input_ids
    assert torch.equal(logits(lm.model, ids), logits(again.model, ids))
    direct = load_model(alias_file("smollm2"))  # the GGUF itself gives the same model
    assert direct.source["kind"] == "gguf" and direct.source["architecture"] == "llama"
    assert torch.equal(logits(lm.model, ids), logits(direct.model, ids))
