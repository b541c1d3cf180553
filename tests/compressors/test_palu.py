"""PaLU: rank search, latent attention exactness, latent cache, budgets, save/load, bad input."""

from __future__ import annotations

import copy
import logging

import pytest
import torch

from gac.api import CompressConfig, apply_, compress_, gac_config_for_save, plan
from gac.compat import cache_arg, output_cache
from gac.compressors.palu import PaluCompressor, fisher_ranks, round_reference
from gac.errors import GacError
from gac.models.inventory import kv_bytes_per_token
from gac.nn.latent import LatentAttention, LatentCache, latent_modules
from gac.testing import tiny_model

GEOM = dict(hidden=120, layers=2, heads=8, kv_heads=4, head_dim=24)  # 4 KV heads of 24: misaligned


def _batches(n: int = 6, seq: int = 32) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return [torch.randint(3, 240, (2, seq), generator=g) for _ in range(n)]


def _ids(b: int = 2, s: int = 24) -> torch.Tensor:
    return torch.randint(3, 240, (b, s), generator=torch.Generator().manual_seed(2))


@pytest.fixture(scope="module")
def llama64():
    return tiny_model("llama", **GEOM).double()


@pytest.fixture(scope="module")
def planned(llama64):
    m = copy.deepcopy(llama64)
    cfg = CompressConfig(compressor="palu", param_ratio=0.5, align="none", options={"group_size": 2})
    return plan(m, cfg, calib_batches=_batches())


def _applied(base, p, dims, fold=True):
    m = copy.deepcopy(base)
    c = p.compressor
    old, c.fold_values = c.fold_values, fold
    try:
        c.apply(m, p.sites, dims)
    finally:
        c.fold_values = old
    return m


def test_fisher_ranks_reference_rule():
    assert fisher_ranks([1.0, 3.0], [100, 100], 50) == [13, 37]
    r = fisher_ranks([5.0, 1.0, 1.0], [20, 100, 100], 90)
    assert r[0] == 20 and sum(r) == 90  # capped at full rank, the rest handed out
    assert round_reference(47) == 32 and round_reference(48) == 64 and round_reference(80) == 64
    assert round_reference(3) == 32  # never below one block
    with pytest.raises(GacError, match="Fisher"):
        fisher_ranks([0.0, 0.0], [4, 4], 4)


def test_sites_and_native_allocation(planned):
    p = planned
    assert len(p.sites) == 2 * 2 * 2  # layers x (K, V) x groups
    assert all(s.max_dim == 48 and s.unit_cost == 1 for s in p.sites)
    assert p.budget == int(0.5 * 8 * 48)
    cost = sum(p.native.values())
    assert cost <= p.budget and cost >= p.budget - 2 * 4  # fisher_uniform: floor split per projection
    # fisher_uniform: both groups of a projection share its rank
    for kind in ("k_proj", "v_proj"):
        for layer in (0, 1):
            r = {p.native[f"model.layers.{layer}.self_attn.{kind}:g{g}"] for g in (0, 1)}
            assert len(r) == 1


def test_per_site_params_are_weights_not_latent_dims(llama64, planned):
    """The allocation's ``params`` (the per-site table's column) counts the down and up weights the
    latent site holds at its rank; its ``cost`` is the budget's unit, latent dims."""
    m = copy.deepcopy(llama64)
    rep = apply_(m, planned, planned.allocation("none"))
    rows = rep.allocation["sites"]
    assert len(rows) == 8
    for r in rows:
        gd = 48  # group of 2 KV heads x 24
        assert r["cost"] == (gd if r["dense"] else r["dim"])
        assert r["params"] == (gd * 120 if r["dense"] else r["dim"] * (120 + gd))


def test_full_rank_is_exact(llama64, planned):
    full = {s.name: s.max_dim for s in planned.sites}
    m = _applied(llama64, planned, full)
    assert len(latent_modules(m)) == 2
    ids = _ids()
    with torch.no_grad():
        assert torch.allclose(m(ids).logits, llama64(ids).logits, atol=1e-9, rtol=0)
        # incremental decode through the latent cache equals the dense model's cached decode
        out = m(ids[:, :10], **cache_arg(m, LatentCache()), use_cache=True)
        ref = llama64(ids[:, :10], use_cache=True)
        a = m(ids[:, 10:12], **cache_arg(m, output_cache(out))).logits
        b = llama64(ids[:, 10:12], **cache_arg(llama64, output_cache(ref))).logits
    assert torch.allclose(a, b, atol=1e-9, rtol=0)


def test_latent_layers_record_no_dense_decode_attention(llama64, planned):
    """A PaLU model switched to ``gac_sdpa`` (its config was ``sdpa``) attends with its own latent path: the infer
    record's ``decode_attention`` (model_decode_modes) names none, where the dense model names its GEMMs."""
    from gac.kernels.attention import model_decode_modes, use_gqa_decode_

    dense = copy.deepcopy(llama64)
    m = _applied(llama64, planned, {s.name: 16 for s in planned.sites})
    assert use_gqa_decode_(dense) and use_gqa_decode_(m)
    assert model_decode_modes(dense, 2, 64) == ["matmul"]
    assert model_decode_modes(m, 2, 64) == []


def test_a_full_width_group_is_cached_raw_and_its_layer_packs_raw_keys(llama64, planned, caplog):
    """A group kept at full width stores the projection's own rows with the identity as its up-projection
    (exact, nothing to rebuild); a layer whose key groups all are packs ``k_raw`` for the decode kernel, with
    each KV head's own key column; a layer with some groups raw rebuilds them all."""
    from gac.nn.latent import _WARNED, latent_attention_paths, raw_key_groups

    dims = {s.name: (s.max_dim if ".0." in s.name and "k_proj" in s.name else 16) for s in planned.sites}
    dims["model.layers.1.self_attn.k_proj:g0"] = 48  # layer 1: one raw key group of two
    m = _applied(llama64, planned, dims, fold=False)
    (_, a0), (_, a1) = latent_modules(m)
    assert raw_key_groups(a0.k_proj) == [True, True] and raw_key_groups(a0.v_proj) == [False, False]
    assert raw_key_groups(a1.k_proj) == [True, False]
    x = torch.randn(3, 5, 120, dtype=torch.float64)
    orig = llama64.model.layers[0].self_attn.k_proj
    assert torch.equal(a0.k_proj.latent(x), orig(x))  # the latents are the keys themselves
    _WARNED.discard("a layer's key groups are only partly at full width")  # warned once per process
    with caplog.at_level(logging.WARNING, logger="gac.nn.latent"):
        p0, p1 = a0.decode_pack(), a1.decode_pack()
    assert p0["k_raw"] and not p1["k_raw"]
    # the partly raw layer rebuilds its raw group: warned once and recorded, not silent
    assert p1["k_raw_rebuilt"] and not p0["k_raw_rebuilt"]
    assert caplog.text.count("only partly at full width") == 1
    # 4 KV heads of 24 in groups of 2: raw, each head's own column; else its group's offset and rank
    assert p0["koff"].tolist() == [0, 24, 48, 72] and p0["kr"].tolist() == [24] * 4
    assert p1["koff"].tolist() == [0, 0, 48, 48] and p1["kr"].tolist() == [48, 48, 16, 16]
    # recorded where a pack was built (the decode path reads it)
    rec = latent_attention_paths(m)
    assert rec["raw_keys"] == 1 and rec["raw_keys_rebuilt"] == 1


@pytest.mark.parametrize("align", ["gac", "knapsack"])
def test_near_full_key_ranks_become_raw_keys(align):
    """The knapsack strategies offer a key group past 7/8 of its width only the ranks no slower to attend than
    its keys cached raw, and the full width (raw keys) in their place: the first layer's key group (native
    rank 253 of 256) is kept whole and cached raw, within the budget; value groups keep their ranks."""
    from gac.allocation.strategies import raw_key_candidates
    from gac.hardware.profile import load_profile
    from gac.nn.latent import raw_key_groups

    prof = load_profile("h100-bfloat16")  # measured latent class: key group 4 breaks even near rank 81
    # without the class's ranks short of the kernel's tile, key ranks keep the projection's modulus (site_modulus)
    fit = prof.latent_attention["fit"]
    fit["calls"] = [c for c in fit["calls"] if c["rank"] % 64 == 0]
    base = tiny_model("llama", hidden=128, layers=2, heads=8, kv_heads=4, head_dim=64).double()
    p = plan(copy.deepcopy(base), CompressConfig(compressor="palu", param_ratio=0.75, align=align),
             calib_batches=_batches(), profile=prof)  # fmt: skip
    k0, v0 = "model.layers.0.self_attn.k_proj:g0", "model.layers.0.self_attn.v_proj:g0"
    assert p.native[k0] == 253 and p.native[v0] == 256
    site = next(s for s in p.sites if s.name == k0)
    assert raw_key_candidates(prof, site, {208, 224, 240, 248}) == {208, 224, 256}
    vsite = next(s for s in p.sites if s.name == v0)
    assert not vsite.meta["rebuild_flops_per_dim_per_cached_token"]  # values are never rebuilt
    rec = p.allocation(align, allow_slower=True)
    assert rec.dims[k0] == 256 and sum(rec.dims.values()) <= p.budget
    assert any(n.startswith(f"1 key group(s) kept at full width and cached raw ({k0})") for n in rec.notes)
    assert not any("cached raw" in n for n in p.allocation("none").notes)
    m = copy.deepcopy(base)
    p.compressor.apply(m, p.sites, rec.dims)
    (_, a0), (_, a1) = latent_modules(m)
    assert raw_key_groups(a0.k_proj) == [True] and a0.decode_pack()["k_raw"]
    assert not a1.decode_pack()["k_raw"]


def test_gac_keeps_rebuilt_key_ranks_on_the_kernels_rank_tile_within_the_budget():
    """On a profile whose latent class timed a key rank short of the decode kernel's 64-wide rank tile slower than
    the tile (the shipped H200's), ``--align gac`` picks key ranks in whole tiles (or the full width, cached raw)
    and value ranks at the projection's modulus, within the none budget; on the built-in default (no class) key
    ranks keep the projection's modulus. The unaligned control keeps the projection's window."""
    from gac.hardware.profile import default_profile, load_profile

    base = tiny_model("llama", hidden=128, layers=3, heads=8, kv_heads=4, head_dim=64).double()
    keys = lambda dims: {n: d for n, d in dims.items() if ".k_proj:" in n}  # noqa: E731
    vals = lambda dims: {n: d for n, d in dims.items() if ".v_proj:" in n}  # noqa: E731
    prof = load_profile("h200-bfloat16")
    p = plan(copy.deepcopy(base), CompressConfig(compressor="palu", param_ratio=0.5, align="gac"),
             calib_batches=_batches(), profile=prof)  # fmt: skip
    rec = p.allocation("gac", allow_slower=True)
    assert rec.cost <= p.budget and rec.pct_aligned == 100.0
    assert all(d % 64 == 0 for d in keys(rec.dims).values()), rec.dims
    assert all(d % prof.modulus("lowrank_r") == 0 for d in vals(rec.dims).values())
    assert any(d % 64 for d in vals(rec.dims).values()), "values are not held to the key tile"
    assert any(d % 64 for d in keys(p.native).values()), (
        "the native ranks must be off the tile for this to test"
    )
    assert any("3 key group(s) ranked in whole 64-rank tiles" in n for n in rec.notes), rec.notes
    # the control keeps the projection's window (one modulus step) for keys too
    ctl = p.allocation("knapsack")
    assert ctl.cost <= p.budget
    assert all(abs(d - p.native[n]) <= 8 or d == 256 for n, d in keys(ctl.dims).items()), ctl.dims
    q = plan(copy.deepcopy(base), CompressConfig(compressor="palu", param_ratio=0.5, align="gac"),
             calib_batches=_batches(), profile=default_profile("bfloat16"))  # fmt: skip
    drec = q.allocation("gac", allow_slower=True)
    assert all(d % 8 == 0 for d in drec.dims.values()) and any(d % 64 for d in keys(drec.dims).values())
    assert not any("tiles" in n for n in drec.notes + ctl.notes)


def test_a_ratio_below_one_key_tile_a_group_is_one_line_before_any_work():
    """Bad input: on a profile whose class puts key ranks on the kernel's 64-rank tile, a KV ratio that leaves a key
    group below one tile is refused before calibration, naming both moduli and the least ratio that fits."""
    from gac.hardware.profile import load_profile

    base = tiny_model("llama", hidden=128, layers=3, heads=8, kv_heads=4, head_dim=64).double()
    cfg = CompressConfig(compressor="palu", param_ratio=0.1, align="gac", allow_slower=True)
    with pytest.raises(GacError, match=r"8 a value group, 64 a key group .*use a ratio >= 0\.141") as e:
        plan(copy.deepcopy(base), cfg, calib_batches=_batches(), profile=load_profile("h200-bfloat16"))
    assert "\n" not in str(e.value)


def test_key_ranks_past_what_the_class_timed_are_offered_raw_instead():
    """A key group of the Llama-3-8B geometry (4 KV heads of 128: 512 wide) whose native rank is 470: on the shipped
    H200 profile its 64-rank candidates would be 448 and 512, but the class timed key ranks up to 256 at key group 4
    (rank 384 ran 0.44-0.48x dense decode attention there): only the raw keys remain. Ranks within it stay."""
    from gac.allocation.strategies import _candidates
    from gac.hardware.profile import default_profile, load_profile
    from gac.sites import Site

    prof = load_profile("h200-bfloat16")
    meta = {"rebuild_flops_per_dim_per_cached_token": 1024, "head_dim": 128, "group_kv": 4, "key_group": 4,
            "query_rows": 16}  # fmt: skip
    s = Site("k:g0", "lowrank_r", max_dim=512, unit_cost=1, dense_cost=512, meta=meta)
    assert prof.timed_key_rank(4, 16) == 256
    assert _candidates(prof, s, 470) == [512]
    assert _candidates(prof, s, 244) == [192, 256, 512]
    assert 448 in _candidates(default_profile("bfloat16"), s, 450)  # no class: nothing to hold it to


def test_rank_caps_hand_what_a_capped_group_gives_up_to_the_others_and_bound_every_allocation():
    """``key_rank_max`` / ``value_rank_max``: the reference's search runs with each group capped, so what a capped
    group gives up goes to the others in its own order and the budget is still spent; every strategy then stays
    within the caps (or a group's full width); recorded in the report's options."""
    from gac.hardware.profile import load_profile

    base = tiny_model("llama", hidden=128, layers=3, heads=8, kv_heads=4, head_dim=64).double()
    prof = load_profile("h200-bfloat16")
    cfg = lambda o: CompressConfig(compressor="palu", param_ratio=0.5, align="gac", options=o)  # noqa: E731
    free = plan(copy.deepcopy(base), cfg({}), calib_batches=_batches(), profile=prof)
    p = plan(copy.deepcopy(base), cfg({"key_rank_max": 64, "value_rank_max": 192}), calib_batches=_batches(),
             profile=prof)  # fmt: skip
    keys = [n for n in p.native if ".k_proj:" in n]
    assert any(free.native[n] > 64 for n in keys), "the uncapped search must pass the cap for this to test"
    assert sum(p.native.values()) == p.budget == free.budget
    assert all(p.native[n] <= (64 if n in keys else 192) for n in p.native), p.native
    assert sum(p.native[n] for n in p.native if n not in keys) > sum(
        free.native[n] for n in free.native if n not in keys
    )
    for align in ("none", "round", "knapsack", "gac"):
        rec = p.allocation(align, allow_slower=True) if align == "gac" else p.allocation(align)
        assert rec.cost <= p.budget or align == "round", align  # the reference's rounding leaves the budget
        assert all(d <= (64 if n in keys else 192) or d == 256 for n, d in rec.dims.items()), (
            align,
            rec.dims,
        )
    m = copy.deepcopy(base)
    rep = apply_(m, p, p.allocation("gac", allow_slower=True))
    assert rep.compressor_options["key_rank_max"] == 64 and rep.compressor_options["value_rank_max"] == 192


def test_a_key_group_the_search_keeps_nearly_whole_stays_whole_under_a_key_rank_cap():
    """A key group the uncapped search keeps past 7/8 of its width (the first layer's, 253 of 256) keeps its full
    width under ``key_rank_max`` (cached raw: nothing rebuilt, as ``--align gac`` offers it), and the other groups
    take the rest of the budget within the cap."""
    from gac.hardware.profile import load_profile

    base = tiny_model("llama", hidden=128, layers=2, heads=8, kv_heads=4, head_dim=64).double()
    cfg = CompressConfig(compressor="palu", param_ratio=0.75, align="none", options={"key_rank_max": 64})
    p = plan(copy.deepcopy(base), cfg, calib_batches=_batches(), profile=load_profile("h100-bfloat16"))
    k0, k1 = "model.layers.0.self_attn.k_proj:g0", "model.layers.1.self_attn.k_proj:g0"
    assert p.native[k0] == 256 and p.native[k1] <= 64
    assert sum(p.native.values()) == p.budget


def test_align_gac_caps_ranks_where_the_profile_timed_the_decode_kernel_change(capsys):
    """Under ``--align gac`` with no cap given, the shipped H200 profile's class (key group 4: key rank 128, values up
    to 384 on the Hopper kernel, key ranks 248-256 on the Triton one) caps every key group at 128 and value group at
    384, as ``-O key_rank_max=128 -O value_rank_max=384`` would, and the report says where the caps came from.
    ``kernel_caps=false``, ``--align none`` and a profile whose calls name no kernel (the H100's) leave the search
    as it is; a cap given by option replaces the profile's."""
    from gac.hardware.profile import load_profile

    base = tiny_model("llama", hidden=256, layers=2, heads=8, kv_heads=4, head_dim=128).double()
    h200 = load_profile("h200-bfloat16")
    lim = h200.kernel_rank_limit(4, 8)
    assert (lim["key"], lim["value"], lim["kernel"], lim["past"]) == (128, 384, "gluon", ["triton"])
    assert h200.kernel_rank_limit(4, 28)["key"] == 128  # the class's wide rows (Qwen2.5-7B's 28 query rows)
    assert h200.kernel_rank_limit(2, 8) is None and h200.kernel_rank_limit(1, 7) is None
    assert load_profile("h100-bfloat16").kernel_rank_limit(4, 16) is None
    assert (
        h200.kernel_rank_limit(4, 16, head_dim=64) is None
    )  # the class timed head_dim 128, the Hopper kernel's

    def run(align, prof, **o):
        cfg = CompressConfig(
            compressor="palu", param_ratio=0.5, align=align, allow_slower=align == "gac", options=o
        )
        return plan(copy.deepcopy(base), cfg, calib_batches=_batches(), profile=prof)

    free = run("gac", h200, kernel_caps=False)
    assert "capped" not in capsys.readouterr().err
    p = run("gac", h200)
    said = " ".join(capsys.readouterr().err.split())
    assert "palu: key ranks capped at 128 and value ranks at 384, where profile h200-bfloat16" in said, said
    assert "(4 of 4 groups are wider; -O kernel_caps=false lifts the caps)" in said, said
    explicit = run("gac", h200, key_rank_max=128, value_rank_max=384)
    keys = [n for n in p.native if ".k_proj:" in n]
    assert any(128 < free.native[n] < 512 for n in keys), (
        "the uncapped search must pass the cap for this to test"
    )
    assert p.native == explicit.native and sum(p.native.values()) == p.budget == free.budget
    assert all(p.native[n] <= (128 if n in keys else 384) or p.native[n] == 512 for n in p.native), p.native
    rec = p.allocation("gac", allow_slower=True)
    assert rec.cost <= p.budget
    assert all(d <= (128 if n in keys else 384) or d == 512 for n, d in rec.dims.items()), rec.dims
    opts = p.compressor.options()
    assert (opts["key_rank_max"], opts["value_rank_max"]) == (128, 384)
    assert (
        opts["rank_max_from"].startswith("profile h200-bfloat16")
        and "timed key rank 128" in opts["rank_max_from"]
    )
    assert explicit.compressor.options()["rank_max_from"] == "option"
    # the guard's refusal says first what the default's caps were measured at (and only where the profile set them)
    assert p.compressor.refusal().startswith(PaluCompressor.CAPPED_RECORD + "; ")
    assert "kernel rank caps" not in explicit.compressor.refusal() + free.compressor.refusal()
    guarded = CompressConfig(compressor="palu", param_ratio=0.5, align="gac", serve="decode:16x64")
    g = plan(copy.deepcopy(base), guarded, calib_batches=_batches(), profile=h200)
    with pytest.raises(GacError, match="cannot be met without a slowdown") as e:
        g.allocation()
    assert "\n" not in str(e.value) and PaluCompressor.CAPPED_RECORD in str(e.value)
    capsys.readouterr()
    assert (
        free.compressor.options()["rank_max_from"] is None
        and free.compressor.options()["key_rank_max"] is None
    )
    for q in (run("none", h200), run("gac", load_profile("h100-bfloat16"))):
        assert q.compressor.options()["key_rank_max"] is None
        assert q.native == free.native
    # head_dim 64 (key groups 256 wide): the Hopper kernel does not serve it, so nothing is capped
    narrow = tiny_model("llama", hidden=256, layers=2, heads=8, kv_heads=4, head_dim=64).double()
    cfg = CompressConfig(compressor="palu", param_ratio=0.5, align="gac", allow_slower=True)
    q = plan(narrow, cfg, calib_batches=_batches(), profile=h200)
    assert q.compressor.options()["key_rank_max"] is None and "capped" not in capsys.readouterr().err


@pytest.mark.parametrize(
    ("opts", "match"),
    [
        ({"key_rank_max": 0}, "key_rank_max must be a positive whole rank, got 0"),
        ({"value_rank_max": -3}, "value_rank_max must be a positive whole rank"),
        ({"kernel_caps": 3}, "option kernel_caps must be true or false, got 3"),
        ({"key_rank_max": 32}, r"key_rank_max=32 is below one rank modulus of the profile \(64\)"),
        ({"value_rank_max": 4}, r"value_rank_max=4 is below one rank modulus of the profile \(8\)"),
    ],
)
def test_a_rank_cap_that_cannot_be_met_is_one_line_before_any_work(opts, match):
    """Bad input: a cap that is not a positive rank, a ``kernel_caps`` that is not true or false, or (``--align gac``)
    a cap below one rank modulus of the profile for a group (the key tile of 64 on the shipped H200 profile, 8 for
    values), is refused before calibration."""
    from gac.hardware.profile import load_profile

    base = tiny_model("llama", hidden=128, layers=2, heads=8, kv_heads=4, head_dim=64).double()
    cfg = CompressConfig(compressor="palu", param_ratio=0.5, align="gac", allow_slower=True, options=opts)

    def never():  # the calibration windows: reading one means the refusal came after work began
        raise AssertionError("calibration ran")
        yield

    with pytest.raises(GacError, match=match) as e:
        plan(copy.deepcopy(base), cfg, calib_batches=never(), profile=load_profile("h200-bfloat16"))
    assert "\n" not in str(e.value)


def test_a_group_wider_than_the_hidden_size_takes_any_rank_exactly():
    """A group of 4 KV heads of 64 has rows W_g [256, 128] on a 128-wide model: at most 128 singular values.
    The rank search may still give it more (it caps ranks at G·hd); the extra latents are zeros, exact."""
    base = tiny_model("llama", hidden=128, layers=2, heads=8, kv_heads=4, head_dim=64).double()
    p = plan(copy.deepcopy(base), CompressConfig(compressor="palu", param_ratio=0.5, align="none"),
             calib_batches=_batches())  # fmt: skip
    assert {s.max_dim for s in p.sites} == {256}  # one key and one value group of 4 heads per layer
    dims = {s.name: 160 for s in p.sites}  # past the 128 singular values, below full rank
    m = _applied(base, p, dims)
    ids = _ids()
    with torch.no_grad():
        assert torch.allclose(m(ids).logits, base(ids).logits, atol=1e-9, rtol=0)
    assert [lp.ranks for _, a in latent_modules(m) for lp in (a.k_proj, a.v_proj)] == [[160]] * 4


def test_attention_takes_the_cache_under_either_name(llama64, planned):
    """transformers >= 5.24 passes the cache to attention as ``cache``, older 5.x as ``past_key_values``:
    both must fill the latent cache (under the new name it was once ignored, and decode attended only
    the new token)."""
    full = {s.name: s.max_dim for s in planned.sites}
    m = _applied(llama64, planned, full)
    attn = latent_modules(m)[0][1]
    h = torch.randn(
        2, 5, m.config.hidden_size, dtype=torch.float64, generator=torch.Generator().manual_seed(3)
    )
    pos = torch.arange(5)[None]
    pe = m.model.rotary_emb(h, pos)
    caches = {}
    with torch.no_grad():
        for name in ("cache", "past_key_values"):
            caches[name] = LatentCache()
            attn(h, pe, None, position_ids=pos, **{name: caches[name]})
    assert caches["cache"].get_seq_length(attn.layer_idx) == 5
    assert caches["cache"].nbytes() == caches["past_key_values"].nbytes() > 0


def test_full_rank_left_padded_generate_matches_dense(llama64, planned):
    full = {s.name: s.max_dim for s in planned.sites}
    m = _applied(llama64, planned, full)
    ids = _ids(2, 12)
    mask = torch.ones_like(ids)
    mask[0, :4] = 0  # row 0 is left-padded: its RoPE positions start later
    kw = dict(attention_mask=mask, max_new_tokens=8, do_sample=False, pad_token_id=0)
    assert torch.equal(m.generate(ids, **kw), llama64.generate(ids, **kw))


def test_static_cache_full_rank_matches_dense(llama64, planned):
    from transformers import StaticCache

    full = {s.name: s.max_dim for s in planned.sites}
    m = _applied(llama64, planned, full)
    ids = _ids(1, 10)
    kw = dict(max_new_tokens=6, do_sample=False)
    a = m.generate(ids, **cache_arg(m, StaticCache(config=m.config, max_cache_len=32)), **kw)
    b = llama64.generate(ids, **kw)
    assert torch.equal(a, b)


def test_folded_values_equal_reference_path(llama64, planned):
    folded = _applied(llama64, planned, planned.native, fold=True)
    ref = _applied(llama64, planned, planned.native, fold=False)
    att = folded.model.layers[0].self_attn
    assert att.folded and att.o_proj.in_features == sum(
        att.v_proj.ranks[(h // 2) // 2] for h in range(8)
    )  # values never widen back to head_dim: o_proj reads the per-head latent outputs
    ids = _ids()
    with torch.no_grad():
        assert torch.allclose(folded(ids).logits, ref(ids).logits, atol=1e-9, rtol=0)
        assert (folded(ids).logits - llama64(ids).logits).abs().max() > 1e-3  # it is compressed
    kw = dict(max_new_tokens=12, do_sample=False)
    g1 = folded.generate(ids[:1], **cache_arg(folded, LatentCache()), **kw)
    g2 = ref.generate(ids[:1], **kw)
    g3 = folded.generate(ids[:1], use_cache=False, **kw)
    assert torch.equal(g1, g2) and torch.equal(g1, g3)


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
def test_a_short_prompt_rebuilds_in_one_gemm_and_attends_unmasked_as_the_per_group_path(family, monkeypatch):
    """A prompt's keys and values rebuilt in one block-diagonal GEMM (few rows), the queries' cos/sin reused for
    the keys, and a whole unmasked prompt attended causally on the grouped heads: the per-group, masked path's
    logits (float64), biases (Qwen2) and per-head key norms (Qwen3) included; and a cache passed in (whose keys
    take the rotary) agrees."""
    import gac.nn.latent as nl

    base = tiny_model(family, hidden=120, layers=2, heads=8, kv_heads=4, head_dim=24).double()
    p = plan(copy.deepcopy(base), CompressConfig(compressor="palu", param_ratio=0.5, align="none",
                                                  options={"group_size": 2}), calib_batches=_batches())  # fmt: skip
    m = _applied(base, p, p.native, fold=False)
    att = m.model.layers[0].self_attn
    assert att.n_groups == (2, 2) and att.k_proj.one_gemm(2 * 24) and not att.k_proj.one_gemm(1 << 24)
    assert (att.k_norm is not None) == (family == "qwen3")
    ids = _ids()
    calls = {"block_diag": 0, "causal": 0}
    block_diag, sdpa = torch.block_diag, torch.nn.functional.scaled_dot_product_attention

    def count_block(*a):
        calls["block_diag"] += 1
        return block_diag(*a)

    def count_causal(*a, **kw):
        calls["causal"] += bool(kw.get("is_causal"))
        return sdpa(*a, **kw)

    with torch.no_grad():
        with monkeypatch.context() as mp:
            mp.setattr(torch, "block_diag", count_block)
            mp.setattr(torch.nn.functional, "scaled_dot_product_attention", count_causal)
            fast = m(ids, use_cache=False).logits
        assert calls == {"block_diag": 2 * 2, "causal": 2}  # keys and values of both layers; both layers
        # one GEMM a group, the causal mask built and repeated over the heads
        with monkeypatch.context() as mp:
            mp.setattr(nl, "ONE_GEMM_MAX_MACS", 0)
            mp.setattr(nl, "SDPA_GQA", False)
            assert not att.k_proj.one_gemm(2 * 24)
            slow = m(ids, use_cache=False).logits
        cached = m(ids, **cache_arg(m, __import__("transformers").DynamicCache())).logits
    assert (fast - slow).abs().max() < 1e-10 and (fast - cached).abs().max() < 1e-10
    assert (fast - base(ids).logits).abs().max() > 1e-3  # it is compressed
    # an up-projection that is not a plain linear layer (a LoRA wrapper, say, whose weight is not all it
    # computes) keeps one GEMM a group
    att.k_proj.ups[0] = _Wrapped(att.k_proj.ups[0])
    assert not att.k_proj.one_gemm(2 * 24)
    with torch.no_grad():
        assert (m(ids, use_cache=False).logits - fast).abs().max() < 1e-10


class _Wrapped(torch.nn.Module):
    """A linear layer behind a wrapper with its weight, bias and widths (as peft's LoRA layers show them)."""

    def __init__(self, lin: torch.nn.Linear) -> None:
        super().__init__()
        self.base, self.in_features, self.out_features = lin, lin.in_features, lin.out_features
        self.weight, self.bias = lin.weight, lin.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x)


def test_latent_cache_bytes(llama64, planned):
    m = _applied(llama64, planned, planned.native).float()
    cache = LatentCache()
    ids = _ids(1, 9)
    with torch.no_grad():
        m(ids, **cache_arg(m, cache), use_cache=True)
    per_token = sum(sum(a.latent_dims()) for _, a in latent_modules(m)) * 4
    assert cache.nbytes() == 9 * per_token
    kv = kv_bytes_per_token(m)
    assert kv["cache"] == per_token
    assert kv["dense"] == 2 * 2 * 4 * 24 * 4  # layers x (K, V) x kv heads x head_dim x fp32
    assert kv["cache"] <= 0.5 * kv["dense"]


@pytest.mark.parametrize("align", ["none", "round", "knapsack", "gac"])
def test_budget_and_alignment(planned, align):
    a = planned.allocation(align)
    dims = a.dims
    if align == "round":
        assert all(d % 32 == 0 for d in dims.values())  # the reference's rounding
        return
    assert a.cost <= planned.budget
    if align == "gac":
        m = planned.profile.modulus("lowrank_r")
        assert all(d % m == 0 for d in dims.values())
        assert a.pct_aligned == 100.0


def test_save_load_round_trip(tmp_path, llama64):
    import gac
    from gac import io

    m = copy.deepcopy(llama64).float()
    rep = compress_(
        m,
        CompressConfig(compressor="palu", param_ratio=0.5, align="gac", options={"group_size": 2}),
        calib_batches=_batches(),
    )
    io.save(m, tmp_path / "out", gac_config_for_save(rep))
    back = gac.load(tmp_path / "out")
    assert isinstance(back.model.layers[1].self_attn, LatentAttention)
    ids = _ids()
    with torch.no_grad():
        assert torch.equal(m(ids).logits, back(ids).logits)
    kw = dict(max_new_tokens=10, do_sample=False)
    assert torch.equal(
        m.generate(ids[:1], **kw), back.generate(ids[:1], **cache_arg(back, LatentCache()), **kw)
    )


def test_bad_group_size_and_ratio(llama64):
    with pytest.raises(GacError, match="key group size 3 does not divide the model's 4 KV heads"):
        plan(
            copy.deepcopy(llama64),
            CompressConfig(compressor="palu", param_ratio=0.5, options={"group_size": 3}),
            calib_batches=_batches(1),
        )
    with pytest.raises(GacError, match="param ratio 0.01 cannot be met"):
        plan(
            copy.deepcopy(llama64),
            CompressConfig(compressor="palu", param_ratio=0.01, options={"group_size": 1}),
            calib_batches=_batches(1),
        )


@pytest.mark.parametrize(
    ("family", "kw", "match"),
    [
        ("phi3", {}, "separate q/k/v/o"),
        ("olmo2", {}, "normalizes q over all heads jointly"),
        ("mistral", {}, "sliding-window"),
    ],
)
def test_unsupported_attention(family, kw, match):
    m = tiny_model(family, hidden=120, layers=1, heads=4, kv_heads=2, head_dim=24, **kw)
    if family == "mistral":
        m.config.sliding_window = 16
    with pytest.raises(GacError, match=match):
        plan(m, CompressConfig(compressor="palu", param_ratio=0.5), calib_batches=_batches(1))


def test_qwen2_biases_fold_exactly():
    base = tiny_model("qwen2", hidden=120, layers=2, heads=6, kv_heads=2, head_dim=20).double()
    p = plan(
        copy.deepcopy(base),
        CompressConfig(compressor="palu", param_ratio=0.6, align="none", options={"group_size": 1}),
        calib_batches=_batches(),
    )
    folded = _applied(base, p, p.native, fold=True)
    ref = _applied(base, p, p.native, fold=False)
    ids = _ids()
    with torch.no_grad():
        assert torch.allclose(folded(ids).logits, ref(ids).logits, atol=1e-9, rtol=0)
    rep = apply_(copy.deepcopy(base), p, p.allocation("knapsack"))
    assert rep.targeted_after <= p.budget


def test_repair_pads_latent_ranks_exactly(tmp_path, llama64):
    import gac
    from gac.surgery.repair import repair_, save_repaired

    m = copy.deepcopy(llama64).float()
    compress_(
        m,
        CompressConfig(compressor="palu", param_ratio=0.45, align="none", options={"group_size": 2}),
        calib_batches=_batches(),
    )
    m2 = copy.deepcopy(m)
    # a folded copy too: padded value ranks must widen o_proj per head
    p = plan(
        copy.deepcopy(llama64).float(),
        CompressConfig(compressor="palu", param_ratio=0.45, align="none", options={"group_size": 2}),
        calib_batches=_batches(),
    )
    folded = copy.deepcopy(llama64).float()
    p.compressor.fold_values = True
    p.compressor.apply(folded, p.sites, p.native)
    ranks = [r for _, a in latent_modules(m) for r in a.k_proj.ranks + a.v_proj.ranks]
    assert any(r % 8 for r in ranks)  # something to repair
    ids = _ids()
    with torch.no_grad():
        before, before_f = m(ids).logits, folded(ids).logits
        rep = repair_(m2, "minimal")
        repair_(folded, "minimal")
        after, after_f = m2(ids).logits, folded(ids).logits
    assert rep.changes and all(c.kind == "latent_rank" for c in rep.changes)
    assert all(r % 8 == 0 for _, a in latent_modules(m2) for r in a.k_proj.ranks + a.v_proj.ranks)
    assert torch.allclose(after, before, atol=1e-5, rtol=0)
    assert torch.allclose(after_f, before_f, atol=1e-5, rtol=0)
    save_repaired(m2, tmp_path / "rep", rep)
    back = gac.load(tmp_path / "rep")
    with torch.no_grad():
        assert torch.equal(back(ids).logits, after)


def test_analyze_sees_latent_ranks(llama64, planned):
    from gac.hardware.profile import default_profile
    from gac.models.inventory import analyze

    m = _applied(llama64, planned, planned.native)
    an = analyze(m, default_profile())
    ranks = {d.where: d.value for d in an.dims if d.kind.endswith(".rank")}
    assert ranks == {s.name: planned.native[s.name] for s in planned.sites}


def test_analyze_and_repair_hold_latent_key_ranks_to_the_kernels_tile():
    """Under a profile whose class puts rebuilt keys on the decode kernel's 64-rank tile (the shipped H200's),
    ``gac analyze`` judges a PaLU model's key ranks against the tile (penalty: the class's measured short-rank
    ratio; value ranks against the projection's 8), and ``gac repair --strategy profile`` zero-pads them onto it,
    exactly; under the built-in default both keep the projection's modulus."""
    from gac.hardware.profile import default_profile, load_profile
    from gac.models.inventory import analyze
    from gac.surgery.repair import repair_

    prof = load_profile("h200-bfloat16")
    base = tiny_model("llama", hidden=128, layers=2, heads=8, kv_heads=4, head_dim=64).float()
    m = copy.deepcopy(base)
    compress_(m, CompressConfig(compressor="palu", param_ratio=0.45, align="none"), calib_batches=_batches())
    an = analyze(m, prof)
    keys = [d for d in an.dims if d.kind == "k.rank"]
    vals = [d for d in an.dims if d.kind == "v.rank"]
    assert keys and all(d.key_group == {"key_group": 4, "query_rows": 8, "width": 256} for d in keys)
    assert any(d.value % 64 for d in keys), "the native key ranks must be off the tile for this to test"
    for d in keys:
        assert d.aligned == (d.value % 64 == 0) and d.target == -(-d.value // 64) * 64
        if d.value % 8 == 0 and d.value % 64:
            assert d.penalty == pytest.approx(prof.key_rank_penalty(4, 8))
    assert all(d.key_group is None and d.target == -(-d.value // 8) * 8 for d in vals)
    assert all(
        d.aligned == (d.value % 8 == 0)
        for d in analyze(m, default_profile("float32")).dims
        if d.kind == "k.rank"
    )
    ids = _ids()
    with torch.no_grad():
        before = m(ids).logits
        rep = repair_(m, "profile", prof)
        after = m(ids).logits
    assert torch.allclose(after, before, atol=1e-4, rtol=0)
    (_, a0), (_, a1) = latent_modules(m)
    assert all(r % 64 == 0 for a in (a0, a1) for r in a.k_proj.ranks), rep.changes
    assert all(r % 8 == 0 for a in (a0, a1) for r in a.v_proj.ranks)


def test_load_refuses_a_module_class_outside_gac(tmp_path, llama64):
    import json

    from gac import io

    m = copy.deepcopy(llama64).float()
    compress_(
        m,
        CompressConfig(compressor="palu", param_ratio=0.5, align="none", options={"group_size": 2}),
        calib_batches=_batches(),
    )
    out = io.save(m, tmp_path / "p")
    cfg = json.loads((out / "gac_config.json").read_text())
    cfg["modules"][0]["class"] = "os:system"
    (out / "gac_config.json").write_text(json.dumps(cfg))
    with pytest.raises(GacError, match="not a gac class"):
        io.load(out)


def test_a_model_saved_under_the_old_class_path_loads(tmp_path, llama64):
    """PaLU models saved before the module types moved to gac.nn name
    ``gac.surgery.latent_attention:LatentAttention``; they load to the same logits."""
    import json

    from gac import io

    m = copy.deepcopy(llama64).float()
    compress_(
        m,
        CompressConfig(compressor="palu", param_ratio=0.5, align="gac", options={"group_size": 2}),
        calib_batches=_batches(),
    )
    out = io.save(m, tmp_path / "p")
    cfg = json.loads((out / "gac_config.json").read_text())
    assert {e["class"] for e in cfg["modules"]} == {"gac.nn.latent:LatentAttention"}
    for e in cfg["modules"]:
        e["class"] = "gac.surgery.latent_attention:LatentAttention"
    (out / "gac_config.json").write_text(json.dumps(cfg))
    back = io.load(out)
    assert [n for n, _ in latent_modules(back)] == [n for n, _ in latent_modules(m)]
    ids = _ids()
    with torch.no_grad():
        assert torch.equal(m(ids).logits, back(ids).logits)


def test_the_guards_refusal_says_how_to_measure_palus_capacity(llama64):
    """Refused for speed, a PaLU budget's one line also says how to measure what the smaller cache buys: the
    sequences that fit and their tokens/s (``gac eval infer --capacity-context``)."""
    import dataclasses

    from gac.hardware.profile import default_profile

    # launches cost more than the bytes the latent cache saves at one sequence: the guard refuses
    prof = dataclasses.replace(
        default_profile("bfloat16"), id="synthetic", measured=True, launch_us=20.0, copy_gbps=1.0, aux_us=0.5
    )
    cfg = CompressConfig(
        compressor="palu", param_ratio=0.5, align="gac", serve="decode:1x64", options={"group_size": 2}
    )
    p = plan(copy.deepcopy(llama64), cfg, calib_batches=_batches(), profile=prof)
    with pytest.raises(GacError, match="cannot be met without a slowdown") as e:
        p.allocation()
    msg = str(e.value)
    # already in key and value groups of 2: told what such groups were measured at, and that they need the flag
    assert "\n" not in msg and msg.endswith("; " + p.compressor.refusal())
    assert msg.endswith("key and value groups of 2 KV heads, as here, " + PaluCompressor.GROUPS2_RECORD + " on a "
                        "Hopper GPU, where the latency model prices their decode at short contexts below dense (up to "
                        "17% pessimistic at long context): they need --allow-slower")  # fmt: skip
    assert "--capacity-context" in msg and "-O k_group_size=2" not in msg
    # the default groups (4 KV heads: one group): groups of 2 named, with the flag they need
    cfg = dataclasses.replace(cfg, options={})
    p = plan(copy.deepcopy(llama64), cfg, calib_batches=_batches(), profile=prof)
    with pytest.raises(GacError, match="cannot be met without a slowdown") as e:
        p.allocation()
    assert str(e.value).endswith("; " + PaluCompressor.refusal_hint)
    assert "-O k_group_size=2 -O v_group_size=2 --allow-slower" in PaluCompressor.refusal_hint
    # 3 KV heads take no group of 2: not suggested
    odd = PaluCompressor()
    odd.sites(tiny_model("llama", **{**GEOM, "heads": 6, "kv_heads": 3}))
    assert odd.refusal() == PaluCompressor.CAPACITY_HINT
    assert PaluCompressor().refusal() == PaluCompressor.refusal_hint  # before it has read a model


def test_the_guard_prices_a_short_prompts_groups_in_one_gemm_as_the_module_runs_them(llama64):
    """A PaLU site at a prompt of few rows shares one block-diagonal GEMM with its projection's other groups
    (its up-projection's work done ``groups`` times), as LatentProjection.one_gemm runs it; a long prompt pays a
    launch a group."""
    import dataclasses

    from gac.allocation import site_ms
    from gac.compressors.palu import PaluCompressor
    from gac.hardware.profile import default_profile

    prof = default_profile("bfloat16")
    site = next(
        s for s in PaluCompressor(group_size=2).sites(copy.deepcopy(llama64)) if s.meta["kind"] == "k"
    )
    og = site.meta["one_gemm"]
    assert og["groups"] == 2 and og["width"] == 2 * 24
    plain = dataclasses.replace(site, meta={k: v for k, v in site.meta.items() if k != "one_gemm"})
    d, launch = 24, prof.launch_us_or_default * 1e-3
    few = 128
    assert few * og["groups"] * d * og["width"] <= og["max_macs"]
    saved = site_ms(prof, plain, d, few) - site_ms(prof, site, d, few)
    zeros = 2.0 * few * d * og["width"] / (prof.peak_tflops() * 1e12 * prof.efficiency(site.op, d)) * 1e3
    # half a GEMM launch saved (two groups, one GEMM), less half the kernel building the block-diagonal weight and
    # the zeros' work where it shows over the bytes
    aux = prof.aux_us_or_default * 1e-3
    assert 0 < 0.5 * launch - 0.5 * aux - zeros <= saved <= 0.5 * launch - 0.5 * aux + 1e-15
    many = og["max_macs"] // (og["groups"] * d * og["width"]) + 1
    assert site_ms(prof, plain, d, many) == site_ms(prof, site, d, many)
    assert site_ms(prof, plain, site.max_dim, few) == site_ms(prof, site, site.max_dim, few)  # kept dense
