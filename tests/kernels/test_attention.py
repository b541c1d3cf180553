"""Decode attention on the KV heads of a grouped-query cache (``gac_sdpa``): the same logits as
transformers' ``sdpa`` in both decode modes, prefill untouched, and which models it applies to."""

from __future__ import annotations

import pytest
import torch

import gac.kernels.attention as A
from gac.compat import cache_arg
from gac.testing import tiny_model


def _decode_logits(model, ids: torch.Tensor, steps: int) -> torch.Tensor:
    """Prefill ``ids`` into a static cache, then ``steps`` greedy single-token steps; all logits."""
    from transformers import StaticCache

    cache = StaticCache(config=model.config, max_cache_len=ids.shape[1] + steps + 1)
    out = model(input_ids=ids, **cache_arg(model, cache), use_cache=True)
    logits = [out.logits[:, -1]]
    nxt = out.logits[:, -1:].argmax(-1)
    for _ in range(steps):
        out = model(input_ids=nxt, **cache_arg(model, cache), use_cache=True)
        logits.append(out.logits[:, -1])
        nxt = out.logits[:, -1:].argmax(-1)
    return torch.stack(logits, 1)


@pytest.mark.parametrize("family", ["llama", "qwen2"])
@pytest.mark.parametrize("mode", ["sdpa", "matmul", "stock", "auto"])
def test_grouped_decode_equals_sdpa(family, mode, monkeypatch):
    # 6 query heads on 2 KV heads of 20 (misaligned), batch 3 with a padded row
    model = tiny_model(family, hidden=120, heads=6, kv_heads=2, layers=2)
    model.config._attn_implementation = "sdpa"
    ids = torch.randint(0, 250, (3, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = _decode_logits(model, ids, 6)
        assert A.use_gqa_decode_(model)
        assert model.config._attn_implementation == A.NAME
        monkeypatch.setattr(A, "DECODE_MODE", mode)
        calls = []
        real = A.decode_mode  # called on the grouped single-token path only
        monkeypatch.setattr(A, "decode_mode", lambda *a: calls.append(a) or real(*a))
        got = _decode_logits(model, ids, 6)
    assert len(calls) == 6 * 2  # every decode step of both layers took the grouped path
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    A.undo_gqa_decode_(model)
    assert model.config._attn_implementation == "sdpa"


def test_auto_mode_takes_sdpa_only_past_the_measured_gemm_range(monkeypatch):
    monkeypatch.setattr(A, "DECODE_MODE", "auto")
    assert A.decode_mode(1, 8, 512) == "matmul"
    assert A.decode_mode(64, 8, A.MATMUL_MAX_KV) == "matmul"
    # past KV 4096 the GEMMs up to B16 x 8 KV heads (measured: B1 x KV 32768 3.4x faster on an H200)
    assert A.decode_mode(1, 8, A.MATMUL_MAX_KV + 1) == "matmul"
    assert A.decode_mode(A.MATMUL_MAX_CTAS // 8, 8, 32768) == "matmul"
    # past 128 pairs, up to 2^24 cached slots (measured: B64 x 8 KV heads x 32768 0.82x SDPA's step on an H200)
    assert A.decode_mode(64, 8, 32768) == "matmul"
    assert A.decode_mode(128, 4, 32768) == "matmul"
    assert A.decode_mode(128, 8, 16384) == "matmul"
    # beyond, SDPA (the GEMMs ran out of memory at B128 x 8 x 32768 where SDPA fit)
    assert A.decode_mode(128, 8, 32768) == "sdpa"
    assert A.decode_mode(A.MATMUL_MAX_CTAS // 8 + 1, 8, A.MATMUL_MAX_SLOTS // 136 + 1) == "sdpa"
    monkeypatch.setattr(A, "DECODE_MODE", "sdpa")
    assert A.decode_mode(1, 8, 512) == "sdpa"
    monkeypatch.setattr(A, "DECODE_MODE", "stock")
    assert A.decode_mode(64, 8, 65536) == "stock"


def test_only_grouped_sdpa_models_switch():
    mha = tiny_model("llama", heads=5, kv_heads=5)  # no grouping: nothing to regroup
    mha.config._attn_implementation = "sdpa"
    assert not A.use_gqa_decode_(mha) and mha.config._attn_implementation == "sdpa"
    eager = tiny_model("llama", heads=6, kv_heads=2)
    eager.config._attn_implementation = "eager"
    assert not A.use_gqa_decode_(eager) and eager.config._attn_implementation == "eager"
