"""The Triton latent-cache decode kernel: against float64 torch, and against the module's reconstruct-and-attend path.

The kernel-level tests run under Triton's CPU interpreter (a subprocess) and, on CUDA, on the GPU.
The module tests run on CUDA, or on CPU when the whole session runs with ``TRITON_INTERPRET=1``.
"""

from __future__ import annotations

import copy
import os

import pytest
import torch

from gac.compat import cache_arg

triton = pytest.importorskip("triton")

from gac.api import CompressConfig, plan  # noqa: E402
from gac.testing import tiny_model  # noqa: E402

from .interp import run_interpreted  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
needs_device = pytest.mark.skipif(
    DEV == "cpu" and os.environ.get("TRITON_INTERPRET") != "1", reason="needs CUDA or TRITON_INTERPRET=1"
)

#: kernel cases: (batch, heads, kv_heads, head_dim, key group, value group, cache slots, valid tokens,
#: key bias, key RMSNorm, launch "block_t,block_r,num_warps,num_stages,splits[,unroll]"); odd ranks are drawn
CASES = [
    (2, 8, 2, 32, 2, 2, 75, 70, False, False, "16,16,4,1,3"),  # Llama-like: n_rep 4, 3 splits, partial tile
    (
        2,
        14,
        2,
        32,
        1,
        2,
        60,
        53,
        True,
        False,
        "16,32,4,1,2",
    ),  # Qwen2-like bias, n_rep 7, values wider than keys
    (1, 4, 4, 32, 4, 1, 48, 40, False, True, "16,16,4,1,4"),  # k_norm, n_rep 1, values narrower than keys
    (1, 28, 4, 32, 4, 4, 40, 33, True, True, "16,16,4,1,1"),  # key group 4 with n_rep 7: 28 rows of 32
    (2, 8, 8, 32, 2, 4, 30, 20, True, False, "16,16,4,1,4"),  # more splits than tiles: empty splits
    # key group 4 in one program of at most 16 query rows (the Llama-3-8B row): the tile start's rotation turns
    # the queries (Q_ROT), over 5 tiles in 3 splits, with bias; then the same with the keys cached raw and a norm
    (2, 16, 4, 32, 4, 4, 75, 70, True, False, "16,16,4,1,3"),
    (2, 16, 4, 32, 4, 4, 75, 70, True, True, "16,64,4,2,3", True),
    # the pipelined rank loop with per-position RoPE (launch field 7, kloop): key group 4 with bias and norm,
    # then key group 2 with its heads unrolled
    (1, 28, 4, 32, 4, 4, 40, 33, True, True, "16,16,4,2,2,2,1"),
    (2, 8, 2, 32, 2, 2, 75, 70, False, False, "16,16,4,2,3,2,1"),
    # a key group over several programs (launch field 8, sub: KV heads per program): key group 4 as two
    # programs of 2 heads (rank chunks) and as four of 1 head with its whole up-projection staged (block_r
    # covers the rank), with bias and norm and n_rep 7; key group 2 as two programs, values of group 4
    (1, 28, 4, 32, 4, 4, 40, 33, True, True, "16,16,4,1,2,2,0,2"),
    (2, 28, 4, 32, 4, 4, 40, 33, True, True, "16,64,4,1,2,2,0,1"),
    (2, 8, 4, 32, 2, 4, 75, 70, False, False, "16,64,4,2,3,2,0,1"),
    # one split over 41 tiles: each tile's RoPE start rotated from the last one's (with the table), 40 times
    (1, 8, 2, 32, 2, 2, 700, 650, False, False, "16,16,4,1,1"),
    (1, 8, 2, 32, 2, 2, 700, 650, True, False, "16,16,4,2,1,2,1"),
    # keys cached raw (a layer whose key groups are all kept at full width; field 12): key group 4 with bias
    # and norm and n_rep 7, over programs of 2 KV heads; key group 2 with values of group 4; key group 1
    (1, 28, 4, 32, 4, 4, 40, 33, True, True, "16,64,4,1,2", True),
    (2, 28, 4, 32, 4, 2, 75, 70, True, False, "16,64,4,2,3,2,0,2", True),
    (2, 8, 4, 32, 2, 4, 75, 70, False, False, "16,64,4,2,3", True),
    (2, 8, 2, 32, 1, 2, 75, 70, False, True, "32,64,4,2,2", True),
    # ranks aligned to 8 (field 13: the key and value ranks) at 128-token tiles, so the value latents load through a
    # tensor descriptor into a transposed P·Z_v (V_DESC, V_T): a value rank past 256 in two column halves at
    # head_dim 128; key group 4 with n_rep 7 over programs of 2 KV heads (14 query rows), turning the queries
    # (Q_ROT), with bias; values grouped apart from the keys (a descriptor load per KV head)
    (1, 8, 4, 128, 4, 4, 70, 65, True, False, "128,16,4,1,2", False, ([64], [296])),
    (1, 28, 4, 32, 4, 4, 300, 290, True, False, "128,16,4,1,2,1,0,2", False, ([40], [48])),
    (2, 8, 4, 32, 2, 4, 150, 140, False, True, "128,16,4,1,2", False, ([16, 24], [40])),
    # the paired rebuild (PAIRED_KEYS: head_dim >= 64, programs of part of a key group past two, more than one rank
    # chunk): programs of two KV heads with bias and norm over 5 tiles in 3 splits, and with bias and n_rep 7
    (1, 16, 4, 64, 4, 4, 75, 70, True, True, "16,16,4,1,3,2,0,2"),
    (1, 28, 4, 64, 4, 4, 40, 33, True, False, "16,16,4,1,2,2,0,2"),
]

KERNEL_SCRIPT = """
import sys

import torch
import gac.kernels.latent_attention as kl
from gac.testing import latent_decode_inputs


def run(cases, device, dtype, tol, seed):
    g = torch.Generator().manual_seed(seed)
    for case in cases:
        print("case", case, file=sys.stderr, flush=True)  # shown with a failure: which case it was
        b, h, kvh, hd, gk, gv, t, n, bias, norm, launch = case[:11]
        raw = len(case) > 11 and case[11]
        kr = [int(x) for x in torch.randint(5, 40, (kvh // gk,), generator=g)]
        if raw:  # the keys cached as they are: each key group at full width
            kr = [gk * hd] * (kvh // gk)
        vr = [int(x) for x in torch.randint(5, 40, (kvh // gv,), generator=g)]
        if len(case) > 12:  # fixed ranks
            kr, vr = case[12]
        q, zk, zv, pack, inv = latent_decode_inputs(
            b, h, kvh, hd, t, gk, gv, kr, vr, bias=bias, norm=norm, dtype=dtype, device=device,
            seed=int(torch.randint(0, 1 << 30, (1,), generator=g)), raw=raw,
        )
        kl._ENV = launch
        scale, rs = hd**-0.5, 1.25
        voff, vrk, shared, valign = kl.per_kv_head(pack, q.device)
        out = kl._launch(
            q, zk, zv, pack["uk"], pack["koff"], pack["kr"], voff, vrk, pack["k_bias"], pack["k_norm"], inv,
            torch.tensor([n], device=device), scale, rs, 1e-6, pack["rk_max"], max(vr), kvh, gk, shared,
            pack["align"], valign, poison=float("nan"), raw=raw,
        )
        assert kl.LAST_LAUNCH["raw_keys"] is raw
        if len(case) > 12:  # ranks aligned to 8: the value latents read through the descriptor
            assert kl.LAST_LAUNCH["value_tma"] is (device != "cuda" or torch.cuda.get_device_capability()[0] >= 9)
        assert kl.LAST_LAUNCH["splits"] == (int(launch.split(",")[4]) or kl.LAST_LAUNCH["splits"])
        assert kl.LAST_LAUNCH["rope_table"] is False  # no table passed: the kernel evaluates cos/sin itself
        ref = kl.reference_latent_decode(q, zk, zv, pack, n, inv, scale, rs)
        got = out[..., : ref.shape[-1]].double()
        assert not got.isnan().any(), "unwritten output"
        assert (out[..., ref.shape[-1] :] == 0).all(), "the output past the largest value rank is not zero"
        err = ((got - ref).norm() / ref.norm()).item()
        assert err < tol, (b, h, kvh, gk, gv, bias, norm, err)
        # the wrapper passes the pack's rotary table: in-tile cos/sin read, tile starts rotated by the step
        outs = kl.latent_decode_attention(q, zk, zv, pack, torch.tensor([n], device=device), inv, scale, rs)
        assert kl.LAST_LAUNCH["rope_table"] is True
        hv = h // len(vr)
        for i, (o, r) in enumerate(zip(outs, vr)):
            assert o.shape == (b, hv, r)
            e = ((o.double() - ref[:, i * hv : (i + 1) * hv, :r]).norm() / ref[:, i * hv : (i + 1) * hv, :r].norm())
            assert e < tol, (i, e.item())
"""


def _assert_kernel_matches_reference(m, attn, g, b: int = 2, t0: int = 45) -> None:
    """One decode step of ``attn`` after a ``t0``-token prefill: ``_kernel_forward`` against the
    reference path (``use_kernel=False``), both writing the token's latents at slot ``t0``."""
    from transformers import StaticCache

    cache = StaticCache(config=m.config, max_cache_len=70)
    ids = torch.randint(3, 240, (b, t0), generator=g).to(DEV)
    with torch.no_grad():
        m(ids, **cache_arg(m, cache), use_cache=True)
        h = torch.randn(b, 1, m.config.hidden_size, generator=g).to(DEV)
        pos = torch.tensor([t0], device=DEV)
        pe = m.model.rotary_emb(h, pos[None])
        if DEV == "cuda":  # the kernel serves this layout: no reason to fall back
            assert attn.decode_refusals(h, cache, pos, pos[None]) == []
        attn.use_kernel = False
        mask = (torch.arange(70, device=DEV) <= t0).view(1, 1, 1, 70).expand(b, 1, 1, 70)
        ref, _ = attn(h, pe, mask, **cache_arg(attn, cache), position_ids=pos[None], cache_position=pos)
        got = attn._kernel_forward(h, pe, cache, pos, pos[None])
    # fp32 inputs: tl.dot runs in TF32 on a GPU (10-bit mantissa), exactly in the interpreter
    tol = dict(atol=2e-4, rtol=1e-3) if DEV == "cpu" else dict(atol=2e-2, rtol=2e-2)
    assert torch.allclose(got, ref, **tol), (got - ref).abs().max()


@needs_device
@pytest.mark.parametrize(
    ("group_size", "ratio", "fold", "align", "search"),
    [(2, 0.45, True, "none", None), (2, 0.45, False, "none", None), (1, 0.7, False, "none", None),
     (4, 0.3, True, "none", None), (2, 0.45, True, "round", None), (1, 0.5, False, "none", "fisher")],
)  # fmt: skip
def test_kernel_matches_reference(group_size, ratio, fold, align, search):

    base = tiny_model("llama", hidden=128, layers=1, heads=8, kv_heads=4, head_dim=64)
    g = torch.Generator().manual_seed(3)
    batches = [torch.randint(3, 240, (2, 32), generator=g) for _ in range(4)]
    p = plan(
        copy.deepcopy(base),
        CompressConfig(compressor="palu", param_ratio=ratio, align=align,
                       options={"group_size": group_size, **({"search": search} if search else {})}),
        calib_batches=batches,
    )  # fmt: skip
    m = copy.deepcopy(base)
    p.compressor.fold_values = fold
    p.compressor.apply(m, p.sites, p.native)
    m = m.to(DEV)
    attn = m.model.layers[0].self_attn
    assert attn.folded == fold
    from gac.kernels.latent_attention import latent_align

    ranks = attn.k_proj.ranks + attn.v_proj.ranks
    if align == "none":
        assert any(r % 16 for r in ranks)  # odd ranks exercised
    # value groups of one rank take one batched up-projection, of several ranks one per group
    one_up = attn.decode_pack()["uv_all"] is not None
    assert one_up == (len(set(attn.v_proj.ranks)) == 1)
    if search == "fisher":  # a rank per group: the per-group up-projections
        assert not one_up
    # the kernel takes the key latents' strides, offsets and ranks as multiples of their alignment
    koff, kr = attn.k_proj.offsets(), attn.k_proj.ranks
    assert (
        attn.decode_pack()["align"]
        == latent_align(*koff, *kr)
        in ((8,) if align == "round" else (1, 2, 4, 8))
    )
    _assert_kernel_matches_reference(m, attn, g)


@pytest.mark.skipif(DEV != "cuda", reason="the model takes the kernel only on CUDA")
def test_model_decode_step_takes_kernel(monkeypatch):
    from transformers import StaticCache

    import gac.kernels.latent_attention as kl

    base = tiny_model("llama", hidden=256, layers=2, heads=8, kv_heads=4, head_dim=64)
    g = torch.Generator().manual_seed(4)
    batches = [torch.randint(3, 240, (2, 32), generator=g) for _ in range(4)]
    p = plan(
        copy.deepcopy(base),
        CompressConfig(compressor="palu", param_ratio=0.5, align="none", options={"group_size": 2}),
        calib_batches=batches,
    )
    m = copy.deepcopy(base)
    p.compressor.apply(m, p.sites, p.native)
    m = m.to(DEV)
    calls = []
    real = kl.latent_decode_attention
    monkeypatch.setattr(kl, "latent_decode_attention", lambda *a, **k: calls.append(1) or real(*a, **k))
    ids = torch.randint(3, 240, (2, 30), generator=g).to(DEV)
    outs = []
    for use in (True, False):
        for _, a in m.named_modules():
            if hasattr(a, "use_kernel"):
                a.use_kernel = use
        cache = StaticCache(config=m.config, max_cache_len=40)
        with torch.no_grad():
            m(ids[:, :29], **cache_arg(m, cache), use_cache=True)
            outs.append(m(ids[:, 29:], **cache_arg(m, cache), use_cache=True).logits)
    assert len(calls) == 2  # one decode step, two layers
    assert torch.allclose(outs[0], outs[1], atol=3e-2, rtol=3e-2), (outs[0] - outs[1]).abs().max()


#: (family, key group size, value group size): Llama, Qwen2 (biased keys), Qwen3 (per-head key
#: norm), Granite (found by structural discovery; attention multiplier as the softmax scale)
FAMILY_CASES = [
    ("llama", 1, 2, False),
    ("llama", 4, 1, True),
    ("qwen2", 2, 1, False),
    ("qwen3", 1, 4, False),
    ("qwen3", 2, 2, True),
    ("granite", 2, 4, False),
]
#: what a family needs the decode kernel to take (``FEATURES`` of gac.kernels.latent_attention)
NEEDS = {"qwen2": "k_bias", "qwen3": "k_norm"}


def _family_model(family, kg, vg, fold, layers=1, hidden=128):
    import gac.kernels.latent_attention as kl

    need = NEEDS.get(family)
    if need and need not in getattr(kl, "FEATURES", frozenset()):
        pytest.skip(f"this build's decode kernel does not declare {need!r} in FEATURES")
    base = tiny_model(family, hidden=hidden, layers=layers, heads=8, kv_heads=4, head_dim=64)
    g = torch.Generator().manual_seed(5)
    batches = [torch.randint(3, 240, (2, 32), generator=g) for _ in range(4)]
    opts = {"k_group_size": kg, "v_group_size": vg}
    p = plan(
        copy.deepcopy(base),
        CompressConfig(compressor="palu", param_ratio=0.45, align="none", options=opts),
        calib_batches=batches,
    )
    m = copy.deepcopy(base)
    p.compressor.fold_values = fold
    p.compressor.apply(m, p.sites, p.native)
    return m.to(DEV), g


@needs_device
@pytest.mark.parametrize(("family", "kg", "vg", "fold"), FAMILY_CASES)
def test_kernel_matches_reference_across_families(family, kg, vg, fold):
    """``LatentAttention._kernel_forward`` against the reference path, one decode step."""

    m, g = _family_model(family, kg, vg, fold)
    attn = m.model.layers[0].self_attn
    assert attn.n_groups == (4 // kg, 4 // vg)
    _assert_kernel_matches_reference(m, attn, g)


@needs_device
@pytest.mark.parametrize(("family", "kg"), [("llama", 4), ("qwen2", 2), ("qwen3", 1)])
def test_raw_key_layer_matches_reference_across_families(family, kg):
    """A layer whose key groups are all kept at full width caches its keys raw: the kernel reads them (no
    rebuild; with the key bias and the per-head key norm) and matches the reference path."""
    import gac.kernels.latent_attention as kl

    base = tiny_model(family, hidden=128, layers=1, heads=8, kv_heads=4, head_dim=64)
    g = torch.Generator().manual_seed(6)
    batches = [torch.randint(3, 240, (2, 32), generator=g) for _ in range(4)]
    p = plan(
        copy.deepcopy(base),
        CompressConfig(compressor="palu", param_ratio=0.6, align="none",
                       options={"k_group_size": kg, "v_group_size": 2}),
        calib_batches=batches,
    )  # fmt: skip
    dims = {s.name: s.max_dim if s.meta["kind"] == "k" else p.native[s.name] for s in p.sites}
    m = copy.deepcopy(base)
    p.compressor.apply(m, p.sites, dims)
    m = m.to(DEV)
    attn = m.model.layers[0].self_attn
    assert attn.decode_pack()["k_raw"]
    _assert_kernel_matches_reference(m, attn, g)
    assert kl.LAST_LAUNCH["raw_keys"] is True


@pytest.mark.gpu
@pytest.mark.skipif(DEV != "cuda", reason="the model takes the kernel only on CUDA")
@pytest.mark.parametrize(("family", "kg", "vg", "fold"), FAMILY_CASES)
def test_model_decode_takes_the_kernel_across_families(family, kg, vg, fold):
    """Every layer's decode steps take the kernel (recorded), with the reference path's logits."""
    from transformers import StaticCache

    from gac.nn.latent import latent_attention_paths, latent_modules

    m, g = _family_model(family, kg, vg, fold, layers=2, hidden=256)
    ids = torch.randint(3, 240, (2, 30), generator=g).to(DEV)
    outs = []
    for use in (True, False):
        for _, a in latent_modules(m):
            a.use_kernel = use
        cache = StaticCache(config=m.config, max_cache_len=40)
        with torch.no_grad():
            m(ids[:, :29], **cache_arg(m, cache), use_cache=True)
            outs.append(m(ids[:, 29:], **cache_arg(m, cache), use_cache=True).logits)
        if use:
            paths = latent_attention_paths(m)
            assert {k: paths[k] for k in ("kernel", "reference", "unrecorded", "reasons")} == {
                "kernel": 2, "reference": 0, "unrecorded": 0, "reasons": []
            }  # fmt: skip
            assert paths[
                "latent_kernels"
            ]  # which kernels ran (head_dim 64: the Triton one; gac.kernels.latent_gluon)
    assert torch.allclose(outs[0], outs[1], atol=3e-2, rtol=3e-2), (outs[0] - outs[1]).abs().max()


def test_flash_kernel_in_triton_interpreter_matches_float64():
    # fresh random ranks and inputs per run; fp32 dots are exact in the interpreter
    seed = int.from_bytes(os.urandom(4), "little")
    run_interpreted(
        f"CASES = {CASES!r}\n{KERNEL_SCRIPT}\nrun(CASES, 'cpu', torch.float32, 1e-5, {seed})\nprint('ok')"
    )


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_flash_kernel_on_gpu_matches_float64(dtype):
    ns: dict = {}
    exec(KERNEL_SCRIPT, ns)
    big = [(3, 32, 8, 128, g, 4, 1100, 1037, False, False, "64,64,4,2,0") for g in (1, 2, 4)]
    big += [(2, 28, 4, 128, g, 2, 700, 689, True, g == 2, "32,64,4,2,0") for g in (1, 2, 4)]
    big += [(3, 32, 8, 128, 4, 4, 1100, 1037, False, False, "64,128,8,3,0,2,1")]  # the pipelined rank loop
    big += [(2, 28, 4, 128, 4, 2, 700, 689, True, True, "64,128,8,2,0,2,1")]
    # a key group of 4 over programs of 2 and 1 KV heads, the up-projection staged where block_r covers the rank
    big += [(3, 32, 8, 128, 4, 4, 1100, 1037, False, False, f"32,{br},4,2,0,2,0,{sub}") for br, sub in
            ((64, 2), (256, 1))]  # fmt: skip
    big += [(1, 28, 4, 128, 4, 4, 700, 689, True, True, "32,64,4,3,0,2,0,1")]
    # 32k tokens in one split: 1024 tile starts, each rotated from the last (the table's step row)
    big += [(1, 32, 8, 128, 1, 2, 32800, 32768, False, False, "32,64,4,3,1")]
    # keys cached raw at head_dim 128 (the first layer of the 8B shapes): Llama-like, and Qwen2-like with bias
    big += [(3, 32, 8, 128, 4, 4, 1100, 1037, False, False, "64,64,4,2,0", True)]
    big += [(2, 28, 4, 128, 4, 4, 700, 689, True, False, "64,64,4,2,0,2,0,1", True)]
    # ranks aligned to 8 (values through the tensor descriptor) at the default launches: the Llama-3-8B row with
    # a value rank past 256 (two column halves), Qwen2.5-7B's key group of 4 over programs of 2 KV heads
    big += [(3, 32, 8, 128, 4, 4, 1100, 1037, False, False, "128,64,8,2,0", False, ([256, 208], [496, 224]))]
    big += [(2, 28, 4, 128, 4, 4, 1100, 1037, True, False, "128,64,8,2,0,1,0,2", False, ([224], [448]))]
    # tf32 dots for fp32 inputs (three chained: key rebuild, scores, P·Z_v; an H100 gave 4.3e-3 at
    # key group 1 x 8 KV heads, hd 128, 1037 tokens); bf16 keys and probabilities for bf16
    try:
        ns["run"](CASES + big, "cuda", dtype, 1e-2 if dtype == torch.float32 else 2e-2, 7)
    finally:
        ns["kl"]._ENV = None


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
def test_queries_and_latent_downs_fuse_exactly(family):
    """The infer eval's fusion puts ``q_proj`` and both latent down-projections in one GEMM
    (``fused_q_k_v``): prefill and a decode step against a static cache keep their logits, and the
    way back restores stand-alone projections."""
    from transformers import StaticCache

    from gac.nn.fused import FusedSlice, fuse_projections_, unfuse_projections_
    from gac.nn.latent import LatentProjection

    m, g = _family_model(family, 2, 2, False, layers=2)
    m = m.to("cpu", torch.float64)
    ids = torch.randint(3, 240, (2, 30), generator=g)

    def run():
        cache = StaticCache(config=m.config, max_cache_len=40)
        with torch.no_grad():
            pre = m(ids[:, :29], **cache_arg(m, cache), use_cache=True).logits
            return pre, m(ids[:, 29:], **cache_arg(m, cache), use_cache=True).logits

    ref = run()
    groups = fuse_projections_(m)
    assert sum(g.endswith(":q_proj+k_proj.down+v_proj.down") for g in groups) == 2
    attn = m.model.layers[0].self_attn
    assert isinstance(attn.k_proj, LatentProjection) and isinstance(attn.k_proj.down, FusedSlice)
    assert attn.fused_q_k_v.splits == [
        attn.q_proj.out_features,
        sum(attn.k_proj.ranks),
        sum(attn.v_proj.ranks),
    ]
    got = run()
    for a, b in zip(got, ref, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)
    w = attn.k_proj.weight  # the dense equivalent still reads the fused rows
    assert w.shape == (attn.kv_heads * attn.head_dim, attn.fused_q_k_v.in_features)
    assert unfuse_projections_(m) == 2 * 2  # attention and MLP groups of both layers
    assert isinstance(attn.k_proj.down, torch.nn.Linear) and not hasattr(attn, "fused_q_k_v")
    for a, b in zip(run(), ref, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


COMPILED_STEP_SCRIPT = """
import torch
from torch._dynamo.utils import counters
from transformers import StaticCache
from gac.api import CompressConfig, compress_
from gac.compat import cache_arg
from gac.nn.fused import fuse_projections_
from gac.nn.latent import LatentAttention, latent_attention_paths
from gac.testing import tiny_model

m = tiny_model(FAMILY, hidden=128, layers=3, heads=8, kv_heads=4, head_dim=32)
g = torch.Generator().manual_seed(0)
calib = [torch.randint(3, 240, (2, 32), generator=g) for _ in range(4)]
opts = {"k_group_size": 2, "v_group_size": 2}
compress_(m, CompressConfig(compressor="palu", param_ratio=0.5, align="none", options=opts), calib_batches=calib)
LatentAttention.decode_refusals = lambda self, *a, **k: []  # the kernel path on the CPU (the interpreter)
fuse_projections_(m)
m.eval()
prompt = torch.randint(3, 240, (2, 5), generator=g)
ids = torch.randint(3, 240, (2, 1), generator=g)
cache = StaticCache(config=m.config, max_cache_len=64)
with torch.no_grad():
    # an eager prefill (as gac generate's first): the cache, and the packs for the compiled decode steps
    m(prompt, **cache_arg(m, cache), use_cache=True, cache_position=torch.arange(5))
    f = torch.compile(m.forward)
    got = [f(input_ids=ids, **cache_arg(m, cache), use_cache=True, cache_position=torch.tensor([p])).logits
           for p in (5, 6, 7)]
    assert latent_attention_paths(m)["kernel"] == 3
    graphs, breaks = counters["stats"]["unique_graphs"], sum(counters["graph_break"].values())
    cache2 = StaticCache(config=m.config, max_cache_len=64)
    m(prompt, **cache_arg(m, cache2), use_cache=True, cache_position=torch.arange(5))
    ref = [m(ids, **cache_arg(m, cache2), use_cache=True, cache_position=torch.tensor([p])).logits
           for p in (5, 6, 7)]
assert (graphs, breaks) == (1, 0), (graphs, dict(counters["graph_break"]))
for a, b in zip(got, ref):
    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
print("ok")
"""


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
def test_compiled_decode_step_on_the_kernel_path_is_one_graph(family):
    """A PaLU decode step through ``torch.compile`` on the kernel path: one Dynamo graph, no break, eager's
    logits, on Llama, Qwen2 (key bias) and Qwen3 (per-head key norm). ``decode_pack``'s storage check (``data_ptr``) broke the graph at every layer, and on CUDA the
    rest of each layer's step ran eager (``benchmarks/results/h100/palu-trace/breaks.log``)."""
    run_interpreted(f"FAMILY = {family!r}\n{COMPILED_STEP_SCRIPT}")
