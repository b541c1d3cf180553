"""PaLU's latent decode kernel for Hopper, written in Gluon: the copies issued ahead of their use.

:mod:`gac.kernels.latent_attention` launches it wherever it serves the launch (:func:`refusal`; its
``LATENT_KERNEL``), and its Triton flash kernel elsewhere. On an H200, the kernel alone took 0.62-0.98x the Triton
kernel's time at 15 of the 16 points timed at the default launch (:data:`LAUNCH`; Llama-3-8B and Qwen2.5-7B shapes,
key group 4, key/value ranks 128/232, 64/208 and 128/224; B 1/16/64 x KV 4096/32768) and 1.06x at the last
(Llama-3-8B at 128/232, B=16 x 32k): ``benchmarks/results/h200/palu-default/README.md``, calls 25-30. With one KV
head a program and 384 value columns (Qwen2.5-7B at 128/280) it took 0.84-0.92x (call 32).

The Triton kernel waits on every tile's loads in turn: Triton pipelines its innermost loop, the one over the key
group's heads, so each tile's key and value latents are fetched when the tile starts (call 13). This kernel computes
the same thing with the copies written out:

* the program's up-projections are copied into shared memory once (``2·G`` tensor-memory-accelerator copies of
  ``[head_dim / 2, RKP]``), so the rebuild reads nothing from L2 per tile;
* a tile's key latents ``[BLOCK_T, RKP]`` are copied ``XS`` tiles ahead through a ring of shared-memory stages (with
  ``XREG``, read once into registers as the rebuild's first operand and the stage refilled at once), the value
  latents ``[BLOCK_T, RVP]`` ``VS`` tiles ahead, each stage with its own mbarrier (a rank that is not a power of
  two in two boxes: key rank 192 as 128 + 64, value columns past 256 in a second box with its own accumulator);
* per tile, KV head and ``QC``-column chunk of both key halves (the RoPE pairs), the keys are rebuilt by two Hopper
  tensor-core products issued together and waited on once, take their bias and RMS norm (the norm's row scale is
  applied to the scores: RoPE and the dot are linear), RoPE at the in-tile offsets (fp16 cos/sin in shared memory;
  the tile start's rotation turns the queries, ``R(t0 + i)k · q = R(i)k · R(-t0)q``), and are scored against the
  queries as the register operand of a third product;
* one online softmax over the program's query rows, then ``P·Z_v`` transposed on the tensor cores, into the Triton
  kernel's fp32 partial outputs and running max/sum, which its combine kernel reduces.

Every rotary angle's cos/sin comes from host tables (:func:`tile_starts`). Evaluated in the kernel, sine and cosine
of angles up to 32k compiled to their precise path, double-precision and local-memory instructions in the loop:
Nsight Compute counted 2.3x the Triton kernel's instructions, and the kernel took 1.5-2.6x its time (calls 25-28).

It serves Hopper (sm_90) with Gluon (Triton 3.6; 3.9 compiles it too), ``head_dim`` 128, each key group inside one
value group, padded key ranks of at most :data:`MAX_RANK`, value ranks of :data:`MIN_VALUE` to :data:`MAX_VALUE`, and
programs of whole KV heads, at most 16 query rows, that fit shared memory at one of :data:`LAUNCHES` (:func:`plan`).
:func:`refusal` names why any other launch is not served, and :func:`slower` why a served one is left to the Triton
kernel, timed faster there (key group 1; one KV head a program of a key group the Triton kernel holds whole, from 16
sequences). At key and value groups of 2 it took 0.78-0.81x the Triton kernel's time (call 36), and the Llama-3-8B
and Qwen2.5-7B shapes so grouped decoded at 0.91-1.16x dense (calls 39-40; 0.93-1.31x with the launches below,
calls 58-59). Key ranks past 128 and 64-token tiles compile, pass the GPU tests and are reachable by
``GAC_GLUON_MAX_RANK`` and ``GAC_GLUON_LAUNCH``, but ran 1.0-2.3x the Triton kernel's time (calls 32-33), so they
are not the default. One 64-token launch is: :data:`OCCUPANCY_LAUNCH`,
two programs a multiprocessor, wherever its program holds as many KV heads as the 128-token one (value tiles below
256 columns then read in two boxes, :func:`value_boxes`). Where that program would hold fewer KV heads (key rank 128,
whose up-projections leave room for one program a multiprocessor), :data:`WARPGROUPS_LAUNCH` runs two warpgroups a
program over two splits of the cache, each with its own stages, sharing one copy of the up-projections and cos/sin
(``gl.warp_specialize``): 0.75-0.95x the 128-token launch's time from 16 sequences (call 54). Its 64-token stages take
half the shared memory, so it is also taken wherever its program holds more KV heads than either other launch's (four
at value latents of at most 128 columns, two at 264-384): 0.51-0.96x the time of the launch before from two sequences,
and the key rebuild at 54% of the measured bf16 peak at Llama-3-8B's 128/128, B=64 x 32k (calls 61, 62, 65). With
both, the capacity cell of key and value groups of 2 (Llama-3-8B shape, 32k) served 1.65x dense's tokens/s, against
1.59x with the occupancy launch alone and 1.46x before (calls 41, 49, 52 and 55).
"""

from __future__ import annotations

import os
from typing import Any, NamedTuple

import torch

from gac.alignment import next_pow2

try:  # Gluon is Triton's experimental layer: present from Triton 3.5, and its API still moves
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared,
        mbarrier,
        tma,
        warpgroup_mma,
        warpgroup_mma_wait,
    )
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    # the tensor-memory accelerator's global-to-shared copy: Triton 3.6's name, renamed async_load later
    _tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
    HAVE_GLUON = True
except (ImportError, AttributeError):  # pragma: no cover - depends on the install
    HAVE_GLUON = False

#: ``(block_t, num_warps, column chunk, x in registers)``: tokens a tile (the tensor-core products' M, 64 rows a
#: warpgroup), warps a program, the columns of each key half rebuilt, turned and scored at once, and whether the
#: tile's key latents are the rebuild's register operand (read from shared memory once a tile, not once a product);
#: the launches tried in turn, the first whose program fits (:func:`plan`). ``GAC_GLUON_LAUNCH`` overrides them
#: (``"bt,nw,qc,xreg[;bt,nw,qc,xreg...]"``). One launch by default. 64-token tiles in one warpgroup
#: (``64,4,32,1``), which fit one KV head's up-projections at key rank 192-256 beside value latents past 256 columns,
#: ran 1.01-1.28x the Triton kernel's time at Llama-3-8B's 192/328 and 1.7-2.3x at 256/440 (H200, call 32).
LAUNCHES = tuple(
    tuple(int(x) for x in part.split(","))
    for part in os.environ.get("GAC_GLUON_LAUNCH", "128,8,64,1").split(";")
)


# a launch's optional fifth field is ``occ``, programs a multiprocessor is meant to hold (1 where it is left out;
# the stages are chosen to fit that many programs' shared memory). Two more were timed in call 48 (commit 70304f4)
# and dropped: the next key chunk's rebuild issued before this one's RoPE and scores (it spilled 100-580 bytes a
# thread; 1.08-1.32x the default launch's time on an H200) and the raw queries staged in shared memory once a
# program (0.94-1.05x)
def launch_fields(launch: tuple[int, ...]) -> tuple[int, ...]:
    """A launch of :data:`LAUNCHES` with its optional fields filled in: ``(bt, nw, qc, xreg, occ, ws)``; ``ws`` 2
    runs two warpgroups of ``nw`` warps a program, each over its own split with its own stages, sharing the
    up-projections (``nw`` 4 and ``occ`` 1 only)."""
    if len(launch) not in (4, 5, 6):
        raise ValueError(f"a Gluon launch is bt,nw,qc,xreg[,occ[,ws]]; got {','.join(map(str, launch))}")
    full = (*launch, 1, 1)[:6]
    if full[5] not in (1, 2) or (full[5] == 2 and (full[1] != 4 or full[4] != 1)):
        raise ValueError(
            f"a Gluon launch of two warpgroups (ws 2) is bt,4,qc,xreg,1,2; got {','.join(map(str, launch))}"
        )
    return full


#: the launch that takes the place of the first of :data:`LAUNCHES` wherever its program holds as many KV heads
#: (:func:`plan`): 64-token tiles in one warpgroup, two programs a multiprocessor (their stages chosen to fit two
#: programs' shared memory, about 113 KB each), so that one program's rebuild, RoPE and softmax chain runs while the
#: other waits. Kernel alone on an H200 (``benchmarks/results/h200/palu-default/README.md``, calls 48-51), against the
#: 128-token launch: key and value groups of 2 at key/value ranks 64/112 and 64/144 (two KV heads a program either
#: way) 0.80-0.85x its time at 262 sequences x 32k and 0.76-0.92x at B 1/16/64 x 4k/32k but for one sequence of 4k
#: tokens (1.10-1.20x); Qwen2.5-7B's key group of 4 at 128/280 (one KV head a program either way) 0.75-0.78x but for
#: one sequence of 4k (1.14x). Where it holds fewer KV heads (Llama-3-8B's and Qwen2.5-7B's key group of 4 at key
#: rank 128 with value rank 224-232, a group of 2 at 128/216) it took 0.87-1.28x, slower at 10 of 13 points, so it is
#: not taken there. ``GAC_GLUON_OCC_LAUNCH`` overrides it ("" for none)
OCCUPANCY_LAUNCH = tuple(
    int(x) for x in os.environ.get("GAC_GLUON_OCC_LAUNCH", "64,4,64,1,2").split(",") if x
)
#: one sequence over at most this many cache slots keeps the 128-token launch (:func:`plan`): there the occupancy launch
#: took 1.10-1.20x its time at 4096 slots (5 of 5 shapes, calls 50-51), and 0.77-0.82x at 32768
OCCUPANCY_FROM_SLOTS = 4096
#: the launch that takes the place of the first of :data:`LAUNCHES` where the occupancy launch holds fewer KV heads
#: and this one at least as many, from :data:`WARPGROUPS_FROM` sequences (:func:`plan`): two warpgroups a program, each
#: over its own split at 64-token tiles with its own key and value stages, sharing the up-projections and the in-tile
#: cos/sin, so that one warpgroup's chain runs while the other waits where two programs' up-projections do not fit
#: one multiprocessor (key rank 128). Kernel alone on an H200 (``benchmarks/results/h200/palu-default/README.md``,
#: call 54), against the 128-token launch: Llama-3-8B's key group of 4 at 128/232 0.75-0.85x its time from 16
#: sequences, Qwen2.5-7B's at 128/224 0.88-0.95x, key and value groups of 2 at 128/216 and 128/168 (262 sequences x
#: 32k) 0.86x; one sequence 0.92-1.20x. ``GAC_GLUON_WS_LAUNCH`` overrides it ("" for none)
WARPGROUPS_LAUNCH = tuple(
    int(x) for x in os.environ.get("GAC_GLUON_WS_LAUNCH", "64,4,64,1,1,2").split(",") if x
)
#: the fewest sequences that take :data:`WARPGROUPS_LAUNCH`: one sequence ran 0.92-1.20x the 128-token launch's time
WARPGROUPS_FROM = 2
#: the first launch tried (the one timed in calls 29-30)
LAUNCH = LAUNCHES[0]
#: registers a thread of the second warpgroup of a two-warpgroup launch (``ws`` 2, :func:`launch_fields`) asks for;
#: the first takes what is left of the register file
WS_REGS = int(os.environ.get("GAC_GLUON_WS_REGS", "240"))
#: the most KV heads a program takes (``GAC_GLUON_HEADS``, a benchmark's override; 0: as many as fit)
MOST_HEADS = int(os.environ.get("GAC_GLUON_HEADS", "0"))
#: the largest padded key rank served (``GAC_GLUON_MAX_RANK``, up to 256): past 128 the program's up-projections take
#: one KV head at 128-token tiles, and that ran 1.49-1.78x the Triton kernel's time at Llama-3-8B's 192/248 (H200,
#: call 33; key boxes 128 + 64), where one KV head at key rank 128 and 280 value columns ran 0.84-0.92x (call 32)
MAX_RANK = int(os.environ.get("GAC_GLUON_MAX_RANK", "128"))
#: the widest value latent served: two descriptor boxes of at most 256 columns
MAX_VALUE = 512
#: the narrowest value tile: the transposed ``P·Z_v`` product's rows are the value columns, and a Hopper tensor-core
#: product's rows come in warpgroups of 64 (value rank 32 failed to compile, H200 call 36: the profile's key-group-1
#: calls at KV 0.25); narrower value latents take the Triton kernel
MIN_VALUE = 64
#: the widest descriptor box (Hopper's tensor-memory accelerator: 256 elements a dimension)
BOX = 256
#: the key rank's tile: ranks are padded to 64-column multiples, then split into power-of-two boxes (:func:`key_boxes`)
RANK_TILE = 64
#: key ranks past this take 32-column chunks (the rebuilt chunks and the in-tile cos/sin beside the register operand)
WIDE_KEYS = 128
#: shared memory a block may take on a Hopper GPU (bytes), less what the compiler adds for barriers and scratch
SMEM_BUDGET = 232448 - 4096
#: shared memory of one multiprocessor (Hopper), and what the driver reserves for each resident block
SMEM_PER_SM = 233472
SMEM_RESERVED = 1024


def smem_budget(occ: int = 1) -> int:
    """Shared memory a program may take so that ``occ`` of them fit one multiprocessor (bytes)."""
    if occ <= 1:
        return SMEM_BUDGET
    return SMEM_PER_SM // occ - SMEM_RESERVED - 2048


class Plan(NamedTuple):
    """One launch of the kernel: KV heads a program (``g``), its tile and warps, the column chunk, the key latents as
    the register operand, the key and value stages, the query rows (``mq``: a power of two of at least 16, or 8 in
    one warpgroup, where the value accumulators' registers a thread double), and the descriptor boxes: key ranks
    ``rk1 + rk2`` (``rk2`` 0 or the part past the largest power of two), value columns ``rvl + rvh`` (``rvh`` past
    the first 256, 0 if none) of an output ``rvo`` wide."""

    g: int
    block_t: int
    num_warps: int
    qc: int
    xreg: bool
    xs: int
    vs: int
    mq: int
    rk1: int
    rk2: int
    rvl: int
    rvh: int
    rvo: int
    occ: int = 1
    ws: int = 1


def key_boxes(rk_max: int) -> tuple[int, int]:
    """The key latent's descriptor boxes (powers of two): the padded rank (64-column multiples) as its largest power
    of two and the rest, ``192 -> (128, 64)``."""
    rkp = -(-int(rk_max) // RANK_TILE) * RANK_TILE
    rk1 = 1 << (rkp.bit_length() - 1)
    return rk1, rkp - rk1


#: a value tile below 256 columns read in two boxes where they hold fewer columns than one power of two
#: (:func:`value_boxes`; ``GAC_GLUON_VALUE_SPLIT=0``: one box)
VALUE_SPLIT = os.environ.get("GAC_GLUON_VALUE_SPLIT", "1") != "0"


def value_boxes(rv_max: int, num_warps: int) -> tuple[int, int]:
    """The value latent's descriptor boxes: the value tile as one power of two up to 256 columns; past 256, 256 and
    the rest as a power of two of at least a product's rows (16 a warp, 64 at least), ``328 -> (256, 128)``. Below
    256, two such boxes where they read fewer columns (:data:`VALUE_SPLIT`): at 4 warps ``144 -> (128, 64)``, where
    one box of 256 read 112 columns of the next group's latents and zeroed them."""
    rvp = next_pow2(rv_max)
    least = max(16 * num_warps, 64)
    if rvp <= BOX:
        second = max(least, next_pow2(int(rv_max) - rvp // 2))
        if VALUE_SPLIT and rvp // 2 >= least and rvp // 2 + second < rvp:
            return rvp // 2, second
        return rvp, 0
    return BOX, max(least, next_pow2(int(rv_max) - BOX))


def shared_bytes(
    g: int, rkp: int, rvp: int, mq: int, xs: int, vs: int, head_dim: int = 128, block_t: int | None = None,
    ws: int = 1,
) -> int:  # fmt: skip
    """Shared memory of one program (bf16): up-projections and the in-tile cos/sin (fp16), and each of its ``ws``
    warpgroups' key and value stages (``rkp`` and ``rvp`` columns a token), queries and probabilities."""
    bt = block_t or LAUNCH[0]
    own = xs * bt * rkp + vs * bt * rvp + mq * head_dim + bt * mq
    return 2 * (g * head_dim * rkp + ws * own + bt * head_dim)


def stages(
    g: int, rkp: int, rvp: int, mq: int, block_t: int | None = None, occ: int = 1, ws: int = 1
) -> tuple[int, int] | None:
    """``(XS, VS)``: key and value stages that fit (``occ`` programs a multiprocessor, ``ws`` warpgroups each), the
    most value stages first; None if one of each does not."""
    for xs, vs in ((2, 2), (2, 1), (1, 1)):
        if shared_bytes(g, rkp, rvp, mq, xs, vs, block_t=block_t, ws=ws) <= smem_budget(occ):
            return xs, vs
    return None


def _first_fit(launches: tuple, k_group: int, n_rep: int, rk_max: int, rv_max: int) -> Plan | None:
    rk1, rk2 = key_boxes(rk_max)
    for launch in launches:
        bt, nw, qc, xreg, occ, ws = launch_fields(launch)
        rvl, rvh = value_boxes(rv_max, nw)
        for g in range(min(MOST_HEADS or k_group, k_group), 0, -1):
            rows = next_pow2(g * n_rep, 8 if nw < 8 else 16)
            if k_group % g or rows > 16:
                continue
            st = stages(g, rk1 + rk2, rvl + rvh, rows, block_t=bt, occ=occ, ws=ws)
            if st is not None:
                qcw = min(qc, 32) if rk1 + rk2 > WIDE_KEYS else qc
                return Plan(g, bt, nw, qcw, bool(xreg), *st, rows, rk1, rk2, rvl, rvh, next_pow2(rv_max),
                            int(occ), int(ws))  # fmt: skip
    return None


def plan(k_group: int, n_rep: int, rk_max: int, rv_max: int, batch: int = 0, slots: int = 0) -> Plan | None:
    """The first of :data:`LAUNCHES` with a program that fits, and in it the most KV heads a program: dividing the
    key group, at most 16 query rows (more spilled, compiled for sm_90), and its up-projections beside one stage of
    each latent in shared memory; None if no launch fits even one head's. :data:`OCCUPANCY_LAUNCH` takes its place
    where its program holds as many KV heads, but for one sequence (``batch``) over at most
    :data:`OCCUPANCY_FROM_SLOTS` cache slots (``slots``; 0: not known); elsewhere :data:`WARPGROUPS_LAUNCH` does
    where its program holds as many, from :data:`WARPGROUPS_FROM` sequences, and before either wherever it holds more
    KV heads than both (its 64-token stages take half the 128-token launch's shared memory; one stage each): four at
    Llama-3-8B's key group of 4 at 128/128, 0.63-0.80x the 128-token launch's time from 2 sequences and 0.77-0.92x two
    warpgroups of two KV heads (H200, call 61); two at 128/264-384 where the others held one, 0.51-0.96x the time of
    the launch taken before (the Triton kernel, the 128-token or the occupancy launch; calls 62 and 65)."""
    p = _first_fit(LAUNCHES, k_group, n_rep, rk_max, rv_max)
    if p is None:
        return None
    short = batch == 1 and 0 < slots <= OCCUPANCY_FROM_SLOTS
    occ = (
        _first_fit((OCCUPANCY_LAUNCH,), k_group, n_rep, rk_max, rv_max)
        if OCCUPANCY_LAUNCH and not short
        else None
    )
    ws = (
        _first_fit((WARPGROUPS_LAUNCH,), k_group, n_rep, rk_max, rv_max)
        if WARPGROUPS_LAUNCH and batch >= WARPGROUPS_FROM
        else None
    )
    if (
        ws is not None and ws.g > p.g and (occ is None or ws.g > occ.g)
    ):  # more KV heads than either other launch
        return ws
    for a in (occ, ws):
        if a is not None and a.g == p.g:
            return a
    return p


def unserved(
    head_dim: int,
    dtype: torch.dtype,
    rk_max: int,
    rv_max: int,
    v_shared: bool,
    raw: bool,
    rope_table: bool = True,
) -> str | None:
    """Why the kernel's layout does not serve a launch's shapes (any GPU aside), or None."""
    if raw:
        return "keys cached raw (nothing to rebuild)"
    if not rope_table:
        return "a rotary embedding that rescales with the length (no rotary table: the Triton kernel evaluates it)"
    if head_dim != 128:
        return f"head_dim {head_dim} (serves 128)"
    if dtype not in (torch.bfloat16, torch.float16):
        return f"{dtype} (serves bf16 and fp16)"
    if not v_shared:
        return "value groups apart from the key groups"
    if sum(key_boxes(rk_max)) > MAX_RANK:
        return f"key rank {rk_max} (the up-projections of a program stay on chip up to rank {MAX_RANK})"
    if rv_max > MAX_VALUE:
        return f"value rank {rv_max} (two descriptor boxes hold {MAX_VALUE} columns)"
    if next_pow2(rv_max) < MIN_VALUE:
        return f"value rank {rv_max} (the P·V product's rows are value columns, {MIN_VALUE} at least)"
    return None


#: from this many sequences, a program of one KV head out of a key group that the Triton kernel's program holds whole
#: (more than two KV heads) is left to the Triton kernel (:func:`slower`). Timed at 1-16 sequences in call 47: faster
#: than the Triton kernel at one sequence only
SPLIT_GROUP_FROM = 2


def slower(k_group: int, batch: int, p: Plan, triton_heads: int) -> str | None:
    """Why the Triton kernel takes a launch this kernel serves (``p``, :func:`plan`) because it was timed faster there
    (``triton_heads``: KV heads a Triton program takes, :func:`gac.kernels.latent_attention.program_heads`), or None.

    Both on one H200 (``benchmarks/results/h200/palu-default/README.md``, calls 36-37; Triton rows of the latent
    class reproduced within 2% across the two runs):

    * **key group 1**: this kernel took 0.97-1.16x the Triton kernel's time at 20 calls, more at 18 (Llama-3-8B and
      Qwen2.5-7B shapes, key and value rank 64, B 16/64 x KV 16k/32k, and the class's key-group-1 calls);
    * **one KV head a program where the Triton kernel holds the key group** (Llama-3-8B's group of 4 at key rank 128
      and 384 value columns, which leave shared memory one head's up-projections): 1.28-1.31x its time from 16
      sequences (B=16 x 16k, B=64 x 4k), 0.61-0.96x at one sequence. Call 47 timed the rest, kernel alone at KV
      4096/16384/32768: 0.63-0.97x at one sequence, 1.04-1.30x at 2, 4, 8 and 16, so from 2 sequences it is left to
      the Triton kernel. Qwen2.5-7B's group of 4 (28 query rows) is two KV heads a Triton program, and one a program
      here took 0.84-0.92x its time (call 32).
    """
    if k_group == 1:
        return "key group 1 (the Triton kernel's per-head launch is faster there)"
    if p.g == 1 and triton_heads > 2 and batch >= SPLIT_GROUP_FROM:
        return (
            f"one KV head a program of a key group of {k_group} that the Triton kernel holds whole, from "
            f"{SPLIT_GROUP_FROM} sequences (the Triton kernel is faster there)"
        )
    return None


def refusal(
    q: torch.Tensor, zk: torch.Tensor, zv: torch.Tensor, uk: torch.Tensor, rk_max: int, rv_max: int, k_group: int,
    n_rep: int, v_shared: bool, raw: bool, rope_table: bool = True,
) -> tuple[str | None, Plan | None]:  # fmt: skip
    """Why this kernel does not serve a launch (key groups of ``k_group`` KV heads, ``n_rep`` query heads each), or
    None where it does; and the launch it then takes (:func:`plan`)."""
    if not HAVE_GLUON:
        return "Triton without Gluon's Hopper layer (triton.experimental.gluon)", None
    if q.device.type != "cuda" or torch.cuda.get_device_capability(q.device)[0] != 9:
        return "not a Hopper GPU (sm_90)", None
    why = unserved(q.shape[-1], q.dtype, rk_max, rv_max, v_shared, raw, rope_table)
    if why is None and not (zk.is_contiguous() and zv.is_contiguous() and uk.is_contiguous()):
        why = "latents or up-projections not contiguous"
    elif why is None and ((zk.shape[-1] * 2) % 16 or (zv.shape[-1] * 2) % 16 or (uk.shape[-1] * 2) % 16):
        why = "latent rows not 16-byte multiples"
    p = plan(k_group, n_rep, rk_max, rv_max, batch=q.shape[0], slots=zk.shape[1]) if why is None else None
    if why is None and p is None:
        why = f"key rank {rk_max} with value rank {rv_max} (no program of whole KV heads fits shared memory)"
    return why, p


if HAVE_GLUON:

    @gluon.jit
    def _load_boxes(
        desc, desc2, bar, dst, dst2, row, col, ok, W: gl.constexpr, W2: gl.constexpr, NBYTES: gl.constexpr
    ):
        """One stage of a latent tile: its first box (``W`` columns from ``col``) and, where ``W2``, the second past
        it, both on one mbarrier expecting ``NBYTES``."""
        mbarrier.expect(bar, NBYTES, pred=ok)
        _tma_load(desc, [row, col], bar, dst, pred=ok)
        if W2 > 0:
            _tma_load(desc2, [row, col + W], bar, dst2, pred=ok)

    @gluon.jit
    def _rebuild(xa, xa2, u_smem, u2_smem, hj, zero_k, c: gl.constexpr, QC: gl.constexpr, RK2: gl.constexpr):
        """Issue the rebuild of column chunk ``c`` of KV head ``hj``'s two key halves (the RoPE pairs): two
        asynchronous tensor-core products (four with a second key box); the caller waits on them."""
        u1 = u_smem.index(2 * hj).slice(c * QC, QC, dim=0).permute((1, 0))
        u2 = u_smem.index(2 * hj + 1).slice(c * QC, QC, dim=0).permute((1, 0))
        k1 = warpgroup_mma(xa, u1, zero_k, use_acc=False, is_async=True)
        k2 = warpgroup_mma(xa, u2, zero_k, use_acc=False, is_async=True)
        if RK2 > 0:
            u1b = u2_smem.index(2 * hj).slice(c * QC, QC, dim=0).permute((1, 0))
            u2b = u2_smem.index(2 * hj + 1).slice(c * QC, QC, dim=0).permute((1, 0))
            k1 = warpgroup_mma(xa2, u1b, k1, is_async=True)
            k2 = warpgroup_mma(xa2, u2b, k2, is_async=True)
        return k1, k2

    @gluon.jit
    def _turned_keys(
        k1, k2, kb_ptr, kn_ptr, kvh, cs_smem, ssq, offs_f, c: gl.constexpr, NC: gl.constexpr, QC: gl.constexpr,
        HALF: gl.constexpr, HAS_BIAS: gl.constexpr, HAS_NORM: gl.constexpr, mma_k: gl.constexpr, a_s: gl.constexpr,
        dt: gl.constexpr,
    ):  # fmt: skip
        """A rebuilt chunk of KV head ``kvh``'s key halves with its bias and RMS-norm weight (``ssq`` gathers the
        row's sum of squares: its scale is applied to the scores), turned by the in-tile offsets' RoPE, as the
        score product's register operand."""
        if HAS_BIAS:
            kbj = kb_ptr + kvh * (2 * HALF) + c * QC
            k1 = k1 + gl.load(kbj + offs_f).to(gl.float32)[None, :]
            k2 = k2 + gl.load(kbj + HALF + offs_f).to(gl.float32)[None, :]
        if HAS_NORM:
            ssq += gl.sum(k1 * k1, axis=1) + gl.sum(k2 * k2, axis=1)
            k1 = k1 * gl.load(kn_ptr + c * QC + offs_f).to(gl.float32)[None, :]
            k2 = k2 * gl.load(kn_ptr + HALF + c * QC + offs_f).to(gl.float32)[None, :]
        ci = cs_smem.index(c).load(mma_k).to(gl.float32)
        si = cs_smem.index(NC + c).load(mma_k).to(gl.float32)
        r1 = gl.convert_layout((k1 * ci - k2 * si).to(dt), a_s)
        r2 = gl.convert_layout((k2 * ci + k1 * si).to(dt), a_s)
        return r1, r2, ssq

    @gluon.jit
    def _load_up(
        uk_desc, uk2_desc, bar_u, u_smem, u2_smem, kvh0, G: gl.constexpr, HALF: gl.constexpr, RKP: gl.constexpr,
        RK2: gl.constexpr,
    ):  # fmt: skip
        """The key group's up-projections, once a program, on ``bar_u``."""
        mbarrier.expect(bar_u, 2 * G * HALF * (RKP + RK2) * 2)
        for j in gl.static_range(2 * G):
            _tma_load(uk_desc, [(2 * kvh0 + j) * HALF, 0], bar_u, u_smem.index(j))
            if RK2 > 0:
                _tma_load(uk2_desc, [(2 * kvh0 + j) * HALF, RKP], bar_u, u2_smem.index(j))

    @gluon.jit
    def _fill_cs(
        cs_smem,
        ti_ptr,
        rope_scale,
        BLOCK_T: gl.constexpr,
        QC: gl.constexpr,
        HALF: gl.constexpr,
        mma_k: gl.constexpr,
    ):
        """The in-tile offsets' cos/sin (the tile start turns the queries), in shared memory as fp16 (2^-11 relative,
        below the keys' own bf16 rounding), chunk by chunk: the low half's chunk ``c`` at ``c``, the high half's at
        ``NC + c``. Held in registers as two [64, 64] fp32 tiles they took 64 a thread and the program spilled
        (compiled for sm_90 by Triton 3.6)."""
        NC: gl.constexpr = HALF // QC
        offs_i = gl.arange(0, BLOCK_T, layout=gl.SliceLayout(1, mma_k))
        offs_f = gl.arange(0, QC, layout=gl.SliceLayout(0, mma_k))
        for c in gl.static_range(NC):
            tib = ti_ptr + offs_i[:, None] * HALF + c * QC + offs_f[None, :]
            cs_smem.index(c).store((gl.load(tib) * rope_scale).to(gl.float16))
            cs_smem.index(NC + c).store((gl.load(tib + BLOCK_T * HALF) * rope_scale).to(gl.float16))

    @gluon.jit
    def _own_smem(
        zk_desc, zk2_desc, zv_desc, zvh_desc, dt: gl.constexpr, RKP: gl.constexpr, RK2: gl.constexpr,
        RVP: gl.constexpr, RVH: gl.constexpr, MQ: gl.constexpr, BLOCK_T: gl.constexpr, XS: gl.constexpr,
        VS: gl.constexpr, QC: gl.constexpr, NC: gl.constexpr,
    ):  # fmt: skip
        """One warpgroup's own shared memory: key and value stages (second boxes where the ranks need them), the
        turned queries (the low half's chunk ``c`` at ``c``, the high half's at ``NC + c``), the probabilities, and
        the stages' mbarriers."""
        x_smem = gl.allocate_shared_memory(dt, [XS, BLOCK_T, RKP], zk_desc.layout)
        v_smem = gl.allocate_shared_memory(dt, [VS, BLOCK_T, RVP], zv_desc.layout)
        if RK2 > 0:  # noqa: SIM108 - key ranks past a power of two; a static branch
            x2_smem = gl.allocate_shared_memory(dt, [XS, BLOCK_T, RK2], zk2_desc.layout)
        else:  # never read (every use is under RK2 > 0)
            x2_smem = x_smem
        if RVH > 0:  # noqa: SIM108 - value columns past 256; a static branch, as the one above
            vh_smem = gl.allocate_shared_memory(dt, [VS, BLOCK_T, RVH], zvh_desc.layout)
        else:
            vh_smem = v_smem
        q_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([MQ, QC], dt)
        q_smem = gl.allocate_shared_memory(dt, [2 * NC, MQ, QC], q_layout)
        p_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_T, MQ], dt)
        p_smem = gl.allocate_shared_memory(dt, [BLOCK_T, MQ], p_layout)
        bar_x = gl.allocate_shared_memory(gl.int64, [XS, 1], mbarrier.MBarrierLayout())
        bar_v = gl.allocate_shared_memory(gl.int64, [VS, 1], mbarrier.MBarrierLayout())
        return x_smem, x2_smem, v_smem, vh_smem, q_smem, p_smem, bar_x, bar_v

    @gluon.jit
    def _tiles(
        q_ptr, descs, smem, bars, ptrs, strides, part, qk_scale, rope_scale, eps,
        NREP: gl.constexpr, G: gl.constexpr, HALF: gl.constexpr, RKP: gl.constexpr, RK2: gl.constexpr,
        RVP: gl.constexpr, RVH: gl.constexpr, RVO: gl.constexpr, XBYTES: gl.constexpr, VBYTES: gl.constexpr,
        MQ: gl.constexpr, BLOCK_T: gl.constexpr, XS: gl.constexpr, VS: gl.constexpr,
        HAS_BIAS: gl.constexpr, HAS_NORM: gl.constexpr, QC: gl.constexpr, XREG: gl.constexpr, WS: gl.constexpr,
        num_warps: gl.constexpr,
    ):  # fmt: skip
        """One program's (or, with ``WS`` 2, one warpgroup's) share of the cache: split ``WS·split + part`` of
        ``WS·NSPLIT``, tile by tile, into its slot of the partial outputs."""
        zk_desc, zk2_desc, zv_desc, zvh_desc, uk_desc, uk2_desc = descs
        koff_ptr, voff_ptr, vr_ptr, kb_ptr, kn_ptr, ts_ptr, ti_ptr, len_ptr, o_ptr, ml_ptr = ptrs
        sqb, sqh, T, NT, sob, soh, sos, smb, smh, KGROUPS, NSPLIT = strides
        u_smem, u2_smem, x_smem, x2_smem, v_smem, vh_smem, q_smem, cs_smem, p_smem = smem
        bar_u, bar_x, bar_v = bars
        dt: gl.constexpr = q_ptr.dtype.element_ty
        pid = gl.program_id(0)
        split = gl.program_id(1) * WS + part
        b = pid // KGROUPS
        kg = pid % KGROUPS
        kvh0 = kg * G
        h0 = kvh0 * NREP
        n_valid = gl.load(len_ptr).to(gl.int32)
        per = gl.cdiv(gl.cdiv(n_valid, NSPLIT * WS), BLOCK_T) * BLOCK_T
        start = split * per
        end = gl.minimum(start + per, n_valid)
        n_tiles = gl.cdiv(gl.maximum(end - start, 0), BLOCK_T)

        # layouts: a column chunk of a rebuilt key half [BLOCK_T, QC] and the scores / transposed outputs [*, MQ]
        NC: gl.constexpr = HALF // QC
        mma_k: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, QC, 16]
        )
        mma_s: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, MQ, 16]
        )
        a_s: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma_s, k_width=2)
        a_k: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma_k, k_width=2)
        blk: gl.constexpr = gl.BlockedLayout(
            size_per_thread=[1, 8], threads_per_warp=[8, 4], warps_per_cta=[num_warps, 1], order=[1, 0]
        )
        if WS == 1:
            mbarrier.init(bar_u, count=1)
        for s in gl.static_range(XS):
            mbarrier.init(bar_x.index(s), count=1)
        for s in gl.static_range(VS):
            mbarrier.init(bar_v.index(s), count=1)

        koff = gl.load(koff_ptr + kvh0)
        voff = gl.load(voff_ptr + kvh0)
        row0 = b * T + start
        if WS == 1:
            _load_up(uk_desc, uk2_desc, bar_u, u_smem, u2_smem, kvh0, G, HALF, RKP, RK2)
        # the first tiles' latents
        for s in gl.static_range(XS):
            _load_boxes(zk_desc, zk2_desc, bar_x.index(s), x_smem.index(s), x2_smem.index(s), row0 + s * BLOCK_T,
                        koff, s < n_tiles, RKP, RK2, XBYTES)  # fmt: skip
        for s in gl.static_range(VS):
            _load_boxes(zv_desc, zvh_desc, bar_v.index(s), v_smem.index(s), vh_smem.index(s), row0 + s * BLOCK_T,
                        voff, s < n_tiles, RVP, RVH, VBYTES)  # fmt: skip
        if WS == 1:
            _fill_cs(cs_smem, ti_ptr, rope_scale, BLOCK_T, QC, HALF, mma_k)

        offs_f = gl.arange(0, QC, layout=gl.SliceLayout(0, mma_k))
        offs_m = gl.arange(0, MQ, layout=gl.SliceLayout(1, blk))
        offs_d = gl.arange(0, QC, layout=gl.SliceLayout(0, blk))
        mrow = offs_m < G * NREP
        qb = q_ptr + b * sqb + (h0 + offs_m)[:, None] * sqh + offs_d[None, :]
        offs_c = gl.arange(0, MQ, layout=gl.SliceLayout(0, mma_s))
        col_head = offs_c // NREP
        offs_ts = gl.arange(0, BLOCK_T, layout=gl.SliceLayout(1, mma_s))
        m_i = gl.full([MQ], float("-inf"), gl.float32, layout=gl.SliceLayout(0, mma_s))
        l_i = gl.zeros([MQ], gl.float32, layout=gl.SliceLayout(0, mma_s))
        acc = gl.zeros([RVP, MQ], gl.float32, layout=mma_s)
        if RVH > 0:
            acc_h = gl.zeros([RVH, MQ], gl.float32, layout=mma_s)
        zero_k = gl.zeros([BLOCK_T, QC], gl.float32, layout=mma_k)
        zero_s = gl.zeros([BLOCK_T, MQ], gl.float32, layout=mma_s)

        mbarrier.wait(bar_u, 0)
        for i in range(n_tiles):
            t0 = start + i * BLOCK_T
            # R(-t0)·q: the queries turned back by the tile start (its cos/sin from the host's table), read again
            # each tile so that nothing but the loop's state is held over it
            tsb = ts_ptr + (t0 // BLOCK_T) * HALF
            for c in gl.static_range(NC):
                q1 = gl.load(qb + c * QC, mask=mrow[:, None], other=0.0).to(gl.float32)
                q2 = gl.load(qb + HALF + c * QC, mask=mrow[:, None], other=0.0).to(gl.float32)
                cb = gl.load(tsb + c * QC + offs_d)[None, :]
                sb = gl.load(tsb + NT * HALF + c * QC + offs_d)[None, :]
                q_smem.index(c).store((q1 * cb + q2 * sb).to(dt))
                q_smem.index(NC + c).store((q2 * cb - q1 * sb).to(dt))
            fence_async_shared()
            sx = i % XS
            mbarrier.wait(bar_x.index(sx), (i // XS) & 1)
            xs = x_smem.index(sx)
            xs2 = x2_smem.index(sx)
            if XREG:  # the tile's key latents as the rebuild's register operand: read from shared memory once
                xa = xs.load(a_k)
                if RK2 > 0:  # noqa: SIM108 - a static branch
                    xa2 = xs2.load(a_k)
                else:  # never read (every use is under RK2 > 0)
                    xa2 = xa
                nxt = i + XS
                _load_boxes(zk_desc, zk2_desc, bar_x.index(sx), xs, xs2, row0 + nxt * BLOCK_T, koff, nxt < n_tiles,
                            RKP, RK2, XBYTES)  # fmt: skip
            else:
                xa = xs
                xa2 = xs2
            sc = zero_s
            ssq = gl.zeros([BLOCK_T], gl.float32, layout=gl.SliceLayout(1, mma_k))  # under HAS_NORM only
            for hj in range(G):
                sj = zero_s
                if HAS_NORM:
                    ssq = gl.zeros([BLOCK_T], gl.float32, layout=gl.SliceLayout(1, mma_k))
                for c in gl.static_range(NC):
                    # one column chunk of both key halves: the RoPE pairs (d, d + HALF) of d in the chunk
                    k1, k2 = _rebuild(xa, xa2, u_smem, u2_smem, hj, zero_k, c, QC, RK2)
                    k1, k2 = warpgroup_mma_wait(num_outstanding=0, deps=(k1, k2))
                    # the row's RMS scales its scores after the last chunk: RoPE and the dot are linear
                    r1, r2, ssq = _turned_keys(k1, k2, kb_ptr, kn_ptr, kvh0 + hj, cs_smem, ssq, offs_f, c, NC,
                                               QC, HALF, HAS_BIAS, HAS_NORM, mma_k, a_s, dt)  # fmt: skip
                    sj = warpgroup_mma(r1, q_smem.index(c).permute((1, 0)), sj)
                    sj = warpgroup_mma(r2, q_smem.index(NC + c).permute((1, 0)), sj)
                if HAS_NORM:
                    rn = gl.convert_layout(gl.rsqrt(ssq / (2 * HALF) + eps), gl.SliceLayout(1, mma_s))
                    sj = sj * rn[:, None]
                sc = gl.where((col_head == hj)[None, :], sj, sc)
            if not XREG:  # every product reading this key stage has completed: refill it XS tiles ahead
                nxt = i + XS
                _load_boxes(zk_desc, zk2_desc, bar_x.index(sx), xs, xs2, row0 + nxt * BLOCK_T, koff, nxt < n_tiles,
                            RKP, RK2, XBYTES)  # fmt: skip
            # online softmax (log2 units) over the tile's valid tokens
            tmask = (t0 + offs_ts) < end
            sc = gl.where(tmask[:, None], sc * qk_scale, float("-inf"))
            m_new = gl.maximum(m_i, gl.max(sc, axis=0))
            alpha = gl.exp2(m_i - m_new)
            p = gl.exp2(sc - m_new[None, :])
            l_i = l_i * alpha + gl.sum(p, axis=0)
            m_i = m_new
            p_smem.store(p.to(dt))
            fence_async_shared()
            sv = i % VS
            mbarrier.wait(bar_v.index(sv), (i // VS) & 1)
            acc = warpgroup_mma(v_smem.index(sv).permute((1, 0)), p_smem, acc * alpha[None, :])
            if RVH > 0:
                acc_h = warpgroup_mma(vh_smem.index(sv).permute((1, 0)), p_smem, acc_h * alpha[None, :])
            nxt = i + VS
            _load_boxes(zv_desc, zvh_desc, bar_v.index(sv), v_smem.index(sv), vh_smem.index(sv),
                        row0 + nxt * BLOCK_T, voff, nxt < n_tiles, RVP, RVH, VBYTES)  # fmt: skip

        for s in gl.static_range(XS):
            mbarrier.invalidate(bar_x.index(s))
        for s in gl.static_range(VS):
            mbarrier.invalidate(bar_v.index(s))
        # the partial outputs: value columns past the group's rank read the next group's latents, zeroed here
        vr = gl.load(vr_ptr + kvh0)
        offs_v = gl.arange(0, RVP, layout=gl.SliceLayout(1, mma_s))
        acc = gl.where(offs_v[:, None] < vr, acc, 0.0)
        cmask = offs_c < G * NREP
        rows = h0 + offs_c
        optr = o_ptr + b * sob + rows[None, :] * soh + split * sos + offs_v[:, None]
        gl.store(optr, acc, mask=cmask[None, :])
        if RVH > 0:  # the columns past 256, and zeros past them up to the output's width
            offs_h = gl.arange(0, RVH, layout=gl.SliceLayout(1, mma_s))
            acc_h = gl.where((RVP + offs_h)[:, None] < vr, acc_h, 0.0)
            optr_h = o_ptr + b * sob + rows[None, :] * soh + split * sos + offs_h[:, None]
            gl.store(optr_h + RVP, acc_h, mask=cmask[None, :])
            for z0 in gl.static_range(RVP + RVH, RVO, RVH):
                gl.store(optr_h + z0, gl.zeros([RVH, MQ], gl.float32, layout=mma_s), mask=cmask[None, :])
        mlp = ml_ptr + b * smb + rows * smh + split * 2
        gl.store(mlp, m_i, mask=cmask)
        gl.store(mlp + 1, l_i, mask=cmask)

    @gluon.jit
    def _gluon_flash_kernel(
        q_ptr,  # [B, H, HD] roped queries
        zk_desc, zk2_desc,  # descriptors of the key latents as [B*T, Σ r] rows, blocks [BLOCK_T, RKP] / [.., RK2]
        zv_desc, zvh_desc,  # and of the value latents, blocks [BLOCK_T, RVP] / [BLOCK_T, RVH]
        uk_desc, uk2_desc,  # of the up-projections as [KVH*HD, RK] rows, blocks [HALF, RKP] / [HALF, RK2]
        koff_ptr, voff_ptr, vr_ptr,  # [KVH] int32 key latent offset, value latent offset and rank of each KV head
        kb_ptr, kn_ptr,  # [KVH, HD] key bias, [HD] key RMSNorm weight (unused without HAS_BIAS / HAS_NORM)
        inv_ptr,  # [HD/2] fp32 rotary inverse frequencies
        ts_ptr,  # [2, NT, HD/2] fp32 cos and sin of the tile starts' angles (tile_starts)
        ti_ptr,  # [2, BLOCK_T, HD/2] fp32 cos and sin of the in-tile offsets' angles (tile_starts)
        len_ptr,  # [1] valid cached tokens
        o_ptr, ml_ptr,  # [B, H, WS*NSPLIT, RVO] fp32 partial outputs, [B, H, WS*NSPLIT, 2] running max (log2), sum
        sqb, sqh, T, NT, sob, soh, sos, smb, smh,
        KGROUPS, NSPLIT,
        qk_scale, rope_scale, eps,
        NREP: gl.constexpr, G: gl.constexpr, HALF: gl.constexpr, RKP: gl.constexpr, RK2: gl.constexpr,
        RVP: gl.constexpr, RVH: gl.constexpr, RVO: gl.constexpr, XBYTES: gl.constexpr, VBYTES: gl.constexpr,
        MQ: gl.constexpr, BLOCK_T: gl.constexpr, XS: gl.constexpr, VS: gl.constexpr,
        HAS_BIAS: gl.constexpr, HAS_NORM: gl.constexpr, QC: gl.constexpr, XREG: gl.constexpr,
        WS: gl.constexpr, WS_REGS: gl.constexpr, num_warps: gl.constexpr,
    ):  # fmt: skip
        dt: gl.constexpr = q_ptr.dtype.element_ty
        pid = gl.program_id(0)
        kvh0 = (pid % KGROUPS) * G
        NC: gl.constexpr = HALF // QC
        mma_k: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, QC, 16]
        )

        # shared memory: up-projections and the in-tile cos/sin (fp16, chunk by chunk: the low half's chunk c at c,
        # the high half's at NC + c), shared by the program's warpgroups; each one's key and value stages, turned
        # queries and probabilities
        u_smem = gl.allocate_shared_memory(dt, [2 * G, HALF, RKP], uk_desc.layout)
        if RK2 > 0:  # noqa: SIM108 - key ranks past a power of two: their columns in boxes of their own
            u2_smem = gl.allocate_shared_memory(dt, [2 * G, HALF, RK2], uk2_desc.layout)
        else:  # never read (every use is under RK2 > 0)
            u2_smem = u_smem
        cs_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_T, QC], gl.float16)
        cs_smem = gl.allocate_shared_memory(gl.float16, [2 * NC, BLOCK_T, QC], cs_layout)
        bar_u = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        # two warpgroups: the up-projections and cos/sin before they part (one: in _tiles, as its first loads go out)
        if WS == 2:
            mbarrier.init(bar_u, count=1)
            _load_up(uk_desc, uk2_desc, bar_u, u_smem, u2_smem, kvh0, G, HALF, RKP, RK2)
            _fill_cs(cs_smem, ti_ptr, rope_scale, BLOCK_T, QC, HALF, mma_k)

        descs = (zk_desc, zk2_desc, zv_desc, zvh_desc, uk_desc, uk2_desc)
        x_smem, x2_smem, v_smem, vh_smem, q_smem, p_smem, bar_x, bar_v = _own_smem(
            zk_desc, zk2_desc, zv_desc, zvh_desc, dt, RKP, RK2, RVP, RVH, MQ, BLOCK_T, XS, VS, QC, NC
        )
        smem = (u_smem, u2_smem, x_smem, x2_smem, v_smem, vh_smem, q_smem, cs_smem, p_smem)
        bars = (bar_u, bar_x, bar_v)
        ptrs = (koff_ptr, voff_ptr, vr_ptr, kb_ptr, kn_ptr, ts_ptr, ti_ptr, len_ptr, o_ptr, ml_ptr)
        strides = (sqb, sqh, T, NT, sob, soh, sos, smb, smh, KGROUPS, NSPLIT)
        if WS == 1:
            _tiles(q_ptr, descs, smem, bars, ptrs, strides, 0, qk_scale, rope_scale, eps, NREP, G, HALF, RKP, RK2,
                   RVP, RVH, RVO, XBYTES, VBYTES, MQ, BLOCK_T, XS, VS, HAS_BIAS, HAS_NORM, QC, XREG, WS,
                   num_warps)  # fmt: skip
            mbarrier.invalidate(bar_u)
        else:
            # two warpgroups, each with its own stages, share the up-projections: one's rebuild, RoPE and softmax
            # chain runs while the other's waits
            x_smem1, x2_smem1, v_smem1, vh_smem1, q_smem1, p_smem1, bar_x1, bar_v1 = _own_smem(
                zk_desc, zk2_desc, zv_desc, zvh_desc, dt, RKP, RK2, RVP, RVH, MQ, BLOCK_T, XS, VS, QC, NC
            )
            smem1 = (u_smem, u2_smem, x_smem1, x2_smem1, v_smem1, vh_smem1, q_smem1, cs_smem, p_smem1)
            bars1 = (bar_u, bar_x1, bar_v1)
            gl.warp_specialize(
                [(_tiles, (q_ptr, descs, smem, bars, ptrs, strides, 0, qk_scale, rope_scale, eps, NREP, G, HALF, RKP,
                           RK2, RVP, RVH, RVO, XBYTES, VBYTES, MQ, BLOCK_T, XS, VS, HAS_BIAS, HAS_NORM, QC, XREG, WS,
                           num_warps)),
                 (_tiles, (q_ptr, descs, smem1, bars1, ptrs, strides, 1, qk_scale, rope_scale, eps, NREP, G, HALF,
                           RKP, RK2, RVP, RVH, RVO, XBYTES, VBYTES, MQ, BLOCK_T, XS, VS, HAS_BIAS, HAS_NORM, QC, XREG,
                           WS, num_warps))],
                [num_warps], [WS_REGS],
            )  # fmt: skip


def compiled_kernel(
    k_group: int, n_rep: int, rk_max: int, rv_max: int, bias: bool = False, norm: bool = False, arch: int = 90
) -> Any:
    """The kernel as :func:`plan` launches it for key groups of ``k_group`` KV heads of ``n_rep`` query heads, bf16,
    compiled for ``sm_<arch>`` without a GPU (Triton's ``CompiledKernel``; :func:`gac.kernels.jit.cubin_resources`
    reads its registers, stack and shared memory)."""
    import inspect

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    fn = _gluon_flash_kernel
    params = list(inspect.signature(fn.fn).parameters)
    pl = plan(k_group, n_rep, rk_max, rv_max)
    if pl is None:
        raise ValueError(f"no launch fits key group {k_group} x {n_rep} at ranks {rk_max}/{rv_max}")

    def desc(block: list[int]) -> str:
        return f"tensordesc<bf16[{block[0]}, {block[1]}],{gl.NVMMASharedLayout.get_default_for(block, gl.bfloat16)!r}>"

    const = {**_constexprs(pl, n_rep, 64, bias, norm), "num_warps": pl.num_warps}
    descs = {k: desc(v) for k, v in _blocks(pl, 64).items()}
    ptrs = {"q_ptr": "*bf16", "koff_ptr": "*i32", "voff_ptr": "*i32", "vr_ptr": "*i32", "kb_ptr": "*bf16",
            "kn_ptr": "*bf16", "inv_ptr": "*fp32", "ts_ptr": "*fp32", "ti_ptr": "*fp32", "len_ptr": "*i32",
            "o_ptr": "*fp32", "ml_ptr": "*fp32"}  # fmt: skip
    floats = ("qk_scale", "rope_scale", "eps")
    sig = {
        p: "constexpr" if p in const else {**ptrs, **descs}.get(p, "fp32" if p in floats else "i32")
        for p in params
    }
    src = GluonASTSource(
        fn=fn,
        signature=sig,
        constexprs={(params.index(k),): v for k, v in const.items()},
        attrs={(i,): [["tt.divisibility", 16]] for i, p in enumerate(params) if p in ptrs},
    )
    return triton.compile(src, target=GPUTarget("cuda", arch, 32), options={"num_warps": pl.num_warps})


def _blocks(pl: Plan, half: int) -> dict[str, list[int]]:
    """The descriptors' boxes; a box not needed (``rk2`` or ``rvh`` 0) repeats the first one's."""
    bt = pl.block_t
    return {
        "zk_desc": [bt, pl.rk1], "zk2_desc": [bt, pl.rk2 or pl.rk1],
        "zv_desc": [bt, pl.rvl], "zvh_desc": [bt, pl.rvh or pl.rvl],
        "uk_desc": [half, pl.rk1], "uk2_desc": [half, pl.rk2 or pl.rk1],
    }  # fmt: skip


def _constexprs(pl: Plan, n_rep: int, half: int, bias: bool, norm: bool) -> dict[str, Any]:
    return dict(NREP=n_rep, G=pl.g, HALF=half, RKP=pl.rk1, RK2=pl.rk2, RVP=pl.rvl, RVH=pl.rvh, RVO=pl.rvo,
                XBYTES=2 * pl.block_t * (pl.rk1 + pl.rk2), VBYTES=2 * pl.block_t * (pl.rvl + pl.rvh), MQ=pl.mq,
                BLOCK_T=pl.block_t, XS=pl.xs, VS=pl.vs, HAS_BIAS=bias, HAS_NORM=norm, QC=pl.qc,
                XREG=pl.xreg, WS=pl.ws, WS_REGS=WS_REGS)  # fmt: skip


def _gl_dtype(dtype: torch.dtype) -> Any:
    return gl.bfloat16 if dtype == torch.bfloat16 else gl.float16


def descriptors(zk: torch.Tensor, zv: torch.Tensor, uk: torch.Tensor, pl: Plan) -> dict[str, Any]:
    """Tensor descriptors of the key and value latents (``[B*T, Σ r]`` rows) and the up-projections
    (``[KVH*HD, RK]`` rows) with the plan's boxes (:func:`_blocks`), by the kernel's argument names."""
    dt = _gl_dtype(zk.dtype)
    half = uk.shape[1] // 2
    src = {"zk": zk, "zv": zv, "uk": uk}

    def desc(x: torch.Tensor, block: list[int]) -> Any:
        x2 = x.reshape(-1, x.shape[-1])
        return TensorDescriptor(x2, list(x2.shape), list(x2.stride()), block,
                                gl.NVMMASharedLayout.get_default_for(block, dt))  # fmt: skip

    out: dict[str, Any] = {}
    made: dict[tuple, Any] = {}
    for name, block in _blocks(pl, half).items():
        key = (name[:2], *block)  # a box not needed repeats the first: one descriptor for both
        if key not in made:
            made[key] = desc(src[name[:2]], block)
        out[name] = made[key]
    return out


_TILE_STARTS: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}


def tile_starts(inv_freq: torch.Tensor, t: int, block_t: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The rotary tables of a ``t``-slot cache: ``[2, NT, HD/2]`` fp32 cos and sin of each tile start's angles
    ``k·block_t·inv_freq`` (``NT = ceil(t / block_t)``), and ``[2, block_t, HD/2]`` of the in-tile offsets'
    (evaluated in float64, once per frequencies and cache). In the kernel, sine and cosine of angles up to 32k
    compiled to their precise path (double-precision and local-memory instructions)."""
    key = (inv_freq.data_ptr(), inv_freq._version, inv_freq.device, int(t), int(block_t))
    if key not in _TILE_STARTS:
        nt = -(-int(t) // block_t)

        def table(pos: torch.Tensor) -> torch.Tensor:
            ang = pos.to(torch.float64)[:, None] * inv_freq.to(torch.float64)[None, :]
            return torch.stack([ang.cos(), ang.sin()]).to(torch.float32).contiguous()

        ar = torch.arange(max(nt, block_t), device=inv_freq.device)
        _TILE_STARTS[key] = (table(ar[:nt] * block_t), table(ar[:block_t]))
    return _TILE_STARTS[key]


def launch(
    q: torch.Tensor, zk: torch.Tensor, zv: torch.Tensor, uk: torch.Tensor, koff: torch.Tensor, voff: torch.Tensor,
    vr: torch.Tensor, k_bias: torch.Tensor | None, k_norm: torch.Tensor | None, inv_freq: torch.Tensor,
    cache_len: torch.Tensor, scale: float, rope_scale: float, eps: float, kvh: int, pl: Plan,
    part: torch.Tensor, ml: torch.Tensor,
) -> Any:  # fmt: skip
    """Fill ``part`` ``[B, H, NSPLIT, RVO]`` and ``ml`` ``[B, H, NSPLIT, 2]`` as the Triton flash kernel does, by the
    launch ``pl`` (:func:`refusal` must have passed; ``NSPLIT`` a multiple of its warpgroups ``pl.ws``, each of which
    fills a split). Returns the compiled kernel."""
    b, h, hd = q.shape
    d = descriptors(zk, zv, uk, pl)
    if part.shape[2] % pl.ws:
        raise ValueError(f"{part.shape[2]} splits for a launch of {pl.ws} warpgroups a program")
    splits = part.shape[2] // pl.ws
    ts, ti = tile_starts(inv_freq, zk.shape[1], pl.block_t)
    return _gluon_flash_kernel[(b * (kvh // pl.g), splits)](
        q, d["zk_desc"], d["zk2_desc"], d["zv_desc"], d["zvh_desc"], d["uk_desc"], d["uk2_desc"], koff, voff, vr,
        k_bias if k_bias is not None else uk, k_norm if k_norm is not None else uk,
        inv_freq, ts, ti, cache_len, part, ml,
        q.stride(0), q.stride(1), zk.shape[1], ts.shape[1],
        part.stride(0), part.stride(1), part.stride(2), ml.stride(0), ml.stride(1),
        kvh // pl.g, splits,
        float(scale) * 1.4426950408889634, float(rope_scale), float(eps),
        **_constexprs(pl, h // kvh, hd // 2, k_bias is not None, k_norm is not None), num_warps=pl.num_warps,
    )  # fmt: skip
