"""Families beyond Llama/Mistral/Qwen, found by structural discovery (no per-family list):
Phi-3 (fused qkv and gate_up), OLMo-2 (post-norms, q/k norms over all heads), GPT-NeoX (other
names, LayerNorm, parallel residual, interleaved qkv, partial rotary) and Granite (multipliers).

Each goes through analyze, exact repair (+ save and ``gac.load``), a compression round trip
(svd + gac alignment, save, ``gac.load``, identical logits)."""

from __future__ import annotations

import pytest
import torch

import gac
from gac import io
from gac.api import CompressConfig, compress_
from gac.errors import GacError
from gac.hardware.profile import default_profile
from gac.models.adapters import get_adapter
from gac.models.inventory import analyze
from gac.nn import FactorizedLinear
from gac.surgery.repair import repair_, save_repaired
from gac.testing import OTHER_FAMILIES, tiny_model

TOL = 1e-5
TEXT = (
    "It was the best of times, it was the worst of times, it was the age of wisdom, it was the age of "
    "foolishness, it was the epoch of belief, it was the epoch of incredulity."
)
#: misaligned dims per family (GPT-NeoX: LayerNorm keeps hidden, partial rotary keeps head_dim)
DIMS = {
    "phi3": dict(hidden=116, intermediate=196, heads=4, kv_heads=2, head_dim=30),
    "olmo2": dict(hidden=116, intermediate=196, heads=4, kv_heads=2, head_dim=30),
    "granite": dict(hidden=116, intermediate=196, heads=4, kv_heads=2, head_dim=30),
    "gpt_neox": dict(hidden=128, intermediate=196, heads=4),
}
EXPECT_REPAIRED = {
    "phi3": {"hidden", "intermediate", "head_dim"},
    "olmo2": {"hidden", "intermediate", "head_dim"},
    "granite": {"hidden", "intermediate", "head_dim"},
    "gpt_neox": {"intermediate"},
}
ROLES = {
    "phi3": ["qkv", "o", "gate_up", "down"],
    "olmo2": ["q", "k", "v", "o", "gate", "up", "down"],
    "granite": ["q", "k", "v", "o", "gate", "up", "down"],
    "gpt_neox": ["qkv", "o", "up", "down"],
}


def _model(family: str) -> torch.nn.Module:
    return tiny_model(family, vocab=256, **DIMS[family])


def _ids() -> torch.Tensor:
    return torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(5))


def _logits(model, ids):
    with torch.no_grad():
        return model(ids).logits


@pytest.mark.parametrize("family", OTHER_FAMILIES)
def test_discovery_and_analyze(family: str) -> None:
    model = _model(family)
    ad = get_adapter(model)
    assert list(ad.roles) == ROLES[family]
    assert ad.hidden == DIMS[family]["hidden"] and ad.intermediate(1) == 196
    assert ad.head_dim == DIMS[family].get("head_dim", DIMS[family]["hidden"] // DIMS[family]["heads"])
    assert len(ad.hidden_norm_fqns()) == 2 * 2 + 1
    assert len(ad.qk_norm_fqns(0)) == (2 if family == "olmo2" else 0)
    an = analyze(model, default_profile())
    assert an.family == family
    assert any(d.kind == "intermediate" and d.aligned is False for d in an.dims)


@pytest.mark.parametrize("family", OTHER_FAMILIES)
def test_exact_repair_and_load(family: str, tmp_path) -> None:
    model = _model(family)
    ids = _ids()
    ref = _logits(model, ids)
    report = repair_(model, "minimal")
    assert {c.kind for c in report.changes} == EXPECT_REPAIRED[family]
    assert (_logits(model, ids) - ref).abs().max().item() <= TOL
    save_repaired(model, tmp_path / "rep", report=report)
    loaded = gac.load(tmp_path / "rep")
    assert (_logits(loaded, ids) - ref).abs().max().item() <= TOL
    assert get_adapter(loaded).summary() == get_adapter(model).summary()


def test_phi3_fused_repair_loads_with_plain_transformers(tmp_path) -> None:
    from transformers import AutoModelForCausalLM

    model = _model("phi3")
    ids = _ids()
    ref = _logits(model, ids)
    repair_(model, "minimal")
    save_repaired(model, tmp_path / "rep")
    plain = AutoModelForCausalLM.from_pretrained(tmp_path / "rep", dtype=torch.float32).eval()
    assert (_logits(plain, ids) - ref).abs().max().item() <= TOL


def test_layernorm_hidden_is_refused_with_one_line() -> None:
    model = tiny_model("gpt_neox", hidden=116, intermediate=200, heads=4)
    with pytest.raises(GacError, match=r"hidden 116: gpt_neox.layers.0.input_layernorm is a LayerNorm"):
        repair_(model, "minimal")


@pytest.mark.parametrize("family", OTHER_FAMILIES)
def test_compression_round_trip(family: str, tmp_path) -> None:
    model = _model(family)
    text = torch.tensor(list(TEXT.encode("ascii")), dtype=torch.long)  # English prose as bytes
    batches = list(text[:64].view(4, 16).split(2))
    cfg = CompressConfig(compressor="svd", param_ratio=0.9, align="gac")
    report = compress_(model, cfg, calib_batches=batches, profile=default_profile())
    assert any(isinstance(m, FactorizedLinear) for m in model.modules())
    assert report.allocation["cost"] <= report.allocation["budget"]
    ids = _ids()
    ref = _logits(model, ids)
    io.save(model, tmp_path / "c", {"compressor": "svd", "param_ratio": 0.9})
    loaded = gac.load(tmp_path / "c")
    assert torch.equal(_logits(loaded, ids), ref)
