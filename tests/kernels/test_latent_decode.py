"""The Triton latent-cache decode kernel against the module's reconstruct-and-attend path.

Runs on CUDA, or on CPU under Triton's interpreter (``TRITON_INTERPRET=1``) when Triton is
installed; skipped otherwise (CI has no Triton).
"""

from __future__ import annotations

import copy
import os

import pytest
import torch

triton = pytest.importorskip("triton")

from gac.api import CompressConfig, plan  # noqa: E402
from gac.kernels.latent_attention import latent_decode_attention  # noqa: E402
from gac.testing import tiny_model  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
if DEV == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("needs CUDA or TRITON_INTERPRET=1", allow_module_level=True)


@pytest.mark.parametrize(("group_size", "ratio"), [(2, 0.45), (1, 0.7), (4, 0.3)])
def test_kernel_matches_reference(group_size, ratio):
    from transformers import StaticCache

    base = tiny_model("llama", hidden=128, layers=1, heads=8, kv_heads=4, head_dim=64)
    g = torch.Generator().manual_seed(3)
    batches = [torch.randint(3, 240, (2, 32), generator=g) for _ in range(4)]
    p = plan(
        copy.deepcopy(base),
        CompressConfig(compressor="palu", param_ratio=ratio, align="none", options={"group_size": group_size}),
        calib_batches=batches,
    )
    m = copy.deepcopy(base)
    p.compressor.apply(m, p.sites, p.native)
    m = m.to(DEV)
    attn = m.model.layers[0].self_attn
    assert any(r % 16 for r in attn.k_proj.ranks + attn.v_proj.ranks)  # odd ranks exercised
    b, t0 = 2, 45
    cache = StaticCache(config=m.config, max_cache_len=70)
    ids = torch.randint(3, 240, (b, t0 + 1), generator=g).to(DEV)
    with torch.no_grad():
        m(ids[:, :t0], past_key_values=cache, use_cache=True)
        h = torch.randn(b, 1, 128, generator=g).to(DEV)
        pos = torch.tensor([t0], device=DEV)
        pe = m.model.rotary_emb(h, pos[None])
        attn.use_kernel = False
        mask = (torch.arange(70, device=DEV) <= t0).view(1, 1, 1, 70).expand(b, 1, 1, 70)
        ref, _ = attn(h, pe, mask, past_key_values=cache, position_ids=pos[None], cache_position=pos)
        # the reference path wrote the token's latents at slot t0; the kernel reads them back
        q = attn._queries(h, pe)[:, :, 0].contiguous()
        layer = cache.layers[0]
        pack = attn.decode_pack()
        out = latent_decode_attention(
            q, layer.keys[:, 0], layer.values[:, 0], pack, pos + 1, m.model.rotary_emb.inv_freq.float(), attn.scaling
        )
        got = attn.o_proj(out.reshape(b, -1).index_select(1, pack["gather"])).unsqueeze(1)
    # the reference masks the empty slots > t0; the kernel stops at cache_len
    assert torch.allclose(got, ref, atol=2e-4, rtol=1e-3), (got - ref).abs().max()
