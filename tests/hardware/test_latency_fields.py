"""The latency model's measured fields beyond the launch constants: the Triton decode GEMV's fit
(``gemv_kernel``) and prefill attention as the compiled step runs it (``prefill_attention``). Synthetic
profiles on tiny models; the shipped H100 profile for what it holds."""

from __future__ import annotations

import json

import pytest
import torch

from gac.errors import GacError
from gac.hardware.latency import Point, fit_gemv_kernel, launches, predict
from gac.hardware.profile import Profile, default_profile, load_profile
from gac.nn.fused import fuse_projections_
from gac.testing import tiny_model


def _prof() -> Profile:
    p = default_profile("bfloat16")
    p.launch_us, p.copy_gbps, p.aux_us = 5.0, 4500.0, 2.0
    return p


def test_prefill_attention_is_priced_from_its_measured_grid():
    m = tiny_model()
    fuse_projections_(m)
    p = _prof()
    before = [x for x in launches(m, p, Point("prefill", 1, seq=64)) if x.kind == "attention"]
    q = m.model.layers[0].self_attn.q_proj.out_features
    hd = m.model.layers[0].self_attn.head_dim
    p.prefill_attention = {"geometry": [q // hd, 1, hd], "points": [
        {"batch": b, "seq": s, "us": us} for (b, s), us in
        {(1, 32): 10.0, (1, 128): 40.0, (4, 32): 20.0, (4, 128): 160.0}.items()]}  # fmt: skip
    at = lambda b, s: [x.ms for x in launches(m, p, Point("prefill", b, seq=s)) if x.kind == "attention"]  # noqa: E731
    assert at(1, 32) == pytest.approx([10.0e-3] * 2)  # a measured point, per layer, its launch included
    assert at(1, 64) == pytest.approx([20.0e-3] * 2)  # log-linear between 32 and 128
    assert at(2, 32) == pytest.approx([10.0e-3 * 2**0.5] * 2)  # log-linear between batches 1 and 4
    assert at(8, 128) == pytest.approx([320.0e-3] * 2)  # past the batches: linear in the batch
    assert at(1, 256) == pytest.approx([160.0e-3] * 2)  # past the sequences: quadratic
    assert [x.ms for x in before] != at(1, 64)
    p.prefill_attention["geometry"] = [2 * q // hd, 1, hd]  # twice the measured query width: half the time
    assert at(1, 32) == pytest.approx([5.0e-3] * 2)
    assert not [
        x for x in launches(m, p, Point("decode", 1, kv=64)) if x.fixed_us == 0.0 and x.kind == "attention"
    ]


def test_weights_on_the_triton_gemv_are_priced_with_its_fit_at_their_row_class():
    from gac.runtime.gemv import GEMV

    m = tiny_model()
    fuse_projections_(m)
    p = _prof()
    p.gemv_kernel = {"rows": {"1": {"launch_us": 1.5, "gbps": 9000.0}}}
    dec = Point("decode", 1, kv=64)
    assert not [x for x in launches(m, p, dec) if x.fixed_us == 1.5]  # nothing switched: cuBLAS
    shapes = {f"{n}x{k}": {"1": [4, 512, 4, 3], "16": None} for n, k in
              {tuple(mod.weight.shape) for _, mod, _ in GEMV.sites(m)}}  # fmt: skip
    assert GEMV.switch_recorded_(m, shapes) == 2 * 4 + 1  # fused q/k/v, o, gate/up, down; the head
    own = [x for x in launches(m, p, dec) if x.fixed_us == 1.5]
    assert len(own) == 2 * 4 + 1 and all(x.byte_ms == pytest.approx(x.bytes / 9000e9 * 1e3) for x in own)
    assert predict(m, p, dec)["ms"] < predict(m, _prof(), dec)["ms"]
    assert not [x for x in launches(m, p, Point("decode", 16, kv=64)) if x.fixed_us == 1.5]  # 16 rows: cuBLAS
    # a prompt's GEMMs take cuBLAS; its head runs on the last position of one sequence: the GEMV
    assert [x.kind for x in launches(m, p, Point("prefill", 1, seq=32)) if x.fixed_us == 1.5] == ["head"]


def test_gemv_kernel_fit_per_row_class_over_the_winners():
    line = lambda b, t0: t0 + b / 3.0e6  # noqa: E731 - us at 3000 GB/s
    recs = [{"rows": 1, "bytes": b, "triton_us": line(b, 3.5), "use": True} for b in (2e6, 3e7, 2.6e8)]
    recs += [{"rows": 1, "bytes": 1e8, "triton_us": 999.0, "use": False}]  # lost to cuBLAS: not what runs
    recs += [{"rows": 16, "bytes": 3e7, "triton_us": line(3e7, 4.0), "use": True}]  # one winner: no row
    fit = fit_gemv_kernel(recs, "test")
    assert list(fit["rows"]) == ["1"] and fit["fit"]["source"] == "test"
    assert (fit["rows"]["1"]["launch_us"], fit["rows"]["1"]["gbps"]) == (3.5, 3000.0)
    assert fit["rows"]["1"]["points"] == 3 and fit["rows"]["1"]["of"] == 4
    assert fit_gemv_kernel(recs[3:], "test") == {}
    p = default_profile()
    p.gemv_kernel = fit
    back = Profile.from_dict(json.loads(json.dumps(p.to_dict())))
    assert back.gemv_kernel_at(1) == (3.5, 3000.0) and back.gemv_kernel_at(16) is None


def test_profile_round_trip_keeps_the_new_fields_and_refuses_bad_ones_in_one_line():
    p = _prof()
    p.prefill_attention = {"geometry": [4, 1, 30], "points": [{"batch": 1, "seq": 32, "us": 10.0}]}
    back = Profile.from_dict(json.loads(json.dumps(p.to_dict())))
    assert back.prefill_attention["points"][0]["us"] == 10.0 and back.gemv_kernel == {}
    bad = {
        "prefill_attention": [{"geometry": [4, 1], "points": [{"batch": 1, "seq": 32, "us": 1.0}]},
                              {"geometry": [4, 1, 30], "points": [{"batch": 1, "seq": 32, "us": 1.0},
                                                                  {"batch": 2, "seq": 64, "us": 1.0}]}],
        "gemv_kernel": [{"rows": {"1": {"launch_us": 1.0}}}, {"rows": {"1": {"launch_us": 1.0, "gbps": 0}}}],
    }  # fmt: skip
    for field, entries in bad.items():
        for e in entries:
            d = p.to_dict()
            d[field] = e
            with pytest.raises(GacError, match=field) as err:
                Profile.from_dict(d)
            assert "\n" not in str(err.value)


@pytest.mark.parametrize("name", ["measure_gemv_kernel", "measure_prefill_attention"])
def test_the_new_fields_are_measured_on_cuda_only(name):
    from gac.hardware import profiler

    with pytest.raises(GacError, match="CUDA only"):
        getattr(profiler, name)(torch.device("cpu"), torch.bfloat16)


def test_shipped_h100_profile_holds_the_fields_it_was_measured_with():
    p = load_profile("h100-bfloat16")
    assert p.gemv_kernel_at(1) is not None and "measure_gemv_kernel" in p.gemv_kernel["fit"]["source"]
    pa = p.prefill_attention
    assert pa["geometry"] == [32, 8, 128] and len(pa["points"]) == 12
    # one layer of Llama-3-8B's masked prefill attention at 8 x 2048: 2.03 ms a layer in the traced compiled step
    assert p.prefill_attention_ms(8, 2048, 4096, 128) == pytest.approx(2.03, rel=0.1)


def test_a_recorded_cell_is_priced_with_the_weights_its_infer_switched_to_the_gemv():
    """``gac report`` rebuilds a cell as its infer ran it: the GEMV sites it recorded are switched again on the
    skeleton, and a profile with a ``gemv_kernel`` fit prices them at it (a profile without one: as before)."""
    from gac.runtime.cells import cell_skeleton

    d = {"id": "tiny/base", "status": "ok", "cell": {"model": "tiny:llama"},
         "results": {"dims": None, "evals": {"infer": {"dtype": "bfloat16", "fused": 2}}}}  # fmt: skip
    plain = cell_skeleton(d)
    from gac.runtime.gemv import GEMV

    shapes = {GEMV.key(shape): {"1": [4, 512, 4, 3], "16": None} for _, _, shape in GEMV.sites(plain)}
    d["results"]["evals"]["infer"]["gemv"] = {"modules": len(shapes), "shapes": shapes}
    switched = cell_skeleton(d)
    assert sum(getattr(m, "gemv_table", None) is not None for m in switched.modules()) == len(
        GEMV.sites(plain)
    )
    p, dec = _prof(), Point("decode", 1, kv=64)
    assert predict(switched, p, dec)["ms"] == predict(plain, p, dec)["ms"]  # no fit: priced as cuBLAS
    p.gemv_kernel = {"rows": {"1": {"launch_us": 1.5, "gbps": 9000.0}}}
    assert predict(switched, p, dec)["ms"] < predict(plain, p, dec)["ms"]


def test_cublas_split_k_reductions_are_priced_where_the_output_has_few_tiles_for_its_k():
    from gac.hardware.latency import splits_k

    assert splits_k(512, 18944, 2304) and not splits_k(512, 14336, 2288)  # the traced Qwen/Llama down_proj.v
    assert splits_k(128, 14336, 4096) and not splits_k(512, 14336, 4096)  # dense down_proj at 128 / 512 rows
    m = tiny_model(intermediate=1000)
    fuse_projections_(m)
    p = _prof()
    reduces = lambda pt: [x for x in launches(m, p, pt) if x.name.endswith(".splitk_reduce")]  # noqa: E731
    red = reduces(Point("prefill", 1, seq=128))  # down_proj: K 1000 over one 128 x 128 tile
    assert [x.name for x in red] == [f"model.layers.{i}.mlp.down_proj.splitk_reduce" for i in range(2)]
    assert red[0].kind == "aux" and red[0].fixed_us == p.aux_us and red[0].bytes > 0
    assert reduces(Point("prefill", 1, seq=2048)) == []  # 16 tiles: K 1000 is too short to split
    assert reduces(Point("decode", 1, kv=64)) == []  # one row: inside the launch fit
    no_split = predict(m, p, Point("prefill", 1, seq=2048))["by_kind"]["aux"]["launches"]
    assert predict(m, p, Point("prefill", 1, seq=128))["by_kind"]["aux"]["launches"] == no_split + 2


def test_a_compiled_biased_gemm_whose_output_row_inductor_pads_pays_a_bias_copy():
    from gac.hardware.latency import bias_copied

    assert bias_copied(2416) and not bias_copied(4608) and not bias_copied(1000)  # 1000: under the threshold
    m = tiny_model("qwen2", hidden=1040, heads=8, kv_heads=2)
    fuse_projections_(m)  # q/k/v in one biased GEMM of 1040 + 2 x 260 = 1560 outputs: not a multiple of 64
    p = _prof()
    pt = Point("prefill", 1, seq=64)
    copies = [x for x in launches(m, p, pt) if x.name.endswith(".bias_copy")]
    assert [x.name for x in copies] == [f"model.layers.{i}.self_attn.fused_q_k_v.bias_copy" for i in range(2)]
    assert copies[0].bytes == 64 * 1560 * 4  # the output written once (float32 model)
    assert not [x for x in launches(m, p, pt, compiled=False) if x.name.endswith(".bias_copy")]
    plain = tiny_model("llama", hidden=1040, heads=8, kv_heads=2)
    fuse_projections_(plain)  # no bias: no copy
    assert not [x for x in launches(plain, p, pt) if x.name.endswith(".bias_copy")]


def test_the_bias_copy_rule_follows_inductors_padding_config():
    """The rule's constants are Inductor's stride padding (torch 2.11 on the GPU machine, the CI's torch here):
    if a torch release changes them, the model must follow."""
    import torch._inductor.config as ic

    from gac.hardware.latency import PAD_ALIGN_BYTES, PAD_STRIDE_THRESHOLD

    assert ic.comprehensive_padding
    assert (ic.padding_alignment_bytes, ic.padding_stride_threshold) == (
        PAD_ALIGN_BYTES,
        PAD_STRIDE_THRESHOLD,
    )
