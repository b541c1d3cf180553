"""The latent decode kernel's launch fits the GPU's shared memory at the ranks the real pipeline picks.

PaLU at KV 0.5 on the Llama-3-8B shape (key group 4, head_dim 128) gives key ranks up to 512 and value
ranks above 256 (a value tile of 512). There the launch table's G=4 row asks for more shared memory
than an H100 has per block (232,448 B), and every decode step failed with ``OutOfResources``: the
GPU tests drew ranks of 5-40 only. ``_launch`` now retries smaller (:func:`shrink`), warns once and
records it; these tests pin the shrink on the CPU (a launch that raises as the GPU did), the shared
memory of the compiled kernel for sm_90 (Triton compiles for a GPU target without one), and, on
CUDA, the kernel at those ranks against float64.
"""

from __future__ import annotations

import logging

import pytest
import torch

triton = pytest.importorskip("triton")

from triton.runtime.errors import OutOfResources  # noqa: E402

from gac.kernels import latent_attention as kl  # noqa: E402
from gac.testing import latent_decode_inputs  # noqa: E402

H100_SMEM = 232_448  # bytes per block (cudaDevAttrMaxSharedMemoryPerBlockOptin)


@pytest.fixture(autouse=True)
def _triton_kernel(monkeypatch):
    """These tests are of the Triton kernel's launches: the Gluon kernel (``gac.kernels.latent_gluon``) would serve
    some of them on a Hopper GPU."""
    monkeypatch.setattr(kl, "LATENT_KERNEL", "triton")


def _args(q, zk, zv, pack, inv, n):
    voff, vr, shared, valign = kl.per_kv_head(pack, q.device)
    return (
        q, zk, zv, pack["uk"], pack["koff"], pack["kr"], voff, vr, pack["k_bias"], pack["k_norm"], inv,
        torch.tensor([n], device=q.device), q.shape[-1] ** -0.5, 1.0, 1e-6, pack["rk_max"],
        max(pack["v_ranks"]), pack["kv_heads"], pack["k_group"], shared, pack["align"], valign,
    )  # fmt: skip


def test_shrink_drops_stages_then_halves_the_tile():
    cfg = {"block_t": 128, "block_r": 64, "num_warps": 8, "num_stages": 2, "splits": 4}
    seq = []
    while cfg is not None:
        seq.append((cfg["block_t"], cfg["num_stages"]))
        cfg = kl.shrink(cfg)
    assert seq == [(128, 2), (128, 1), (64, 1), (32, 1), (16, 1)]
    # a key group past the unrolled ones first takes the pipelined rank loop (the one-sequence launch)
    k4 = kl.shrink(
        {"block_t": 128, "block_r": 64, "num_warps": 8, "num_stages": 2, "splits": 4}, rank_loop=True
    )
    _, bt, br, nw, ns, _ = kl.FEW_PROGRAMS
    assert k4 == {"block_t": bt, "block_r": br, "num_warps": nw, "num_stages": ns, "splits": 4, "kloop": 1}
    assert kl.shrink(k4, rank_loop=True) == {**k4, "num_stages": ns - 1}  # then stages, as any launch


def test_a_launch_out_of_shared_memory_is_retried_smaller_warned_once_and_recorded(monkeypatch, caplog):
    # the GPU's behaviour, as Triton raises it at the first launch of a kernel that does not fit
    tried = []

    def fake_once(*a):
        cfg = a[-1]
        tried.append((cfg["block_t"], cfg["num_stages"], cfg["splits"], cfg.get("kloop", 0)))
        # 128 x 2 stages: 397,312 B, as the H100 reported; the rank loop's stages hold one rank chunk each
        need = cfg["block_t"] * cfg["num_stages"] * (300 if cfg.get("kloop") else 1552)
        if need > H100_SMEM:
            raise OutOfResources(need, H100_SMEM, "shared memory")
        return torch.zeros(1)

    monkeypatch.setattr(kl, "_launch_once", fake_once)
    monkeypatch.setattr(kl, "_FITTED", {})
    q, zk, zv, pack, inv = latent_decode_inputs(2, 32, 8, 128, 4096, 4, 4, [512, 512], [472, 472])
    cfg = {"block_t": 128, "block_r": 64, "num_warps": 8, "num_stages": 2, "splits": 7, "waves": 2}
    with caplog.at_level(logging.WARNING, logger="gac.kernels.latent_attention"):
        kl._launch(*_args(q, zk, zv, pack, inv, 4000), cfg=cfg)
    # key group 4: the pipelined rank loop (FEW_PROGRAMS' launch) before any stage is dropped
    _, bt, br, nw, ns, _ = kl.FEW_PROGRAMS
    assert [(t[0], t[1], t[3]) for t in tried] == [(128, 2, 0), (bt, ns, 1)]
    assert tried[-1][2] == 7  # same tile: same splits
    assert kl.LAST_LAUNCH["shrunk_from"] == {"block_t": 128, "num_stages": 2}
    warned = [r for r in caplog.records if "needs more shared memory" in r.getMessage()]
    assert (
        len(warned) == 1
        and f"block_t {bt}, {ns} stage(s), the rank chunks as a pipelined loop" in warned[0].getMessage()
    )
    ran = {"block_t": bt, "block_r": br, "num_warps": nw, "num_stages": ns, "kloop": 1}
    shrunk = {"key_group": 4, "rk_max": pack["rk_max"], "rv_max": 472, "asked": {"block_t": 128, "num_stages": 2},
              "ran": ran}  # fmt: skip
    assert [shrunk] == kl.shrunk_launches()
    # ... and a latent model's path record (the infer JSON, gac generate --json) says so
    from gac.api import CompressConfig, compress_
    from gac.nn.latent import latent_attention_paths
    from gac.testing import tiny_model

    m = tiny_model("llama", layers=2)
    ids = [torch.randint(3, 120, (2, 16), generator=torch.Generator().manual_seed(i)) for i in range(2)]
    compress_(m, CompressConfig(compressor="palu", param_ratio=0.5, align="none"), calib_batches=ids)
    # the shrunk launch is another shape than this model's layers: not this model's record
    assert "shrunk_launches" not in latent_attention_paths(m)
    layer = next(mod for mod in m.modules() if hasattr(mod, "decode_pack"))
    layer.__dict__["_pack"] = pack  # as if this layer had packed (and launched) that shape
    assert latent_attention_paths(m)["shrunk_launches"] == [shrunk]
    # the next launch of the same shape goes straight to the launch that fit, without a warning
    tried.clear()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="gac.kernels.latent_attention"):
        kl._launch(*_args(q, zk, zv, pack, inv, 4000), cfg=cfg)
    assert [(t[0], t[1], t[3]) for t in tried] == [(bt, ns, 1)] and not caplog.records
    # a smaller tile re-splits the cache (the tiles per split changed)
    monkeypatch.setattr(kl, "_FITTED", {})
    tried.clear()
    big = {**cfg, "num_stages": 1, "block_t": 256}
    kl._launch(*_args(q, zk, zv, pack, inv, 4000), cfg=big)
    assert [t[:2] for t in tried] == [(256, 1), (bt, ns)]
    assert tried[-1][2] == kl.num_splits(2 * 2, 4096, bt, q.device, 2)


def test_a_launch_that_never_fits_raises(monkeypatch):
    def never(*a):
        raise OutOfResources(10**6, H100_SMEM, "shared memory")

    monkeypatch.setattr(kl, "_launch_once", never)
    monkeypatch.setattr(kl, "_FITTED", {})
    q, zk, zv, pack, inv = latent_decode_inputs(1, 8, 2, 32, 64, 2, 2, [40], [40])
    with pytest.raises(OutOfResources):
        kl._launch(*_args(q, zk, zv, pack, inv, 60), cfg={"block_t": 32, "block_r": 32, "num_warps": 4,
                                                          "num_stages": 1, "splits": 1})  # fmt: skip


def test_the_g4_row_at_the_pipelines_ranks_fits_an_h100_within_one_shrink():
    """Compiled for sm_90 on the CPU (about 10 s): the table's G=4 launch at key rank 512 and a 512-wide
    value tile, which needed 397,312 B on the H100 (Triton 3.6), fits its shared memory after at most
    one :func:`shrink` (the pipelined rank loop at the same token tile, so the split count stays); a
    launch without the rank loop fits after one stage fewer."""
    row = next(r for r in kl.LAUNCH_TABLE if r[0] >= 4)
    _, bt, br, nw, ns, _ = row
    for k_group in (4, 1):
        cfg = {"block_t": bt, "block_r": br, "num_warps": nw, "num_stages": ns}
        needs = [kl.compiled_shared_bytes(4, 512, 512, bt, br, nw, ns)]
        while needs[-1] > H100_SMEM:
            cfg = kl.shrink(cfg, rank_loop=k_group > 2)
            assert cfg is not None, needs
            needs.append(kl.compiled_shared_bytes(4, 512, 512, cfg["block_t"], cfg["block_r"], cfg["num_warps"],
                                                  cfg["num_stages"], kloop=bool(cfg.get("kloop"))))  # fmt: skip
        assert len(needs) <= 2 and cfg["block_t"] == bt, (needs, cfg)
        assert bool(cfg.get("kloop")) == (k_group == 4)
    # the one-sequence launch (the pipelined rank loop) fits as it is, at n_rep 4 and 7
    _, bt, br, nw, ns, _ = kl.FEW_PROGRAMS
    for n_rep in (4, 7):
        assert kl.compiled_shared_bytes(4, 512, 512, bt, br, nw, ns, n_rep=n_rep, kloop=True) <= H100_SMEM


def test_the_raw_key_launches_at_the_pipelines_value_rank_fit_an_h100():
    """Compiled for sm_90 on the CPU: the raw-key launches (:data:`RAW_FEW` one KV head a program; :data:`RAW_LAUNCH`
    at the KV heads a program :func:`raw_program_heads` picks for Llama-3-8B's 4 and Qwen2.5-7B's 7 query heads a KV
    head) with the first layer's 512-wide value tile fit an H100's shared memory as they are: no shrink."""
    assert kl.raw_program_heads(4, 4) == 4 and kl.raw_program_heads(4, 7) == 2
    for launch, heads, n_rep in ((kl.RAW_FEW, 1, 7), (kl.RAW_LAUNCH, 4, 4), (kl.RAW_LAUNCH, 2, 7)):
        bt, br, nw, ns, _, _ = launch
        need = kl.compiled_shared_bytes(heads, 32, 512, bt, br, nw, ns, n_rep=n_rep, raw=True)
        assert need <= H100_SMEM, (launch, heads, n_rep, need)
    cfg = kl.launch_config(16, 32768, 4, None, raw=True, n_rep=7)
    assert cfg["sub"] == 2 and cfg["block_t"] == kl.RAW_LAUNCH[0]
    one = kl.launch_config(1, 32768, 4, None, raw=True, n_rep=7)
    assert one["sub"] == 1 and one["splits"] == kl.num_splits(4, 32768, kl.RAW_FEW[0], None, kl.RAW_FEW[4])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("g", [1, 2, 4])
@pytest.mark.parametrize(
    ("bias", "norm"), [(False, False), (True, False), (False, True)], ids=["llama", "qwen2", "qwen3"]
)
@pytest.mark.parametrize("batch", [3, 1])  # at G=4, B=1 launches the pipelined rank loop (FEW_PROGRAMS)
def test_default_launch_at_full_ranks_matches_float64_on_gpu(g, bias, norm, batch):
    """The launch table's own rows (no override) at the largest ranks a group can have: key rank
    G·head_dim and a value rank just under it, Llama-3-8B attention, bf16; keys plain (Llama), with a
    bias (Qwen2) and RMS-normalized per head (Qwen3)."""
    kl._ENV = None
    kv, hd = 8, 128
    kr, vr = [g * hd] * (kv // g), [g * hd - 8] * (kv // g)
    q, zk, zv, pack, inv = latent_decode_inputs(batch, 32, kv, hd, 1100, g, g, kr, vr, bias=bias, norm=norm,
                                                dtype=torch.bfloat16, device="cuda", seed=g)  # fmt: skip
    n = 1037
    out = kl._launch(*_args(q, zk, zv, pack, inv, n))
    ref = kl.reference_latent_decode(q, zk, zv, pack, n, inv, hd**-0.5, 1.0)
    got = out[..., : ref.shape[-1]].double()
    err = ((got - ref).norm() / ref.norm()).item()
    assert err < 2e-2, (g, err, kl.LAST_LAUNCH)


def test_balanced_splits_fill_the_last_wave_and_leave_one_wave_alone():
    # 512 programs on 396 slots: two waves, the second 29% full; 3 splits run 3.88 waves
    assert kl.balanced_splits(1, 512, 16384, 32, 396) == 3
    # one wave or less: left alone (fewer, longer programs)
    assert kl.balanced_splits(3, 128, 16384, 32, 396) == 3
    assert kl.balanced_splits(33, 8, 4096, 32, 396) == 33
    # raised until the last wave is >= 90% full, from the asked splits, never past 4x them or the tiles
    s = kl.balanced_splits(5, 64, 16384, 32, 264)
    w = 64 * s / 264
    assert 5 < s <= 20 and w / -(-w // 1) >= 0.9
    assert kl.balanced_splits(2, 300, 64, 32, 264) == 2  # two tiles: no more splits to give
    # no split count up to 4x fills a wave that well: the asked one stays
    assert kl.balanced_splits(1, 133, 4096, 32, 132) == 1  # 1.01 / 2.02 / 3.02 / 4.03 waves: at most 81% full


def test_a_launch_with_auto_splits_is_balanced_once_its_occupancy_is_known(monkeypatch):
    seen = []

    def fake_once(*a):
        cfg = a[-1]
        seen.append(cfg["splits"])
        kl.LAST_LAUNCH.clear()
        kl.LAST_LAUNCH.update(
            cfg, resident=3
        )  # what the compiled kernel's registers allow per multiprocessor
        return torch.zeros(1)

    monkeypatch.setattr(kl, "_launch_once", fake_once)
    monkeypatch.setattr(kl, "_RESIDENT", {})
    monkeypatch.setattr(kl, "_FITTED", {})
    monkeypatch.setattr(kl, "_sm_count", lambda index: 132)
    q, zk, zv, pack, inv = latent_decode_inputs(64, 8, 8, 32, 512, 1, 1, [16] * 8, [16] * 8)
    auto = {"block_t": 32, "block_r": 16, "num_warps": 4, "num_stages": 3, "splits": 1, "auto_splits": 1}
    kl._launch(*_args(q, zk, zv, pack, inv, 500), cfg=auto)  # 512 programs, occupancy not known yet
    kl._launch(*_args(q, zk, zv, pack, inv, 500), cfg=auto)  # 396 slots known: the last wave filled
    assert seen == [1, 3]
    # splits the caller fixed are launched as asked
    fixed = {k: v for k, v in auto.items() if k != "auto_splits"}
    kl._launch(*_args(q, zk, zv, pack, inv, 500), cfg=fixed)
    assert seen[-1] == 1


def test_value_ranks_join_the_alignment_the_value_loads_rely_on():
    # the kernel rounds each value rank down to the alignment to prove its mask 16-byte aligned: exact only
    # where the alignment divides the ranks as well as the offsets
    _, _, _, pack, _ = latent_decode_inputs(1, 8, 2, 32, 16, 1, 1, [16, 16], [16, 24])
    assert kl.per_kv_head(pack, torch.device("cpu"))[3] == 8
    _, _, _, pack, _ = latent_decode_inputs(1, 8, 2, 32, 16, 1, 1, [16, 16], [16, 20])
    assert kl.per_kv_head(pack, torch.device("cpu"))[3] == 4
    _, _, _, pack, _ = latent_decode_inputs(1, 8, 2, 32, 16, 1, 1, [16, 16], [16, 13])
    assert kl.per_kv_head(pack, torch.device("cpu"))[3] == 1  # offsets 0 and 16, last rank 13


def test_one_sequence_at_key_group_4_launches_the_pipelined_rank_loop():
    # B=1 x 2 key groups (Llama-3-8B at G=4): few programs, the pipelined rank loop was faster on an H100
    few = kl.launch_config(2, 16384, 4)
    assert (
        few["kloop"] == 1
        and (few["block_t"], few["block_r"], few["num_warps"], few["num_stages"]) == kl.FEW_PROGRAMS[1:5]
    )
    # B=16: the table's G=4 row, as before (the pipelined loop was slower there past 4096 cached tokens)
    many = kl.launch_config(32, 16384, 4)
    row = next(r for r in kl.LAUNCH_TABLE if r[0] >= 4)
    assert not many.get("kloop") and (many["block_t"], many["num_stages"]) == (row[1], row[4])
    # key groups of at most 2 keep their rows whatever the batch
    assert not kl.launch_config(2, 16384, 2).get("kloop")
    assert not kl.launch_config(1, 16384, 2).get("sub")


def test_one_program_per_split_spreads_the_key_group_over_a_program_per_kv_head():
    # B=1 x one key group of 4 (Qwen2.5-7B at G=4): a program per KV head, splits for 4 programs
    one = kl.launch_config(1, 16384, 4)
    bt, br, nw, ns, waves, sub = kl.ONE_PROGRAM
    assert (one["block_t"], one["block_r"], one["num_warps"], one["num_stages"], one["sub"]) == (
        bt,
        br,
        nw,
        ns,
        sub,
    )
    assert not one.get("kloop") and kl.program_heads(4, one["sub"]) == 1
    assert one["splits"] == kl.num_splits(4, 16384, bt, None, waves)
    # a program's heads must divide the key group
    with pytest.raises(ValueError, match="do not divide key group 4"):
        kl.program_heads(4, 3)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("rank", [144, 496])
def test_one_program_launch_matches_float64_on_gpu(rank):
    """The default launch at one sequence and one key group (Qwen2.5-7B attention: 28 query heads, 4 KV
    heads, key bias, G=4): a program per KV head, against float64."""
    kl._ENV = None
    q, zk, zv, pack, inv = latent_decode_inputs(1, 28, 4, 128, 4200, 4, 4, [rank], [rank + 16], bias=True,
                                                dtype=torch.bfloat16, device="cuda", seed=rank)  # fmt: skip
    n = 4133
    out = kl._launch(*_args(q, zk, zv, pack, inv, n))
    assert kl.LAST_LAUNCH["sub"] == 1
    ref = kl.reference_latent_decode(q, zk, zv, pack, n, inv, 128**-0.5, 1.0)
    got = out[..., : ref.shape[-1]].double()
    err = ((got - ref).norm() / ref.norm()).item()
    assert err < 2e-2, (rank, err, kl.LAST_LAUNCH)


def test_a_forced_launch_keeps_its_form_when_shrunk(monkeypatch):
    """``GAC_LATENT_LAUNCH`` (a benchmark's configuration) that runs out of shared memory drops a stage, as
    asked, rather than switching to the pipelined rank loop the table's launches take."""
    tried = []

    def fake_once(*a):
        cfg = a[-1]
        tried.append((cfg["block_t"], cfg["num_stages"], cfg.get("kloop", 0)))
        if cfg["num_stages"] > 1:
            raise OutOfResources(397312, H100_SMEM, "shared memory")
        return torch.zeros(1)

    monkeypatch.setattr(kl, "_launch_once", fake_once)
    monkeypatch.setattr(kl, "_FITTED", {})
    monkeypatch.setattr(kl, "_ENV", "128,64,8,2,0,2,0")
    q, zk, zv, pack, inv = latent_decode_inputs(2, 32, 8, 128, 4096, 4, 4, [512, 512], [472, 472])
    kl._launch(*_args(q, zk, zv, pack, inv, 4000))
    assert tried == [(128, 2, 0), (128, 1, 0)]


def test_the_g4_row_runs_a_wide_key_group_as_programs_of_at_most_16_query_rows():
    # Qwen2.5-7B at key group 4: 28 query rows spilled as one program; two KV heads a program (14 rows), not unrolled
    qwen = kl.launch_config(16 * 1, 32768, 4, None, n_rep=7)
    assert qwen["sub"] == 2 and qwen["unroll"] == 1 and qwen["block_t"] >= kl.VALUE_T_TILE
    assert qwen["splits"] == kl.num_splits(16 * 2, 32768, qwen["block_t"], None, qwen["waves"])
    assert kl.program_heads(4, qwen["sub"]) * 7 <= kl.QROT_ROWS
    # Llama-3-8B's key group of 4 x 4 query heads is one program, as before
    assert "sub" not in kl.launch_config(16 * 2, 32768, 4, None, n_rep=4)
    assert kl.transposed_values(128, False) and not kl.transposed_values(32, False)
    assert not kl.transposed_values(128, True)  # the pipelined rank loop keeps the values untransposed


def test_the_g4_row_takes_a_key_rank_up_to_one_chunk_whole():
    table = kl.LAUNCH_TABLE[-1]
    # Qwen2.5-7B at key group 4 from 16 sequences: programs of two KV heads; key rank 128 (or 96) is one chunk,
    # three tiles pipelined
    for rk in (128, 96):
        qwen = kl.launch_config(16, 32768, 4, None, n_rep=7, rk=rk)
        assert (qwen["sub"], qwen["block_r"], qwen["num_stages"]) == (2, kl.ONE_CHUNK_RANK, 3)
    # Llama-3-8B's whole key group a program: one chunk, its stages as the table's
    llama = kl.launch_config(32, 32768, 4, None, n_rep=4, rk=128)
    assert (llama["block_r"], llama["num_stages"]) == (kl.ONE_CHUNK_RANK, table[4])
    # past the chunk, at or under the table's own chunk, or unknown: the table's launch
    for rk in (64, 192, 256, 0):
        cfg = kl.launch_config(16, 32768, 4, None, n_rep=7, rk=rk)
        assert (cfg["block_r"], cfg["num_stages"]) == (table[2], table[4])
    # the unrolled key groups (1 and 2) and one sequence keep their rows
    assert kl.launch_config(16, 32768, 2, None, n_rep=4, rk=128)["block_r"] == kl.LAUNCH_TABLE[1][2]
    assert kl.launch_config(1, 32768, 4, None, n_rep=7, rk=128)["block_r"] == kl.ONE_PROGRAM[1]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize(("rk", "rv"), [(128, 384), (96, 400)])
def test_a_split_key_group_at_one_rank_chunk_matches_float64_on_gpu(rk, rv):
    """The table's launch of Qwen2.5-7B attention (28 query heads, 4 KV heads, key bias, G=4) from 16 sequences at
    the pipeline's most common key rank (128) and one off the tile: one rank chunk, against float64."""
    kl._ENV = None
    q, zk, zv, pack, inv = latent_decode_inputs(16, 28, 4, 128, 1100, 4, 4, [rk], [rv], bias=True,
                                                dtype=torch.bfloat16, device="cuda", seed=rk)  # fmt: skip
    n = 1037
    out = kl._launch(*_args(q, zk, zv, pack, inv, n))
    assert kl.LAST_LAUNCH["sub"] == 2 and kl.LAST_LAUNCH["block_r"] == kl.ONE_CHUNK_RANK
    ref = kl.reference_latent_decode(q, zk, zv, pack, n, inv, 128**-0.5, 1.0)
    got = out[..., : ref.shape[-1]].double()
    err = ((got - ref).norm() / ref.norm()).item()
    assert err < 2e-2, (rk, err, kl.LAST_LAUNCH)


def test_value_descriptor_needs_aligned_ranks_and_says_why_once(monkeypatch, caplog):
    """Where the tensor-memory accelerator could serve (the interpreter stands in for a Hopper GPU), a value cache
    whose groups are not aligned to 16 bytes loads through registers: warned once, recorded for
    ``latent_attention_paths``; aligned, a descriptor with the launch's box."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(kl, "_VALUE_PTR_REASONS", set())
    zv = torch.zeros(2, 300, 296, dtype=torch.bfloat16)
    d = kl.value_descriptor(zv, 128, 512, 8)
    assert d is not None and list(d.block_shape) == [1, 128, 256]
    with caplog.at_level(logging.WARNING, logger="gac.kernels.latent_attention"):
        assert kl.value_descriptor(torch.zeros(2, 300, 37, dtype=torch.bfloat16), 128, 64, 1) is None
        assert kl.value_descriptor(torch.zeros(2, 300, 37, dtype=torch.bfloat16), 128, 64, 1) is None
    assert len([r for r in caplog.records if "through registers" in r.message]) == 1
    assert len(kl.value_pointer_reasons()) == 1 and "16" in kl.value_pointer_reasons()[0]
    # a value tile past 512 columns has no descriptor box (at most 256 a load)
    assert kl.value_descriptor(torch.zeros(1, 300, 1024, dtype=torch.bfloat16), 128, 1024, 8) is None
    monkeypatch.delenv("TRITON_INTERPRET")
    # on the CPU, compiled: no accelerator to describe for
    assert kl.value_descriptor(zv, 128, 512, 8) is None
