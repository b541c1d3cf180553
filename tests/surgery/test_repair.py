"""Exact repair on tiny misaligned models of every family, for every kind of padding."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from gac.errors import GacError
from gac.hardware.profile import default_profile
from gac.models import get_adapter, load_model
from gac.models.inventory import analyze
from gac.nn import FactorizedLinear, replace_module
from gac.surgery.padding import head_end_placement, pad_in_, pad_out_
from gac.surgery.repair import load_repaired, repair_, save_repaired
from gac.testing import FAMILIES, tiny_model

BOUND = 1e-5  # max |logit diff| allowed in float32
GEN_TOKENS = 32


def factorize_(model: torch.nn.Module, fqn: str, rank: int) -> None:
    """Replace a linear layer by its truncated SVD at ``rank`` (an odd rank makes a misaligned dim)."""
    lin = model.get_submodule(fqn)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # multi-threaded LAPACK on a busy 2-core box can take 100x longer
    try:
        u, s, vh = torch.linalg.svd(lin.weight.data, full_matrices=False)
    finally:
        torch.set_num_threads(threads)
    replace_module(model, fqn, FactorizedLinear.from_factors(u[:, :rank] * s[:rank], vh[:rank], lin.bias))


def greedy(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    return model.generate(
        ids,
        max_new_tokens=GEN_TOKENS,
        min_new_tokens=GEN_TOKENS,
        do_sample=False,
        pad_token_id=0,
    )


def check_exact(ref: torch.nn.Module, rep: torch.nn.Module, vocab: int, seed: int = 1) -> float:
    """Assert same logits (<= BOUND) and the same 32-token greedy generation; return the max diff."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (2, 48), generator=g)
    with torch.no_grad():
        a, b = ref(ids).logits, rep(ids).logits
    assert a.shape == b.shape
    diff = (a - b).abs().max().item()
    assert diff <= BOUND, f"max |logit diff| {diff:.3g} > {BOUND}"
    assert torch.equal(greedy(ref, ids[:1, :8]), greedy(rep, ids[:1, :8]))
    return diff


def build(family: str, kind: str, seed: int = 0) -> tuple[torch.nn.Module, str]:
    """A tiny model misaligned in the way ``kind`` repairs, and the strategy that repairs it."""
    kw: dict = {"family": family, "seed": seed}
    if kind == "hidden":
        kw.update(hidden=115, head_dim=24, intermediate=208)  # 115 -> 120 (minimal)
        return tiny_model(**kw), "minimal"
    if kind == "intermediate":
        kw.update(hidden=128, intermediate=196, heads=4, kv_heads=2, head_dim=24)  # 196 -> 200
        return tiny_model(**kw), "minimal"
    if kind == "head_dim":
        kw.update(hidden=128, intermediate=256, heads=4, kv_heads=2, head_dim=36)  # 36 -> 40, RoPE kept
        return tiny_model(**kw), "minimal"
    if kind == "rank":
        kw.update(hidden=128, intermediate=256, head_dim=32, heads=4, kv_heads=2, vocab=256)
        m = tiny_model(**kw)
        factorize_(m, "model.layers.0.self_attn.q_proj", 37)
        factorize_(m, "model.layers.1.mlp.down_proj", 53)
        return m, "minimal"
    if kind == "all":  # hidden 120, intermediate 200, 5 heads of 24, GQA 5:1, factorized, optimal (x16)
        m = tiny_model(**kw, head_dim=24)
        factorize_(m, "model.layers.0.self_attn.v_proj", 11)
        factorize_(m, "model.layers.1.mlp.up_proj", 45)
        return m, "optimal"
    raise ValueError(kind)


KINDS = ("hidden", "intermediate", "head_dim", "rank", "all")
EXPECTED = {
    "hidden": {"hidden"},
    "intermediate": {"intermediate"},
    "head_dim": {"head_dim"},
    "rank": {"rank"},
    "all": {"hidden", "intermediate", "head_dim", "rank"},
}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("family", FAMILIES)
def test_repair_is_exact(family: str, kind: str, tmp_path) -> None:
    model, strategy = build(family, kind)
    ref = copy.deepcopy(model)
    report = repair_(model, strategy=strategy, profile=default_profile())
    assert {c.kind for c in report.changes} == EXPECTED[kind]
    assert report.params_after > report.params_before > 0
    assert report.memory_overhead_pct > 0
    # every judged dim except the (deliberately unpadded) vocab is now aligned
    modulus = 8 if strategy == "minimal" else 16
    for d in analyze(model, default_profile()).judged:
        if d.kind != "vocab":
            assert d.value % modulus == 0, (d.kind, d.where, d.value)
    vocab = get_adapter(model).vocab
    diff = check_exact(ref, model, vocab)
    print(f"{family}/{kind}: max |logit diff| = {diff:.2e}")
    # save -> reload gives identical logits
    out = save_repaired(model, tmp_path / "rep", report)
    again = load_model(out).model
    ids = torch.randint(0, vocab, (1, 40))
    with torch.no_grad():
        assert torch.equal(model(ids).logits, again(ids).logits)
    doc = json.loads((out / "gac_repair.json").read_text())
    assert doc["report"]["dims_changed"] == report.dims_changed


def test_tied_embeddings_hidden_padding(tmp_path) -> None:
    """Tied lm_head/embedding (as in SmolLM2) stays tied and exact through hidden padding and reload."""
    model = tiny_model("llama", hidden=115, head_dim=24, intermediate=208)
    model.config.tie_word_embeddings = True
    model.lm_head.weight = model.model.embed_tokens.weight
    ref = copy.deepcopy(model)
    report = repair_(model, "minimal", profile=default_profile())
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert model.lm_head.weight.shape == (250, 120)
    check_exact(ref, model, 250)
    again = load_repaired(save_repaired(model, tmp_path / "rep", report))
    assert again.lm_head.weight is again.model.embed_tokens.weight
    ids = torch.randint(0, 250, (1, 30))
    with torch.no_grad():
        assert torch.equal(model(ids).logits, again(ids).logits)


def test_rope_layout_matters() -> None:
    """Padding q/k heads at the end (instead of per RoPE half) breaks the model: the layout is not cosmetic."""
    model = tiny_model("llama", hidden=128, intermediate=256, heads=4, kv_heads=2, head_dim=36)
    ref = copy.deepcopy(model)
    ad = get_adapter(model)
    d, d_new = 36, 40
    for i in range(ad.num_layers):
        p = ad.projections(i)
        for role, n in (("q", ad.heads), ("k", ad.kv_heads), ("v", ad.kv_heads)):
            pad_out_(model.get_submodule(p[role]), n * d_new, head_end_placement(n, d, d_new))
        pad_in_(model.get_submodule(p["o"]), ad.heads * d_new, head_end_placement(ad.heads, d, d_new))
        model.get_submodule(ad.attention_fqn(i)).head_dim = d_new
    rot = model.model.rotary_emb
    rot.inv_freq = torch.cat([rot.inv_freq, torch.zeros(2)])
    ids = torch.randint(0, 250, (1, 40))
    with torch.no_grad():
        assert (ref(ids).logits - model(ids).logits).abs().max() > 1e-2


def test_predicted_speedup_from_profile() -> None:
    """The report's prediction comes from the profile: 36 -> 40 moves head_dim from class 4 to class 8."""
    model = tiny_model("llama", hidden=128, intermediate=256, heads=4, kv_heads=2, head_dim=36)
    report = repair_(model, "minimal", profile=default_profile())
    assert report.predicted_speedup > 1.0
    assert "speedup" in report.summary()


def test_profile_strategy_uses_profile_rules() -> None:
    prof = default_profile()
    for op in ("gemm_k", "gemm_n"):
        prof.ops[op].modulus = 32
    model = tiny_model("qwen2", hidden=120, intermediate=200, head_dim=24)
    ref = copy.deepcopy(model)
    report = repair_(model, "profile", profile=prof)
    got = {c.kind: c.after for c in report.changes}
    assert got == {"hidden": 128, "intermediate": 224}  # x32 for GEMM dims; head_dim 24 is x8 already
    check_exact(ref, model, 250)


def test_already_aligned_is_noop() -> None:
    model = tiny_model("mistral", hidden=128, intermediate=256, heads=4, kv_heads=2, head_dim=32, vocab=256)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    report = repair_(model, "optimal", profile=default_profile())
    assert report.noop and report.dims_changed == 0 and report.memory_overhead_pct == 0
    assert "no-op" in report.summary()
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_vocab_only_misaligned_is_noop_with_note() -> None:
    model = tiny_model("llama", hidden=128, intermediate=256, heads=4, kv_heads=2, head_dim=32, vocab=250)
    report = repair_(model, "minimal", profile=default_profile())
    assert report.noop
    assert any("vocab 250" in s for s in report.skipped)


def test_no_repairable_dims_is_clear_error() -> None:
    model = tiny_model("llama", hidden=128, intermediate=256, heads=4, kv_heads=2, head_dim=36, vocab=256)
    model.model.rotary_emb.rope_type = "dynamic"  # frequencies recomputed at run time: cannot pad
    with pytest.raises(GacError, match="no repairable dims"):
        repair_(model, "minimal", profile=default_profile())


def test_no_compressible_dims() -> None:
    with pytest.raises(GacError, match="no compressible dims"):
        repair_(tiny_model("llama", layers=0), "minimal", profile=default_profile())


def test_bad_strategy() -> None:
    with pytest.raises(GacError, match="strategy"):
        repair_(tiny_model("llama"), "fastest")


def test_unsupported_architecture() -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=50))
    with pytest.raises(GacError, match="no nn.Linear projections"):
        repair_(model, "minimal")
