"""PaLU across families and group layouts: Llama, Qwen2 (biased k/v), Qwen3 (per-head k_norm) and
Granite (found by structural discovery, attention multiplier), with key and value groups of
different sizes; the grouped reference path; the recorded, warned-once decode path; save/load of
the spec (old and new) and repair."""

from __future__ import annotations

import copy
import json
import logging

import pytest
import torch

import gac.nn.latent as la
from gac.api import CompressConfig, compress_, gac_config_for_save, plan
from gac.compat import cache_arg
from gac.errors import GacError
from gac.models.adapters import model_rotary
from gac.nn.latent import LatentCache, latent_attention_paths, latent_modules
from gac.testing import tiny_model

from .test_palu import _applied

GEOM = dict(hidden=120, layers=2, heads=4, kv_heads=2, head_dim=24)  # misaligned head_dim
FAMILIES = ("llama", "qwen2", "qwen3", "granite")
#: (key group size, value group size) per family: keys and values grouped apart
GROUPS = {"llama": (1, 2), "qwen2": (2, 1), "qwen3": (1, 2), "granite": (1, 1)}


def _batches(n: int = 3) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return [torch.randint(3, 240, (2, 32), generator=g) for _ in range(n)]


def _ids(b: int = 2, s: int = 14) -> torch.Tensor:
    return torch.randint(3, 240, (b, s), generator=torch.Generator().manual_seed(2))


def _plan(base, family: str, ratio: float = 0.5):
    kg, vg = GROUPS[family]
    cfg = CompressConfig(
        compressor="palu",
        param_ratio=ratio,
        align="none",
        options={"k_group_size": kg, "v_group_size": vg},
    )
    return plan(copy.deepcopy(base), cfg, calib_batches=_batches())


@pytest.fixture(scope="module", params=FAMILIES)
def family_plan(request):
    base = tiny_model(request.param, **GEOM).double()
    return request.param, base, _plan(base, request.param)


def _decode(model, ids, t0: int, steps: int, cache=None) -> torch.Tensor:
    """Logits of ``steps`` single-token steps after a ``t0``-token prefill into ``cache`` (default:
    a 40-slot static cache)."""
    from transformers import StaticCache

    cache = cache if cache is not None else StaticCache(config=model.config, max_cache_len=40)
    outs = []
    with torch.no_grad():
        model(ids[:, :t0], **cache_arg(model, cache), use_cache=True)
        for i in range(steps):
            outs.append(model(ids[:, t0 + i : t0 + i + 1], **cache_arg(model, cache), use_cache=True).logits)
    return torch.cat(outs, dim=1)


@pytest.mark.parametrize("fold", [False, True])
def test_full_rank_equals_the_dense_model_on_every_cache(family_plan, fold):
    family, base, p = family_plan
    kg, vg = GROUPS[family]
    m = _applied(base, p, {s.name: s.max_dim for s in p.sites}, fold)
    attn = latent_modules(m)[0][1]
    assert attn.n_groups == (2 // kg, 2 // vg)
    assert (attn.k_norm is not None) == (family == "qwen3")
    assert (attn.k_proj.ups[0].bias is not None) == (family == "qwen2")
    ids = _ids()
    from transformers import DynamicCache

    with torch.no_grad():
        assert torch.allclose(m(ids).logits, base(ids).logits, atol=1e-9, rtol=0)
    # the latent (dynamic) cache against the dense model's own; then static-cache decode steps
    got, want = _decode(m, ids, 10, 2, LatentCache()), _decode(base, ids, 10, 2, DynamicCache())
    assert torch.allclose(got, want, atol=1e-9, rtol=0)
    assert torch.allclose(_decode(m, ids, 9, 3), _decode(base, ids, 9, 3), atol=1e-9, rtol=0)
    kw = dict(max_new_tokens=6, do_sample=False)
    assert torch.equal(m.generate(ids[:1, :8], **kw), base.generate(ids[:1, :8], **kw))


def test_compressed_paths_agree(family_plan):
    """At the searched (compressed) ranks: folded == unfolded, and cached decode == full forward."""
    family, base, p = family_plan
    ref = _applied(base, p, p.native, fold=False)
    folded = _applied(base, p, p.native, fold=True)
    ids = _ids()
    with torch.no_grad():
        full = ref(ids).logits
        assert (full - base(ids).logits).abs().max() > 1e-3  # it is compressed
        assert torch.allclose(folded(ids).logits, full, atol=1e-9, rtol=0)
        for m in (ref, folded):
            assert torch.allclose(_decode(m, ids, 9, 3), full[:, 9:12], atol=1e-9, rtol=0)


def test_reference_path_is_grouped_cut_to_the_filled_length_with_one_rope_table(monkeypatch):
    base = tiny_model("llama", **GEOM).double()
    p = _plan(base, "llama")
    m = _applied(base, p, p.native, fold=False)
    seen, rope = [], []
    real_sdpa = torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(
        torch.nn.functional,
        "scaled_dot_product_attention",
        lambda q, k, v, **kw: seen.append((q.shape, k.shape)) or real_sdpa(q, k, v, **kw),
    )
    rot = model_rotary(m)
    real_rot = rot.forward
    monkeypatch.setattr(
        rot,
        "forward",
        lambda x, position_ids: rope.append(tuple(position_ids.shape)) or real_rot(x, position_ids),
    )
    ids = _ids(2, 12)
    with torch.no_grad():
        _decode(m, ids, 10, 1)  # a 40-slot static cache, 11 filled after the step
    q, k = seen[-1]
    assert k[1] == q[1] == GEOM["kv_heads"]  # attended on the KV heads: no repeat_kv copy
    assert q[2] == 2  # each KV head's 2 query heads become its query rows
    assert k[2] == 11  # only the filled slots, not the 40 of the cache
    assert rope[-1] == (1, 11)  # cos/sin once per cached position, shared by the batch of 2


def test_decode_path_is_recorded_and_each_reason_warned_once(monkeypatch, caplog):
    base = tiny_model("qwen2", **GEOM).double()
    p = _plan(base, "qwen2")
    m = _applied(base, p, p.native, fold=False)
    monkeypatch.setattr(la, "_WARNED", set())
    assert latent_attention_paths(m)["unrecorded"] == 2
    assert latent_attention_paths(base) is None
    ids = _ids(1, 8)
    with caplog.at_level(logging.WARNING, logger="gac.nn.latent"):
        for _ in range(2):
            m.generate(ids, **cache_arg(m, LatentCache()), max_new_tokens=3, do_sample=False)
    msgs = [r.getMessage() for r in caplog.records]
    for reason in ("not on CUDA", "dynamic cache (LatentCache)", "head_dim 24 not a power of two"):
        assert sum(reason in x for x in msgs) == 1, msgs  # once per reason, not per layer or step
    paths = latent_attention_paths(m)
    assert paths["kernel"] == 0 and paths["reference"] == 2 and paths["unrecorded"] == 0
    assert "dynamic cache (LatentCache)" in paths["reasons"]
    # switched off on purpose: recorded, not warned
    caplog.clear()
    for _, a in latent_modules(m):
        a.use_kernel = False
    with caplog.at_level(logging.WARNING, logger="gac.nn.latent"):
        m.generate(ids, **cache_arg(m, LatentCache()), max_new_tokens=2, do_sample=False)
    assert la.SWITCHED_OFF in latent_attention_paths(m)["reasons"] and not caplog.records


def test_decode_pack_carries_key_bias_and_key_norm():
    for family in ("qwen2", "qwen3"):
        base = tiny_model(family, **GEOM).double()
        p = _plan(base, family)
        m = _applied(base, p, p.native, fold=False)
        attn = latent_modules(m)[0][1]
        orig = base.model.layers[0].self_attn
        pack = attn.decode_pack()
        assert pack["k_group_kv"] == GROUPS[family][0] and pack["v_group_kv"] == GROUPS[family][1]
        assert (
            len(pack["uv"]) == 2 // GROUPS[family][1]
            and len(set(pack["koff"].tolist())) == 2 // GROUPS[family][0]
        )
        if family == "qwen2":
            assert torch.equal(pack["k_bias"], orig.k_proj.bias.view(2, 24))
            assert pack["k_norm"] is None
        else:
            assert pack["k_bias"] is None
            assert torch.allclose(pack["k_norm"], orig.k_norm.weight.float(), atol=1e-6)
            assert pack["k_norm_eps"] == orig.k_norm.variance_epsilon


def test_decode_pack_carries_the_rotary_table_unless_the_rope_rescales(caplog):
    from gac.nn.latent import ROPE_ROWS

    base = tiny_model("qwen2", **GEOM).double()
    p = _plan(base, "qwen2")
    m = _applied(base, p, p.native, fold=False)
    attn = latent_modules(m)[0][1]
    rot = attn._rotary
    tab = attn.decode_pack()["rope"]
    assert tab.shape == (2, ROPE_ROWS, rot.inv_freq.numel()) and tab.dtype == torch.float32
    ang = 5.0 * rot.inv_freq.double()  # row 5: offset 5
    assert torch.allclose(tab[0, 5].double(), ang.cos(), atol=1e-7)
    assert torch.allclose(tab[1, 5].double(), ang.sin(), atol=1e-7)
    # frequencies changed in place: the pack is rebuilt with them
    with torch.no_grad():
        rot.inv_freq.mul_(0.5)
    assert torch.allclose(
        attn.decode_pack()["rope"][1, 5].double(), (5.0 * rot.inv_freq.double()).sin(), atol=1e-7
    )
    assert "rope_in_loop" not in latent_attention_paths(m)
    # a model built under torch.inference_mode: its frequencies are inference tensors, with no version counter
    normal = rot.inv_freq
    with torch.inference_mode():
        rot.inv_freq = normal * 0.5
    assert torch.allclose(attn.decode_pack()["rope"][1, 5].double(), (2.5 * normal.double()).sin(), atol=1e-7)
    rot.inv_freq = normal
    # a RoPE that rescales its frequencies with the length gets no table (the kernel evaluates cos/sin),
    # warned once and recorded
    rot.rope_type = "dynamic"
    with torch.no_grad():
        rot.inv_freq.mul_(2.0)
    with caplog.at_level(logging.WARNING, logger="gac.nn.latent"):
        assert attn.decode_pack()["rope"] is None
    assert sum("rescales its frequencies" in r.getMessage() for r in caplog.records) == 1
    assert latent_attention_paths(m)["rope_in_loop"] == 1


def test_infer_sweep_records_the_latent_path():
    from gac.eval.infer import SweepConfig, Variant, run_sweep

    def palu():
        base = tiny_model("llama", **GEOM)
        compress_(
            base,
            CompressConfig(compressor="palu", param_ratio=0.5, align="none", options={"group_size": 1}),
            calib_batches=_batches(2),
        )
        return base

    cfg = SweepConfig(
        prefill_batches=(1,),
        prefill_seqs=(8,),
        decode_batches=(1,),
        decode_kv=(16,),
        prefill_warmup=0,
        prefill_reps=1,
        decode_warmup=0,
        decode_reps=1,
        profile_kernels=False,
    )
    res = run_sweep([Variant("palu", palu)], cfg, "cpu")
    path = res["variants"]["palu"]["latent_attention_path"]
    assert path["reference"] == 2 and path["kernel"] == 0 and "not on CUDA" in path["reasons"]


def test_save_load_repair_with_split_groups_and_key_norm(tmp_path):
    import gac
    from gac import io
    from gac.surgery.repair import repair_

    base = tiny_model("qwen3", **GEOM).float()
    m = copy.deepcopy(base)
    rep = compress_(
        m,
        CompressConfig(
            compressor="palu", param_ratio=0.45, align="none", options={"k_group_size": 1, "v_group_size": 2}
        ),
        calib_batches=_batches(),
    )
    attn = latent_modules(m)[0][1]
    assert len(attn.k_proj.ranks) == 2 and len(attn.v_proj.ranks) == 1
    assert rep.compressor_options["k_group_size"] == 1 and rep.compressor_options["group_size"] is None
    out = io.save(m, tmp_path / "p", gac_config_for_save(rep))
    back = gac.load(out)
    ids = _ids()
    with torch.no_grad():
        before = m(ids).logits
        assert torch.equal(back(ids).logits, before)
        rr = repair_(back, "minimal")  # zero-pads key and value group ranks apart, exactly
        assert rr.changes and all(r % 8 == 0 for _, a in latent_modules(back) for r in a.k_proj.ranks)
        assert torch.allclose(back(ids).logits, before, atol=1e-5, rtol=0)
    # a spec written before key and value groups were chosen apart (no version, no norms) still loads
    plain = copy.deepcopy(tiny_model("llama", **GEOM))
    rep2 = compress_(
        plain,
        CompressConfig(compressor="palu", param_ratio=0.5, align="none", options={"group_size": 2}),
        calib_batches=_batches(),
    )
    out2 = io.save(plain, tmp_path / "old", gac_config_for_save(rep2))
    cfg = json.loads((out2 / "gac_config.json").read_text())
    for entry in cfg["modules"]:
        for key in ("version", "q_norm", "k_norm"):
            entry["spec"].pop(key)
    (out2 / "gac_config.json").write_text(json.dumps(cfg))
    with torch.no_grad():
        assert torch.equal(gac.load(out2)(ids).logits, plain(ids).logits)
    cfg["modules"][0]["spec"]["version"] = 99
    (out2 / "gac_config.json").write_text(json.dumps(cfg))
    with pytest.raises(GacError, match="spec version 99 is newer"):
        gac.load(out2)


@pytest.mark.parametrize(
    ("options", "ratio", "align", "match"),
    [
        ({"k_group_size": 3}, 0.5, "none", "key group size 3 does not divide the model's 2 KV heads"),
        ({"v_group_size": 4}, 0.5, "none", "value group size 4 does not divide"),
        ({"group_size": 1}, 0.1, "gac", "below one rank modulus"),
    ],
)
def test_bad_group_sizes_and_ratio(options, ratio, align, match):
    base = tiny_model("llama", **GEOM)
    with pytest.raises(GacError, match=match):
        plan(
            base,
            CompressConfig(compressor="palu", param_ratio=ratio, align=align, options=options),
            calib_batches=[],
        )


def test_gac_generate_json_records_the_latent_path(tmp_path):
    """`gac generate DIR --json` on a PaLU directory: the static-cache decode path, and why not the kernel."""
    from typer.testing import CliRunner

    from gac import io
    from gac.cli import app
    from gac.testing import char_tokenizer

    m = tiny_model("qwen2", **GEOM)
    rep = compress_(
        m,
        CompressConfig(compressor="palu", param_ratio=0.5, align="none", options={"group_size": 1}),
        calib_batches=_batches(2),
    )
    out = io.save(m, tmp_path / "p", gac_config_for_save(rep))
    char_tokenizer().save_pretrained(out)
    r = CliRunner().invoke(app, ["generate", str(out), "--prompt", "Once upon", "-n", "3", "--json"])
    assert r.exit_code == 0, r.output
    got = json.loads(r.stdout[r.stdout.index("{") :])
    path = got["latent_attention_path"]
    assert path["reference"] == 2 and path["kernel"] == 0
    assert "not on CUDA" in path["reasons"] and not any("dynamic cache" in x for x in path["reasons"])
