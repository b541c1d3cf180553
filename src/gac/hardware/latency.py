"""Per-grid-point latency model: predicted ms of one forward pass, kernel launch by kernel launch.

The inference sweep (:mod:`gac.eval.infer`) times prefill ``B x S`` and decode ``B x KV`` points
on its default path (q/k/v and gate/up fused by :mod:`gac.nn.fused`, ``torch.compile``,
one CUDA graph per step). This module predicts the same points from the model's structure and a
:class:`~gac.hardware.profile.Profile`, so that predicted and measured speedups can be put side
by side (``gac report``, ``benchmarks/tools/latency_model.py``; a recorded cell's structure is
rebuilt by :func:`gac.runtime.cells.cell_skeleton`).

The formula (every term below is one line of :func:`launches`)::

    ms(point) = sum over kernel launches of  fixed + max(flops / (peak x eff), bytes / BW)

* ``BW`` is the profile's ``copy_gbps`` (the weight-streaming bandwidth: the slope of the GEMV
  fit ``t = launch_us + bytes / BW``, :func:`fit_launch`); ``fixed`` is the profile's
  ``launch_us`` (that fit's intercept) for a GEMM and ``aux_us`` for any other kernel.
* **GEMMs**: every module that owns a 2-D ``weight`` (``nn.Linear``, a
  :class:`~gac.nn.fused.FusedInputProjection`, the factors inside a
  :class:`~gac.nn.FactorizedLinear`...) except the input embedding is one
  launch of ``[rows, k] @ [k, n]``: rows = ``B·S`` (prefill) or ``B`` (decode), and ``B`` for
  the output head (the sweep keeps only the last position's logits); a weight switched to the Triton
  decode GEMV (a ``gemv_table`` with a decision at these rows, :mod:`gac.runtime.gemv`) is priced at the
  profile's ``gemv_kernel`` fit of that row class where it has one. So a fused q/k/v group is
  one launch, a factorized layer two, a :class:`~gac.nn.fused.FusedSlice` of a factorized
  member one (its ``u``), a dense slice none; a site switched to the fused low-rank kernel
  (a ``lowrank_table`` recorded on it by :mod:`gac.runtime.lowrank_fused`, at the row classes the table
  names: :func:`gac.hardware.dispatch_table.choice`) is one launch for all
  its factors (:func:`_one_launch_sites`), priced with the kernel's own fit
  (``Profile.fused_lowrank``: fixed time and bandwidth) where the profile has one; the second
  factors of a group that runs them as parallel stream branches at these rows
  (a ``branch_table``, :mod:`gac.runtime.branches`) are one launch, their bytes summed
  (:func:`_branch_sites`).  The model reads only these tables, never a kernel file. FLOPs
  ``2·rows·k·n`` at the profile's peak slowed by :meth:`Profile.efficiency` of N (``lowrank_r``
  for the first factor of a low-rank pair, else ``gemm_n``) and of K (``gemm_k``), as
  :meth:`Profile.gemm_ms` does; bytes: the weight plus the activations in and out.
* **Attention**, per decoder layer (q/k widths read from the layer, so pruned heads count):
  prefill is one launch, timed from the profile's ``prefill_attention`` points where it has them
  (:meth:`Profile.prefill_attention_ms`: the compiled step's masked SDPA), else ``2·B·S²·q`` FLOPs (causal;
  ``sdpa_head_dim`` efficiency) reading Q, K, V and writing O; decode is three launches (``QKᵀ``, softmax, ``PV``: the grouped
  decode of :mod:`gac.kernels.attention`) reading the KV cache once. With ``gqa_decode=False``
  (transformers' ``repeat_kv``, cells recorded before it existed) the cache is read once,
  written ``n_rep`` times expanded and read expanded: ``(1 + 2·n_rep)`` times its bytes.
* **Latent attention** (PaLU's :class:`~gac.nn.latent.LatentAttention`): decode on the latent kernel
  is two launches, the split-KV kernel (latent cache bytes at the profile's ``latent_attention``
  bandwidth plus the key rebuild's FLOPs at its rate, :func:`latent_call`) and the combine, with no
  key up-projection GEMM; where the profile has no such class, its roofline, named in
  :func:`predict`'s record (:func:`latent_note`). A layer the kernel cannot serve rebuilds K and V
  as GEMMs over the cache, then attends as dense; prefill rebuilds them over ``B·S`` rows.
* **Other kernels** (norms with their residual adds, rotary embedding and cache writes,
  the activation, position bookkeeping): :data:`AUX_PER_LAYER` per layer plus
  :data:`AUX_PER_STEP` per forward, counted from the committed kernel trace of one compiled
  decode step (``benchmarks/results/h200/decode-diag/diag.json``: 100 non-GEMM kernels for 8 layers),
  each ``aux_us`` plus its share of the activation bytes (two norms with residual:
  ``8·T·H``; rotary: ``2·T·(q+kv)``; gated activation ``3·T·I``; cache write ``2·T·kv``;
  elements of the model's dtype).

* **Split-K reductions**: a GEMM run by cuBLAS (not the Triton GEMV or the fused low-rank kernel) whose
  output has few tiles for its K (:func:`splits_k`) is followed by cuBLAS's reduction kernel, priced as an
  ``aux`` launch over its fp32 partials (:func:`_reduce_launch`). At one row they sit inside the launch fit.

* **Bias copies**: a compiled biased cuBLAS GEMM whose output row Inductor pads (:func:`bias_copied`)
  runs after a copy of its broadcast bias into the output, one ``aux`` launch.

What it leaves out, on purpose: the Triton GEMV where the profile has no ``gemv_kernel`` fit, L2 reuse,
overlap. Measured agreement
on the H200: ``docs/eval.md`` and ``benchmarks/results/h200/decode-diag/latency_model.md``.
"""

from __future__ import annotations

import logging
import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from gac.errors import GacError
from gac.hardware.dispatch_table import choice, row_class
from gac.hardware.profile import Profile, load_profile
from gac.utils import parse_dtype

# torch, gac.nn, gac.models and gac.runtime are imported inside the functions that walk a model: this
# module stays torch-free to import (gac.allocation, pure numpy, prices with its Point)

log = logging.getLogger(__name__)

#: non-GEMM kernels per decoder layer and per forward (compiled decode step of the dense
#: Llama-3-8B shape on the H200: 100 = 8 x 11 + 12; ``diag.json`` ``models.dense.trace``).
AUX_PER_LAYER = 11
AUX_PER_STEP = 12


@dataclass(frozen=True)
class Point:
    """One grid point of the inference sweep: prefill ``batch x seq`` or decode ``batch x kv``."""

    phase: str
    batch: int
    seq: int = 0
    kv: int = 0

    def __post_init__(self) -> None:
        if self.phase not in ("prefill", "decode"):
            raise GacError(f"unknown phase {self.phase!r}: prefill or decode")
        if (
            self.batch < 1
            or (self.phase == "prefill" and self.seq < 1)
            or (self.phase == "decode" and self.kv < 1)
        ):
            raise GacError(f"bad grid point {self}")

    @property
    def tokens(self) -> int:
        """Rows of every projection GEMM: ``B·S`` (prefill) or ``B`` (decode)."""
        return self.batch * self.seq if self.phase == "prefill" else self.batch

    @property
    def key(self) -> str:
        """``prefill_b8_s2048`` / ``decode_b1_kv512`` (as :func:`gac.plans.report.point_key`)."""
        if self.phase == "prefill":
            return f"prefill_b{self.batch}_s{self.seq}"
        return f"decode_b{self.batch}_kv{self.kv}"

    @classmethod
    def from_record(cls, r: dict[str, Any]) -> Point:
        """The point of one ``gac.infer/1`` prefill or decode record."""
        if r["phase"] == "prefill":
            return cls("prefill", int(r["batch"]), seq=int(r["seq"]))
        return cls("decode", int(r["batch"]), kv=int(r["kv"]))


#: KV length of a decode serving shape given without one (``decode:16``): the speed grid's shorter
#: KV point, where the projections' share of a step (and so the effect of factorizing) is largest.
DEFAULT_DECODE_KV = 512

#: a rebuilt-key site (PaLU's key groups) keeps more than this share of its width only where that rank's decode
#: attention is predicted no slower than its keys cached raw (:func:`gac.allocation.strategies.raw_key_candidates`)
RAW_KEY_SHARE = 7 / 8

#: The serving shapes a compressed model is guarded at unless told otherwise: the grid users run.
DEFAULT_SERVE = (
    "prefill:1x128,prefill:1x512,prefill:1x2048,prefill:8x128,prefill:8x512,prefill:8x2048,"
    "decode:1,decode:16,decode:64"
)


def parse_serve(spec: str | list[str] | tuple[str, ...] | None) -> list[Point]:
    """Serving shapes from ``prefill:BxS`` and ``decode:B[xKV]`` items, comma-separated (None: the default).

    A decode item without a KV length decodes at :data:`DEFAULT_DECODE_KV` cached tokens.

    >>> [p.key for p in parse_serve("prefill:1x128, decode:16, decode:1x4096")]
    ['prefill_b1_s128', 'decode_b16_kv512', 'decode_b1_kv4096']
    >>> parse_serve("prefill:1")
    Traceback (most recent call last):
    ...
    gac.errors.GacError: serving shape 'prefill:1' is not prefill:BxS (e.g. prefill:8x2048)
    """
    if spec is None:
        spec = DEFAULT_SERVE
    items = [x.strip() for x in (spec.split(",") if isinstance(spec, str) else spec)]
    if not items or not all(items):
        raise GacError(
            f"--serve {spec!r} names no serving shape in some item; give e.g. prefill:1x128,decode:16"
        )
    out: list[Point] = []
    for it in items:
        phase, _, dims = it.partition(":")
        phase = phase.strip().lower()
        nums = dims.strip().lower().split("x")
        if phase not in ("prefill", "decode") or not all(n.isdigit() and int(n) > 0 for n in nums):
            raise GacError(
                f"serving shape {it!r} is not prefill:BxS or decode:B[xKV] with positive integers "
                "(e.g. prefill:8x2048,decode:16)"
            )
        if phase == "prefill":
            if len(nums) != 2:
                raise GacError(f"serving shape {it!r} is not prefill:BxS (e.g. prefill:8x2048)")
            p = Point("prefill", int(nums[0]), seq=int(nums[1]))
        else:
            if len(nums) > 2:
                raise GacError(f"serving shape {it!r} is not decode:B or decode:BxKV (e.g. decode:16x4096)")
            p = Point("decode", int(nums[0]), kv=int(nums[1]) if len(nums) == 2 else DEFAULT_DECODE_KV)
        if p in out:
            raise GacError(f"serving shape {it!r} is listed twice")
        out.append(p)
    return out


def serve_str(points: list[Point]) -> str:
    """The ``--serve`` spelling of ``points`` (round-trips through :func:`parse_serve`).

    >>> serve_str(parse_serve("prefill:8x2048,decode:16"))
    'prefill:8x2048,decode:16x512'
    """
    return ",".join(
        f"prefill:{p.batch}x{p.seq}" if p.phase == "prefill" else f"decode:{p.batch}x{p.kv}" for p in points
    )


def check_context(points: list[Point], max_context: int | None) -> None:
    """Refuse a serving shape longer than the model's context (prefill ``S``, decode ``KV + 1``)."""
    if not max_context:
        return
    for p in points:
        n = p.seq if p.phase == "prefill" else p.kv + 1
        if n > max_context:
            raise GacError(
                f"serving shape {serve_str([p])} needs {n} positions, beyond the model's maximum context "
                f"of {max_context}"
            )


@dataclass
class Launch:
    """One kernel launch as the model prices it."""

    kind: str  # gemm | head | attention | aux
    name: str
    flops: float
    bytes: float
    fixed_us: float
    flop_ms: float
    byte_ms: float
    #: the FLOP time adds to the byte time instead of hiding under it (the latent decode kernel's
    #: fitted form, :func:`latent_call`)
    serial: bool = False

    @property
    def ms(self) -> float:
        work = self.flop_ms + self.byte_ms if self.serial else max(self.flop_ms, self.byte_ms)
        return self.fixed_us * 1e-3 + work

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ms": self.ms}


# ------------------------------------------------------------------------------ fitting
def fit_launch(
    nbytes: list[float] | np.ndarray, us: list[float] | np.ndarray, relative: bool = True
) -> tuple[float, float]:
    """Least-squares fit of ``t_us = t0_us + bytes / BW`` over GEMV timings; returns ``(t0_us, BW GB/s)``.

    With ``relative`` (the default) each timing is weighted by ``1 / t``, so the fit minimizes
    relative error: the guard compares small second GEMMs (a few MB) against dense weights, and an
    unweighted fit over six shapes of 2 MB to 1 GB lets the largest set the intercept (on an H100 it
    put a 2 MB GEMV 37% under its measured time, 7% weighted: the points in
    ``src/gac/profiles/h100-bfloat16.json``). The shipped H200 profiles were fitted unweighted over
    21 shapes, where weighting moves the constants by under 3% (5.045 to 5.071 us).

    >>> fit_launch([1e6, 1e7, 1e8], [5.0 + 1e6 / 4e6, 5.0 + 1e7 / 4e6, 5.0 + 1e8 / 4e6])
    (5.0, 4000.0)
    """
    x = np.asarray(nbytes, dtype=np.float64)
    y = np.asarray(us, dtype=np.float64)
    if x.shape != y.shape or x.size < 2 or np.ptp(x) <= 0:
        raise GacError("the launch fit needs at least two timings of different sizes")
    slope, t0 = np.polyfit(x, y, 1, w=1.0 / y if relative else None)
    if slope <= 0:
        raise GacError("the launch fit found no positive bandwidth (time does not grow with bytes)")
    gbps = 1.0 / slope / 1e3  # bytes per us -> GB/s
    return round(float(t0), 4), round(float(gbps), 1)


def fit_fused_lowrank(records: list[dict[str, Any]], source: str) -> dict[str, Any]:
    """A profile's ``fused_lowrank`` entry from fused low-rank dispatch measurements at one token row.

    ``records`` are :func:`gac.kernels.lowrank_fused.measure_site` results (``bytes``, ``fused_us``,
    ``use``); ``t = launch_us + bytes / gbps`` is fitted (:func:`fit_launch`) over the shapes where
    the kernel won its dispatch, the only ones the inference path runs it at.  Fewer than two
    winners: ``{}`` (the kernel is not faster on this GPU; nothing is assumed).
    """
    won = [r for r in records if r.get("rows", 1) == 1 and r.get("use") and r.get("fused_us")]
    if len(won) < 2 or len({r["bytes"] for r in won}) < 2:
        return {}
    t0, gbps = fit_launch([r["bytes"] for r in won], [r["fused_us"] for r in won])
    return {
        "launch_us": t0,
        "gbps": gbps,
        "rows": [1],
        "fit": {
            "source": source,
            "method": "least squares t = launch_us + weight bytes / gbps over the fused low-rank kernel's best "
            "time at 1 token row (64 calls per CUDA graph over weights rotated past L2), over the site shapes "
            "where it beat the two-launch path (the ones the dispatch runs it at)",
            "points": len(won),
            "of": len(records),
            "bytes_range": [min(r["bytes"] for r in won), max(r["bytes"] for r in won)],
        },
    }


def fit_gemv_kernel(records: list[dict[str, Any]], source: str) -> dict[str, Any]:
    """A profile's ``gemv_kernel`` entry from Triton GEMV dispatch measurements (:func:`gac.kernels.gemv.measure_shape`
    records: ``rows``, ``bytes``, ``triton_us``, ``use``): per row class, ``t = launch_us + bytes / gbps`` fitted
    (:func:`fit_launch`) over the shapes where the kernel won its dispatch, the only ones the inference path runs
    it at. A row class with fewer than two winners of different sizes gets no row; none at all: ``{}``."""
    rows: dict[str, Any] = {}
    for c in sorted({int(r["rows"]) for r in records}):
        won = [r for r in records if int(r["rows"]) == c and r.get("use") and r.get("triton_us")]
        if len({r["bytes"] for r in won}) < 2:
            continue
        t0, gbps = fit_launch([r["bytes"] for r in won], [r["triton_us"] for r in won])
        rows[str(c)] = {"launch_us": t0, "gbps": gbps, "points": len(won),
                        "of": sum(int(r["rows"]) == c for r in records)}  # fmt: skip
    if not rows:
        return {}
    return {
        "rows": rows,
        "fit": {
            "source": source,
            "method": "per row class, least squares t = launch_us + weight bytes / gbps over the Triton GEMV's best "
            "time (64 calls per CUDA graph over weights rotated past L2) at the shapes where it beat cuBLAS",
            "records": [
                {k: r.get(k) for k in ("n", "k", "rows", "bytes", "cublas_us", "triton_us", "use")}
                for r in records
            ],  # fmt: skip
        },
    }


# ------------------------------------------------------------------------------- structure
def _layer_dims(layer: Any, config: Any, hidden: int) -> dict[str, int]:
    """Widths of one decoder layer: ``q`` and ``kv`` features, head dim, MLP width ``inter``."""
    from gac.models.adapters import ATTN_NAMES, MLP_NAMES, ROLE_NAMES, find_child

    heads = int(getattr(config, "num_attention_heads", 1) or 1)
    kvh = int(getattr(config, "num_key_value_heads", None) or heads)
    hd = int(getattr(config, "head_dim", None) or hidden // heads)
    attn_name = find_child(layer, ATTN_NAMES, "attention")
    attn = getattr(layer, attn_name) if attn_name else None
    q, kv = heads * hd, kvh * hd
    if attn is not None:
        hd = int(getattr(attn, "head_dim", None) or hd)

        def width(role: str) -> int | None:
            for n in ROLE_NAMES[role]:
                m = getattr(attn, n, None)
                if m is not None and getattr(m, "out_features", None):
                    return int(m.out_features)
            return None

        wq, wk, wqkv = width("q"), width("k"), width("qkv")
        if wq and wk:
            q, kv = wq, wk
        elif wqkv:
            q = wqkv * heads // (heads + 2 * kvh)
            kv = (wqkv - q) // 2
    inter = int(getattr(config, "intermediate_size", 4 * hidden) or 4 * hidden)
    mlp_name = find_child(layer, MLP_NAMES, "mlp")
    mlp = getattr(layer, mlp_name) if mlp_name else None
    if mlp is not None:
        for n in ROLE_NAMES["down"]:
            m = getattr(mlp, n, None)
            if m is not None and getattr(m, "in_features", None):
                inter = int(m.in_features)
                break
    return {"q": q, "kv": kv, "head_dim": hd, "inter": inter}


def _layers(model: Any) -> list[Any]:
    from gac.models.adapters import find_layers

    try:
        return list(model.get_submodule(find_layers(model)))
    except (GacError, AttributeError):
        return []


# ---------------------------------------------------------------------------------- model
def constants(profile: Profile) -> dict[str, float]:
    """``launch_us``, ``aux_us`` and ``copy_gbps`` of ``profile`` (documented defaults if absent)."""
    return {"launch_us": profile.launch_us_or_default, "aux_us": profile.aux_us_or_default,
            "copy_gbps": profile.copy_gbps_or_default}  # fmt: skip


def launches(
    model: Any, profile: Profile, point: Point, gqa_decode: bool = True, compiled: bool = True
) -> list[Launch]:
    """Every kernel launch of one forward pass of ``model`` at ``point``, priced (see the module doc).

    ``compiled``: the step runs through ``torch.compile`` (the sweep's default on CUDA), whose
    Inductor pads a GEMM's dims to its alignment (8 elements of 2 bytes, 4 of 4 bytes) wherever
    padding benchmarks faster; a GEMM is then priced at its padded dims (:func:`padded`).
    """
    from torch import nn

    from gac.nn import FactorizedLinear
    from gac.nn.latent import LatentAttention, LatentProjection

    c = constants(profile)
    bw = c["copy_gbps"] * 1e9  # bytes/s
    launch_us, aux_us = c["launch_us"], c["aux_us"]
    peak = profile.peak_tflops()
    emb = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    first_stage = set()
    for m in model.modules():
        if isinstance(m, FactorizedLinear):
            first_stage.add(id(m.v))
        elif isinstance(m, LatentProjection):
            first_stage.add(id(m.down))
    t = point.tokens
    lat_layers = {
        i: _LatentLayer.of(a) for i, a in enumerate(_attentions(model)) if isinstance(a, LatentAttention)
    }
    idle = {id(u) for x in lat_layers.values() for u in x.idle(point)}  # priced below or never run
    merged = _one_launch_sites(model, t)
    fused_names = set(merged.values())
    merged = {**_branch_sites(model, t), **merged}  # the fused kernel's sites take precedence
    out: list[Launch] = []
    keys: list[str | None] = []
    elem = 2
    for name, mod in model.named_modules():
        w = mod._parameters.get("weight")
        if w is None or w.ndim != 2 or mod is emb or isinstance(mod, nn.Embedding) or id(mod) in idle:
            continue
        elem = w.element_size()
        k = int(getattr(mod, "in_features", None) or w.shape[1])
        n = int(w.shape[0]) if not hasattr(mod, "out_features") else int(mod.out_features)
        rows = point.batch if mod is head else t
        kinds = getattr(mod, "kinds", None)  # a fused group: first stages of factorized members
        low = id(mod) in first_stage or (kinds is not None and "factorized" in kinds)
        x = _gemm_launch(profile, rows, k, n, low, compiled, elem, peak, bw, launch_us)
        x.kind, x.name = "head" if mod is head else "gemm", name or "model"
        gv = None if id(mod) in merged else choice(getattr(mod, "gemv_table", None), rows)
        fit = profile.gemv_kernel_at(row_class(rows, mod.gemv_table) or 0) if gv is not None else None
        if fit is not None:  # the Triton GEMV runs this weight at these rows: its own fit
            x.fixed_us, x.byte_ms, x.flop_ms = fit[0], x.bytes / (fit[1] * 1e9) * 1e3, 0.0
        out.append(x)
        keys.append(merged.get(id(mod)))
        cublas = gv is None and rows > 1 and id(mod) not in merged  # one row: inside the launch fit
        if cublas and splits_k(rows, k, n):  # cuBLAS's split-K reduction
            out.append(_reduce_launch(x.name, rows, n, elem, aux_us, bw))
            keys.append(None)
        if cublas and compiled and getattr(mod, "bias", None) is not None and bias_copied(n, elem):
            nbytes = float(rows * n * elem)  # the bias broadcast into the output
            out.append(Launch("aux", f"{x.name}.bias_copy", 0.0, nbytes, aux_us, 0.0, nbytes / bw * 1e3))
            keys.append(None)
    out = _merge(out, keys)
    fused = profile.fused_lowrank_at(t)
    if fused is not None:  # the kernel's own fit for its launches, where the profile has one
        for x in out:
            if x.name in fused_names:
                x.fixed_us, x.byte_ms = fused[0], x.bytes / (fused[1] * 1e9) * 1e3
    cfg = getattr(model, "config", None)
    hidden = int(emb.weight.shape[1]) if emb is not None else int(getattr(cfg, "hidden_size", 0) or 0)
    layers = _layers(model)
    sdpa_eff_op = "sdpa_head_dim" if "sdpa_head_dim" in profile.ops else None
    for i, layer in enumerate(layers):
        d = _layer_dims(layer, cfg, hidden)
        q, kv, hd, inter = d["q"], d["kv"], d["head_dim"], d["inter"]
        lat = lat_layers.get(i)
        if lat is not None and point.phase == "decode":  # PaLU: the latent kernel, or the rebuild
            out += lat.decode_launches(profile, point, i, elem, peak, compiled)
        elif lat is not None:
            out += lat.rebuild_launches(profile, point.tokens, i, elem, peak, compiled, per_group=False)
        if lat is not None and point.phase == "decode" and lat.path == "kernel":
            pass  # the kernel is the layer's attention: no dense cache read, no softmax launch
        elif point.phase == "prefill":
            b, s = point.batch, point.seq
            flops = 2.0 * b * s * s * q
            eff = profile.efficiency(sdpa_eff_op, hd) if sdpa_eff_op else 1.0
            nbytes = float(b * s * (2 * q + 2 * kv) * elem)
            measured = profile.prefill_attention_ms(b, s, q, hd)
            if measured is not None:  # timed as the compiled step runs it: its launch included
                out.append(Launch("attention", f"layer{i}.attention", flops, nbytes, 0.0, measured, 0.0))
            else:
                out.append(Launch("attention", f"layer{i}.attention", flops, nbytes, launch_us,
                                  flops / (peak * 1e12 * eff) * 1e3, nbytes / bw * 1e3))  # fmt: skip
        else:
            b, n_kv = point.batch, point.kv
            cache = float(b * n_kv * 2 * kv * elem)
            n_rep = max(q // max(kv, 1), 1)
            reads = cache if gqa_decode else cache * (1 + 2 * n_rep)
            flops = 4.0 * b * n_kv * q
            for j, share in enumerate((0.5, 0.5)):  # QK^T reads K, PV reads V
                out.append(Launch("attention", f"layer{i}.attention.{'qk' if j == 0 else 'pv'}", flops / 2,
                                  reads * share, launch_us, 0.0, reads * share / bw * 1e3))  # fmt: skip
            scores = float(b * (q // max(hd, 1)) * n_kv * 4 * 2)  # fp32 scores in and out
            out.append(Launch("aux", f"layer{i}.softmax", 0.0, scores, aux_us, 0.0, scores / bw * 1e3))
        act = float(t * (8 * hidden + 2 * (q + kv) + 3 * inter + 2 * kv) * elem)
        n_aux = AUX_PER_LAYER - (1 if point.phase == "decode" else 0)  # the softmax is counted above
        for j in range(n_aux):
            out.append(
                Launch("aux", f"layer{i}.aux{j}", 0.0, act / n_aux, aux_us, 0.0, act / n_aux / bw * 1e3)
            )
    glob = float(t * hidden * 4 * elem)  # embedding gather, final norm
    for j in range(AUX_PER_STEP):
        out.append(Launch("aux", f"step.aux{j}", 0.0, glob / AUX_PER_STEP, aux_us, 0.0,
                          glob / AUX_PER_STEP / bw * 1e3))  # fmt: skip
    return out


#: cuBLAS splits K (a second kernel reduces the fp32 partial sums) where the output has fewer 128 x 128
#: tiles than ``K / SPLIT_K_PER_TILE``: 227 of 245 plain bf16 GEMMs on an H100 (M 16-2048, K 4096-18944,
#: N 1024-4096; ``benchmarks/results/h100/latency-fields/splitk/``), and every split of the traced steps
#: (``benchmarks/results/h100/svdllm-trace/``)
SPLIT_K_PER_TILE = 240
#: bytes per output element the reduction moves: two fp32 partial slices read, the output written
#: (fitted: 1.6 us + 11 bytes per element at the copy bandwidth, within 6% at the median of 117 reductions)
SPLIT_K_REDUCE_BYTES = 8


def splits_k(rows: int, k: int, n: int, tile: int = 128) -> bool:
    """Whether cuBLAS runs the ``[rows, k] @ [k, n]`` GEMM split over K, with a reduction kernel after it.

    >>> splits_k(512, 18944, 2304), splits_k(512, 14336, 2288), splits_k(128, 14336, 4096), splits_k(512, 4096, 4096)
    (True, False, True, False)
    """
    return k >= SPLIT_K_PER_TILE * (-(-rows // tile)) * (-(-n // tile))


#: Inductor pads the row stride of a GEMM output held inside the compiled graph to this many bytes where the
#: stride is over :data:`PAD_STRIDE_THRESHOLD` elements (``torch._inductor.config.comprehensive_padding``,
#: ``padding_alignment_bytes``, ``padding_stride_threshold``)
PAD_ALIGN_BYTES = 128
PAD_STRIDE_THRESHOLD = 1024


def bias_copied(n: int, elem: int = 2) -> bool:
    """Whether a compiled step runs a biased ``[rows, k] @ [k, n]`` GEMM as a copy of the broadcast bias
    into the output and a GEMM that accumulates onto it, rather than with the bias in cuBLASLt's epilogue.

    Inductor pads the output's row stride (:data:`PAD_ALIGN_BYTES`); a padded output is not contiguous,
    and ATen's ``addmm`` takes the epilogue only for a contiguous one. Traced on an H100: the fused q/k/v
    first stage of the Qwen2.5-7B shape at SVD-LLM 23% (``n`` 2416) ran ``direct_copy`` then a ``badd``
    kernel in each layer, the dense one (``n`` 4608) neither (``benchmarks/results/h100/svdllm-trace/``).

    >>> bias_copied(2416), bias_copied(4608), bias_copied(512), bias_copied(1400, 4)
    (True, False, False, True)
    """
    align = max(PAD_ALIGN_BYTES // max(elem, 1), 1)
    return n > PAD_STRIDE_THRESHOLD and n % align != 0


def _reduce_launch(name: str, rows: int, n: int, elem: int, aux_us: float, bw: float) -> Launch:
    """The split-K reduction after GEMM ``name`` (:func:`splits_k`): fp32 partials in, the output out."""
    nbytes = float(rows * n * (SPLIT_K_REDUCE_BYTES + elem))
    return Launch("aux", f"{name}.splitk_reduce", 0.0, nbytes, aux_us, 0.0, nbytes / bw * 1e3)


def _gemm_launch(
    profile: Profile,
    rows: int,
    k: int,
    n: int,
    low: bool,
    compiled: bool,
    elem: int,
    peak: float,
    bw: float,
    launch_us: float,
) -> Launch:
    """One ``[rows, k] @ [k, n]`` GEMM launch priced as :func:`launches` prices it (see the module doc).

    ``low``: the first factor of a low-rank pair (``lowrank_r`` efficiency of N); ``compiled``: at Inductor's
    padded dims (:func:`padded`); ``peak`` (TFLOP/s), ``bw`` (bytes/s), ``launch_us``: the profile's, as
    :func:`launches` resolved them.
    """
    op = "lowrank_r" if low and "lowrank_r" in profile.ops else "gemm_n"
    kp, np_ = (padded(k, elem), padded(n, elem)) if compiled else (k, n)
    eff = profile.efficiency(op, np_) * (profile.efficiency("gemm_k", kp) if "gemm_k" in profile.ops else 1.0)
    nbytes = float((k * n + rows * (k + n)) * elem)
    flop_ms = 2.0 * rows * kp * np_ / (peak * 1e12 * eff) * 1e3
    return Launch("gemm", "", 2.0 * rows * k * n, nbytes, launch_us, flop_ms, nbytes / bw * 1e3)


# ------------------------------------------------------------------- latent attention (PaLU)
#: the most query heads one program of the latent decode kernel scores (its ``MAX_GROUP_HEADS``)
LATENT_MAX_GROUP_HEADS = 64
#: what :func:`latent_note` has warned about (once per process)
_LATENT_WARNED: set[str] = set()


def latent_rank(rates: dict[str, Any], rank: int) -> int:
    """The key rank the decode kernel rebuilds at: ``rank`` rounded up to ``rank_round`` (the packed
    up-projection's width) and then to the rank tile ``block_r`` its launch ran for this key group
    size (:meth:`Profile.latent_rates`; the roofline pads nothing).

    >>> latent_rank({"rank_round": 32, "block_r": 128}, 56)
    128
    >>> latent_rank({"rank_round": 32, "block_r": 64}, 72)
    128
    >>> latent_rank({"rank_round": 1, "block_r": 1}, 72)
    72
    """
    step = max(int(rates.get("rank_round") or 1), 1)
    block = max(int(rates.get("block_r") or 1), 1)
    r = -(-int(rank) // step) * step
    return -(-r // block) * block


def site_modulus(profile: Profile, site: Any) -> int:
    """The modulus a site's kept dims align to on ``profile``: its operator class's
    (:meth:`Profile.modulus`), and for a rebuilt-key site (PaLU's key groups,
    ``meta["rebuild_flops_per_dim_per_cached_token"]``) that wider than one rank tile, the least common
    multiple with the decode kernel's rank tile (:meth:`Profile.key_rank_tile`), so that ``--align gac`` offers key
    ranks the kernel runs whole. Value groups, never rebuilt, keep their projection's modulus.

    >>> from gac.hardware.profile import default_profile
    >>> from gac.sites import Site
    >>> s = Site("k:g0", "lowrank_r", max_dim=512, unit_cost=1, dense_cost=512,
    ...          meta={"rebuild_flops_per_dim_per_cached_token": 1024, "key_group": 4})
    >>> site_modulus(default_profile("bfloat16"), s)
    8
    """
    m = profile.modulus(site.op)
    meta = getattr(site, "meta", None) or {}
    if meta.get("rebuild_flops_per_dim_per_cached_token"):
        g = int(meta.get("key_group") or meta.get("group_kv") or 1)
        m = profile.key_rank_modulus(m, g, int(meta.get("query_rows") or 0), site.max_dim)
    return m


def latent_call(
    profile: Profile,
    batch: int,
    kv: int,
    head_dim: int,
    key_group: int,
    key_ranks: list[int],
    value_ranks: list[int],
    elem: int = 2,
    raw: bool = False,
    n_rep: int = 0,
    value_group: int = 0,
) -> dict[str, Any]:
    """One latent decode attention call (one layer, one new token per sequence), priced on ``profile``.

    ``raw``: the layer's keys are cached raw (every key group at full width,
    :func:`gac.nn.latent.raw_key_groups`): nothing is rebuilt and the call reads its cache at the copy
    bandwidth, as dense decode attention does (on an H100 the raw-key launch ran 0.96-1.85x dense decode
    attention at the first layer of the Llama-3-8B and Qwen2.5-7B shapes, ``benchmarks/results/h100/palu-kernel/v9/``).

    ``bytes``: the latent cache read, ``batch·kv·(Σ r_k + n·Σ r_v)·elem``, where each value latent is read ``n``
    times (:func:`value_reads` of ``key_group`` and ``value_group``, the layer's value group size; 0: as the keys). ``flops``: the key rebuild,
    ``2·batch·kv·head_dim·G·r`` per key group of ``G`` KV heads at the rank ``r`` the kernel runs
    (:func:`latent_rank`: on a measured class every group at the layer's widest, padded to the rank
    tile, as the kernel's one ``RK`` tile does; at the roofline each group's own rank). ``ms`` =
    ``launch_us + bytes / gbps + flops / tflops`` with the rates of the key group size on a measured
    class (:meth:`Profile.latent_rates`; the form the class was fitted in,
    :func:`fit_latent_attention`; ``tflops`` None adds nothing), and at the roofline
    ``launch_us + max(bytes / copy bandwidth, flops / peak)`` (a perfect kernel hides the lesser
    under the greater). ``n_rep``: query heads a KV head, so that a key group of more query rows than
    the class's ``wide.rows_over`` takes its ``wide`` rows (:meth:`Profile.latent_rates`; 0: the class's own).
    Returns those terms, ``ms``, ``serial`` (whether the terms add) and ``rates``.
    """
    rates = profile.latent_rates(key_group, key_group * n_rep)
    n_k = len(key_ranks)
    if raw:
        nbytes = float(batch * kv * (sum(key_ranks) + sum(value_ranks)) * elem)
        byte_ms = nbytes / (profile.copy_gbps_or_default * 1e9) * 1e3
        return {"bytes": nbytes, "flops": 0.0, "byte_ms": byte_ms, "flop_ms": 0.0, "serial": False,
                "ms": float(rates["launch_us"]) * 1e-3 + byte_ms, "rates": rates}  # fmt: skip
    if rates["source"] == "measured":
        run = [latent_rank(rates, max(key_ranks))] * n_k
    else:
        run = [latent_rank(rates, r) for r in key_ranks]
    nbytes = float(
        batch * kv * (sum(key_ranks) + value_reads(key_group, value_group) * sum(value_ranks)) * elem
    )
    flops = 2.0 * batch * kv * head_dim * key_group * sum(run)
    byte_ms = nbytes / (float(rates["gbps"]) * 1e9) * 1e3
    tf = rates.get("tflops")
    flop_ms = flops / (float(tf) * 1e12) * 1e3 if tf else 0.0
    serial = rates["source"] == "measured"
    work = byte_ms + flop_ms if serial else max(byte_ms, flop_ms)
    return {"bytes": nbytes, "flops": flops, "byte_ms": byte_ms, "flop_ms": flop_ms, "serial": serial,
            "ms": float(rates["launch_us"]) * 1e-3 + work, "rates": rates}  # fmt: skip


def value_reads(key_group: int, value_group: int) -> int:
    """How many times the latent kernel reads each value latent: once per program of a key group, so a value
    group of ``value_group`` KV heads is read by each of the ``value_group / key_group`` key groups inside it
    (once where the values are grouped as the keys, or narrower; ``value_group`` 0: as the keys).

    >>> value_reads(2, 4), value_reads(4, 4), value_reads(4, 2), value_reads(1, 4), value_reads(2, 0)
    (2, 1, 1, 4, 1)
    """
    return max(1, int(value_group) // max(1, int(key_group)))


def site_cache_ms(profile: Profile, site: Any, d: int, batch: int, kv: int, elem: int = 2) -> float:
    """The attention-side ms of one PaLU site (a key or value group of one layer) at kept dim ``d``,
    for a decode step of ``batch`` sequences over ``kv`` cached tokens (0 at prefill, where ``kv`` is
    0, and for any other site).

    A dense site (``d >= max_dim``) is its group's slice of the dense cache read at the copy
    bandwidth (as :func:`launches` prices dense decode attention); a latent one is its ``d`` latent
    dims per token at the latent class's bandwidth plus, for keys, their rebuild at its FLOP rate
    (:func:`latent_call`'s terms for this group alone, its rank padded as the kernel runs it;
    :meth:`Profile.latent_rates` of its key group size: measured, else the roofline, where a key
    site costs the greater of its bytes and its rebuild, which bounds the layer's roofline from
    above by at most the value latents' time). The call's fixed time is the layer's, not a site's:
    it is left out here, as the dense layer's attention launches are.
    """
    meta = getattr(site, "meta", None) or {}
    per_dim = meta.get("rebuild_flops_per_dim_per_cached_token")
    if per_dim is None or kv <= 0 or batch <= 0:
        return 0.0
    if d >= site.max_dim:
        return batch * kv * site.max_dim * elem / (profile.copy_gbps_or_default * 1e9) * 1e3
    g = int(meta.get("group_kv") or 1)
    # the kernel's row: the key group size, and the key group's query rows (the class's wide rows past them)
    rates = profile.latent_rates(int(meta.get("key_group") or g), int(meta.get("query_rows") or 0))
    reads = value_reads(int(meta.get("key_group") or g), g)  # a key site is its key group: read once
    ms = reads * batch * kv * d * elem / (float(rates["gbps"]) * 1e9) * 1e3
    hd = int(meta.get("head_dim") or 0)
    if per_dim and rates.get("tflops") and hd:
        flop_ms = 2.0 * batch * kv * hd * g * latent_rank(rates, d) / (float(rates["tflops"]) * 1e12) * 1e3
        ms = ms + flop_ms if rates["source"] == "measured" else max(ms, flop_ms)
    return ms


#: what :func:`latent_site_pricing` returns for a measured class timed with values grouped as the keys, priced
#: for keys and values grouped apart
GROUPED_APART = "measured, keys and values grouped apart (not timed so)"


#: ``latent_attention.fit.geometry.value_group`` of a class timed with the values grouped as the keys (what
#: :func:`gac.hardware.profiler.measure_latent_attention` writes)
VALUES_AS_KEYS = "as the key group"


def values_timed_as_keys(profile: Profile) -> bool:
    """Whether the profile's measured ``latent_attention`` class timed its calls with the values grouped as
    the keys (``fit.geometry.value_group``: how ``gac profile`` times it), so that a layer grouping them
    apart is priced from its key group's row without having been timed so."""
    geo = (((profile.latent_attention or {}).get("fit") or {}).get("geometry")) or {}
    return geo.get("value_group") == VALUES_AS_KEYS


def latent_site_pricing(profile: Profile, sites: list[Any], serve: list[Point]) -> str | None:
    """How :func:`site_cache_ms` priced ``sites`` at ``serve``: ``"measured"``, :data:`GROUPED_APART`
    (a measured class timed with values grouped as the keys, for sites whose key and value groups differ) or
    ``"roofline (not profiled)"`` where some site is a cache site (PaLU's) and some shape decodes over a
    cache; None where nothing was priced by it."""
    metas = [(getattr(s, "meta", None) or {}) for s in sites]
    metas = [m for m in metas if m.get("rebuild_flops_per_dim_per_cached_token") is not None]
    if not metas or not any(p.phase == "decode" and p.kv > 0 for p in serve):
        return None
    src = str(profile.latent_rates(1)["source"])
    apart = any(m.get("kind") == "v" and m.get("group_kv") != m.get("key_group") for m in metas)
    return GROUPED_APART if src == "measured" and apart and values_timed_as_keys(profile) else src


def _fit_rows(x: np.ndarray, y: np.ndarray) -> np.ndarray | None:
    """Non-negative least squares of ``y ≈ x @ c`` on the relative error: each subset of the columns
    that keeps the bytes (column 1) is solved and the best non-negative solution kept."""
    w = 1.0 / y
    best: tuple[float, np.ndarray] | None = None
    for cols in ((0, 1, 2), (1, 2), (0, 1), (1,)):
        if len(cols) > len(y):
            continue
        coef, *_ = np.linalg.lstsq(x[:, cols] * w[:, None], y * w, rcond=None)
        if (coef < 0).any():
            continue
        full = np.zeros(3)
        full[list(cols)] = coef
        err = float(np.sum(((x @ full) - y) ** 2 * w**2))
        if best is None or err < best[0] * (1 - 1e-9):
            best = (err, full)
    return None if best is None or best[1][1] <= 0 else best[1]


def fit_latent_attention(records: list[dict[str, Any]], source: str) -> dict[str, Any]:
    """A profile's ``latent_attention`` class from timed calls of the latent decode kernel.

    ``records``: one per call shape, with ``us`` (the call's time), ``bytes`` (latent cache bytes),
    ``flops`` (executed key-rebuild FLOPs), ``key_group`` and ``block_r`` (the rank tile the kernel
    ran). Per key group size (each runs its own row of the kernel's launch table), fits
    ``us = launch_us + bytes / gbps + flops / tflops``: least squares on the relative error with
    every coefficient non-negative (each subset of the three terms that keeps the bytes is solved and
    the best non-negative solution kept); a zero FLOP coefficient stores ``tflops`` None (the
    rebuild did not show in the time). Each row records its points and worst relative error.

    >>> recs = [{"us": 5.0 + b / 1e6 + f / 1e8, "bytes": b, "flops": f, "key_group": 1, "block_r": 64}
    ...         for b, f in [(1e6, 1e8), (4e6, 2e8), (1e7, 4e9), (3e7, 1e9)]]
    >>> row = fit_latent_attention(recs, "doctest")["groups"]["1"]
    >>> row["launch_us"], row["gbps"], row["tflops"], row["block_r"], row["points"]
    (5.0, 1000.0, 100.0, 64, 4)
    """
    groups: dict[str, dict[str, Any]] = {}
    errs: list[float] = []
    for g in sorted({int(r["key_group"]) for r in records}):
        ok = [r for r in records if int(r["key_group"]) == g and r.get("us") and r["us"] > 0]
        if len(ok) < 2 or len({r["bytes"] for r in ok}) < 2:
            continue
        y = np.array([r["us"] for r in ok], dtype=np.float64)
        x = np.array([[1.0, r["bytes"], r["flops"]] for r in ok], dtype=np.float64)
        c = _fit_rows(x, y)
        if c is None:
            continue
        rel = (x @ c) / y - 1.0
        errs += [float(e) for e in rel]
        groups[str(g)] = {
            "launch_us": round(float(c[0]), 4),
            "gbps": round(float(1.0 / c[1] / 1e3), 1),
            "tflops": round(float(1.0 / c[2] / 1e6), 2) if c[2] > 0 else None,
            "block_r": int(ok[0]["block_r"]),
            "points": len(ok),
            "max_abs_rel_err": round(float(np.max(np.abs(rel))), 4),
            "rel_err": [round(float(e), 4) for e in rel],
        }
    if not groups:
        raise GacError(
            "the latent attention fit found no key group size with two timed calls of different sizes "
            "whose time grows with the bytes"
        )
    return {
        "groups": groups,
        "rank_round": 32,
        "fit": {
            "source": source,
            "method": "per key group size, least squares us = launch_us + latent bytes / gbps + executed "
            "key-rebuild FLOPs / tflops on the relative error, coefficients non-negative, over calls of the "
            "latent decode kernel (gac::latent_decode: the split-KV kernel and its combine, in CUDA graphs "
            "over caches rotated past L2)",
            "max_abs_rel_err": round(max(abs(e) for e in errs), 4),
        },
    }


def _attentions(model: Any) -> list[Any]:
    """Each decoder layer's attention module (None where a layer has none found)."""
    from gac.models.adapters import ATTN_NAMES, find_child

    out = []
    for layer in _layers(model):
        name = find_child(layer, ATTN_NAMES, "attention")
        out.append(getattr(layer, name) if name else None)
    return out


def _one_gemm(proj: Any, rows: int) -> bool:
    """Whether ``proj`` (a :class:`~gac.nn.latent.LatentProjection`) rebuilds ``rows`` rows in one GEMM, by the rule
    alone (:func:`gac.nn.latent.one_gemm`): a priced model is often a meta-device skeleton, where the module's own
    check (plain linear layers with their weights in memory) would not hold."""
    from gac.nn.latent import one_gemm

    return one_gemm(rows, list(proj.ranks), int(proj.group_out))


@dataclass
class _LatentLayer:
    """A :class:`~gac.nn.latent.LatentAttention` layer as the latency model prices it."""

    attn: Any
    path: str  # kernel | reference
    reasons: list[str]
    raw: bool = False  # keys cached raw (gac.nn.latent.raw_key_groups): the kernel rebuilds nothing

    @classmethod
    def of(cls, attn: Any) -> _LatentLayer:
        """The decode path the layer takes on a CUDA static cache (as ``LatentAttention.decode_refusals``
        decides it from the layer's geometry; Triton taken as present, as on the GPU priced)."""
        why = []
        if not getattr(attn, "use_kernel", True):
            why.append("kernel switched off (use_kernel=False)")
        rot = getattr(attn, "_rotary", None)
        if rot is None or not hasattr(rot, "inv_freq"):
            why.append("no rotary inv_freq")
        hd = int(attn.head_dim)
        if hd < 32 or hd & (hd - 1):
            why.append(f"head_dim {hd} not a power of two >= 32")
        heads = attn.num_key_value_groups * attn.group_kv_k
        if heads > LATENT_MAX_GROUP_HEADS:
            why.append(f"{heads} query heads per key group (more than {LATENT_MAX_GROUP_HEADS})")
        # every key group at full width: PaLU caches those keys raw (gac.nn.latent.raw_key_groups; read from the
        # ranks, as a skeleton built from a cell's dims has no weights to compare with the identity)
        kp = attn.k_proj
        return cls(attn, "reference" if why else "kernel", why, all(r == kp.group_out for r in kp.ranks))

    def idle(self, point: Point) -> list[Any]:
        """Up-projections that run as no GEMM launch of their own at ``point`` (the kernel rebuilds the
        keys; folded values never leave the latent; the reference rebuild is priced by
        :meth:`decode_launches`)."""
        a = self.attn
        out = list(a.v_proj.ups) if a.folded else []
        if point.phase == "decode":
            out += list(a.k_proj.ups)
            if self.path == "reference" and not a.folded:
                out += list(a.v_proj.ups)
        else:  # a prefill rebuilds in one block-diagonal GEMM where it can (priced by rebuild_launches)
            out += [u for p in self.rebuilt() if _one_gemm(p, point.tokens) for u in p.ups]
        return out

    def rebuilt(self) -> list[Any]:
        """The :class:`~gac.nn.latent.LatentProjection` s the reference path rebuilds (folded values are not)."""
        a = self.attn
        return [a.k_proj] + ([] if a.folded else [a.v_proj])

    def rebuild_launches(
        self, profile: Profile, rows: int, i: int, elem: int, peak: float, compiled: bool, per_group: bool
    ) -> list[Launch]:
        """The reference path's rebuild of ``rows`` rows: where :func:`_one_gemm` holds, the block-diagonal
        up-projection built (one kernel writing it, zeros too) and one GEMM against it; elsewhere, with
        ``per_group``, one GEMM a group (without, :func:`launches`' walk prices those)."""
        c = constants(profile)
        bw, out = c["copy_gbps"] * 1e9, []
        for j, p in enumerate(self.rebuilt()):
            if _one_gemm(p, rows):
                k, n = sum(p.ranks), p.out_features
                nbytes = float((k * n + sum(r * p.group_out for r in p.ranks)) * elem)
                out.append(Launch("aux", f"layer{i}.latent_block{j}", 0.0, nbytes, c["aux_us"], 0.0,
                                  nbytes / bw * 1e3))  # fmt: skip
                x = _gemm_launch(profile, rows, k, n, False, compiled, elem, peak, bw, c["launch_us"])
                x.name = f"layer{i}.latent_rebuild{j}"
                out.append(x)
                continue
            for g, u in enumerate(p.ups if per_group else []):
                r, n = u.in_features, u.out_features
                eff = profile.efficiency("gemm_n", n) if "gemm_n" in profile.ops else 1.0
                nbytes = float((r * n + rows * (r + n)) * elem)
                out.append(Launch("gemm", f"layer{i}.latent_rebuild{j}.{g}", 2.0 * rows * r * n, nbytes,
                                  c["launch_us"], 2.0 * rows * r * n / (peak * 1e12 * eff) * 1e3,
                                  nbytes / bw * 1e3))  # fmt: skip
        return out

    def decode_launches(
        self, profile: Profile, point: Point, i: int, elem: int, peak: float, compiled: bool = True
    ) -> list[Launch]:
        """The layer's decode attention: the kernel's two launches, or the reference path's rebuild GEMMs
        (followed by :func:`launches`' dense decode attention over the rebuilt keys and values)."""
        a, b, n_kv = self.attn, point.batch, point.kv
        c = constants(profile)
        if self.path == "reference":
            return self.rebuild_launches(profile, b * n_kv, i, elem, peak, compiled, per_group=True)
        call = latent_call(profile, b, n_kv, int(a.head_dim), int(a.group_kv_k), list(a.k_proj.ranks),
                           list(a.v_proj.ranks), elem, raw=self.raw, n_rep=int(a.num_key_value_groups),
                           value_group=int(a.group_kv_v))  # fmt: skip
        rates = call["rates"]
        if rates["source"] == "measured":  # the fitted fixed time covers both launches
            split_us = max(rates["launch_us"] - c["aux_us"], 0.0)
            combine_us = rates["launch_us"] - split_us
        else:
            split_us, combine_us = c["launch_us"], c["aux_us"]
        return [
            Launch("attention", f"layer{i}.latent_attention", call["flops"], call["bytes"], split_us,
                   call["flop_ms"], call["byte_ms"], serial=call["serial"]),
            Launch("aux", f"layer{i}.latent_combine", 0.0, 0.0, combine_us, 0.0, 0.0),
        ]  # fmt: skip


def latent_note(model: Any, profile: Profile) -> dict[str, Any] | None:
    """How ``model``'s latent attention layers are priced on ``profile`` (None: it has none).

    ``{"pricing": "measured" | "roofline (not profiled)", "kernel": layers, "reference": layers,
    "reasons": [...]}``; a roofline pricing or a reference path is also warned once (no silent fallback).
    """
    from gac.nn.latent import LatentAttention

    layers = [_LatentLayer.of(a) for a in _attentions(model) if isinstance(a, LatentAttention)]
    if not layers:
        return None
    src = profile.latent_rates(1)["source"]
    reasons = sorted({r for x in layers for r in x.reasons})
    out = {"pricing": src, "kernel": sum(x.path == "kernel" for x in layers),
           "reference": sum(x.path == "reference" for x in layers), "reasons": reasons}  # fmt: skip
    beyond = latent_beyond_timed(layers, profile) if src == "measured" else None
    if beyond:
        out["beyond_timed_rank"] = beyond
    apart = latent_grouped_apart(layers, profile) if src == "measured" else None
    if apart:
        out["grouped_apart"] = apart
    for why in ([f"profile {profile.id!r} has no latent_attention class: decode priced at its roofline"]
                if src != "measured" else []) + [f"decode priced on the reference path: {r}" for r in reasons]:  # fmt: skip
        if why not in _LATENT_WARNED:
            _LATENT_WARNED.add(why)
            log.warning("latency model: latent attention %s", why)
    for line in ([latent_beyond_line(beyond)] if beyond else []) + (
        [latent_apart_line(apart)] if apart else []
    ):
        if line not in _LATENT_WARNED:
            _LATENT_WARNED.add(line)
            log.warning("latency model: %s", line)
    return out


def latent_grouped_apart(layers: list[_LatentLayer], profile: Profile) -> dict[str, Any] | None:
    """Kernel-path latent layers whose keys and values are grouped apart (``-O k_group_size`` other than the
    value group size), where the profile's class timed the values grouped as the keys
    (:func:`values_timed_as_keys`): ``{"layers", "key_group", "value_group"}`` of the first such grouping, or
    None.

    Such a layer is priced from its key group's row. The kernel runs a program per key group, and each reads its
    value group's latents, so values grouped wider than the keys are priced as read once per key group inside
    them (:func:`value_reads`). Priced as read once, the committed cells of key groups 1 and 2 with values in
    groups of 4 (Llama-3-8B and Qwen2.5-7B shapes) read 0.93-1.43x their measured speedup over dense (H100,
    ``benchmarks/results/h100/palu-default/keygroup/``) and 0.89-1.15x (H200, ``keygroup2/``, ``g1-qwen/``); as
    read per key group, 0.81-1.15x and 0.84-1.08x.
    """
    if not values_timed_as_keys(profile):
        return None
    apart = [x for x in layers if x.path == "kernel" and int(x.attn.group_kv_k) != int(x.attn.group_kv_v)]
    if not apart:
        return None
    a = apart[0].attn
    return {"layers": len(apart), "key_group": int(a.group_kv_k), "value_group": int(a.group_kv_v)}


def latent_apart_line(apart: dict[str, Any]) -> str:
    """One report line for :func:`latent_grouped_apart`'s record."""
    return (
        f"{apart['layers']} latent attention layer(s) group keys by {apart['key_group']} and values by "
        f"{apart['value_group']} KV heads; the profile's latent_attention class timed values grouped as the "
        "keys: their decode time is priced from the key group's row with the values read once per key group, "
        "untimed for this grouping"
    )


def latent_beyond_timed(layers: list[_LatentLayer], profile: Profile) -> dict[str, Any] | None:
    """Kernel-path latent layers whose key rank (as the kernel runs it, :func:`latent_rank` of the layer's
    widest group) is past every rank the profile's ``latent_attention`` class timed for their key group
    size: ``{"key_group", "timed_max_rank", "layers", "max_rank"}`` of the first such key group, or None.

    The class's rates are fitted at the ranks its calls ran (``gac profile``: ``G·head_dim/2``); a layer
    past them is priced by extrapolation. On an H100 the pipeline's first layer of the Llama-3-8B shape
    (key rank 496 of 512) took 2.5-4x the time of a rank-128 layer where the class predicts less
    (``benchmarks/results/h100/palu-trace/``): the prediction there is optimistic.
    """
    # the class's row (key group size, and the query rows that pick the class or its wide rows) -> the ranks run
    by_group: dict[tuple[int, int], list[int]] = {}
    for x in layers:
        if x.path != "kernel" or x.raw:  # raw keys: nothing rebuilt, no rank to extrapolate
            continue
        g = int(x.attn.group_kv_k)
        rows = g * int(x.attn.num_key_value_groups)
        rates = profile.latent_rates(g, rows)
        by_group.setdefault((int(rates["key_group"]), rows), []).append(
            latent_rank(rates, max(x.attn.k_proj.ranks))
        )
    for (row, rows), runs in sorted(by_group.items()):
        top = profile.timed_key_rank(row, rows)
        if top is None:
            continue
        past = [r for r in runs if r > top]
        if past:
            return {"key_group": row, "timed_max_rank": top, "layers": len(past), "max_rank": max(past)}
    return None


def latent_beyond_line(beyond: dict[str, Any]) -> str:
    """One report line for :func:`latent_beyond_timed`'s record."""
    return (
        f"{beyond['layers']} latent attention layer(s) run key rank up to {beyond['max_rank']}, past the "
        f"{beyond['timed_max_rank']} the profile's latent_attention class timed for key group "
        f"{beyond['key_group']}: their decode time is extrapolated from those ranks"
    )


def _one_launch_sites(model: Any, rows: int) -> dict[int, str]:
    """Weight-owning modules that run in one launch with others at ``rows`` token rows.

    A site switched to the fused low-rank kernel (:mod:`gac.runtime.lowrank_fused`: a module whose
    ``lowrank_table`` has a configuration at the row class of ``rows``) computes its factors, and a
    fused group its first stage and every member's second factor, in one launch.  Returns
    ``{id(module): site}``.
    """
    from gac.nn import FactorizedLinear

    out: dict[int, str] = {}
    for name, m in model.named_modules():
        if choice(getattr(m, "lowrank_table", None), rows) is None:
            continue
        if isinstance(m, FactorizedLinear):
            out[id(m.v)] = out[id(m.u)] = name
        else:  # a fused group: its first stage and its members' second factors
            out[id(m)] = name
            for u in getattr(m, "seconds", None) or []:
                if u is not None:
                    out[id(u)] = name
    return out


def _branch_sites(model: Any, rows: int) -> dict[int, str]:
    """Second factors of a fused group that run as parallel branches at ``rows`` rows (a
    ``branch_table`` with a decision there, :mod:`gac.runtime.branches`): priced as one launch,
    ``{id(u): "<group>.seconds"}``."""
    out: dict[int, str] = {}
    for name, m in model.named_modules():
        if choice(getattr(m, "branch_table", None), rows):
            for u in getattr(m, "seconds", None) or []:
                if u is not None:
                    out[id(u)] = f"{name}.seconds"
    return out


def _merge(ls: list[Launch], keys: list[str | None]) -> list[Launch]:
    """One launch per key: FLOPs, bytes and their times summed, one fixed cost."""
    out: list[Launch] = []
    at: dict[str, int] = {}
    for x, k in zip(ls, keys, strict=True):
        if k is None:
            out.append(x)
        elif k not in at:
            at[k] = len(out)
            out.append(Launch(x.kind, k, x.flops, x.bytes, x.fixed_us, x.flop_ms, x.byte_ms))
        else:
            y = out[at[k]]
            y.flops += x.flops
            y.bytes += x.bytes
            y.flop_ms += x.flop_ms
            y.byte_ms += x.byte_ms
    return out


def padded(d: int, elem: int = 2) -> int:
    """``d`` rounded up to Inductor's GEMM alignment for elements of ``elem`` bytes (16 bytes).

    >>> padded(12100), padded(12104), padded(409, 4)
    (12104, 12104, 412)
    """
    m = max(16 // max(elem, 1), 1)
    return -(-int(d) // m) * m


def predict(
    model: Any, profile: Profile, point: Point, gqa_decode: bool = True, compiled: bool = True
) -> dict[str, Any]:
    """Predicted ms of one forward at ``point``, with the launch count and the ms per kind."""
    ls = launches(model, profile, point, gqa_decode=gqa_decode, compiled=compiled)
    by_kind: dict[str, dict[str, float]] = {}
    for x in ls:
        k = by_kind.setdefault(x.kind, {"launches": 0, "ms": 0.0, "fixed_ms": 0.0})
        k["launches"] += 1
        k["ms"] += x.ms
        k["fixed_ms"] += x.fixed_us * 1e-3
    return {
        "point": point.key,
        "ms": sum(x.ms for x in ls),
        "launches": len(ls),
        "gemm_launches": sum(x.kind in ("gemm", "head") for x in ls),
        "by_kind": by_kind,
        "constants": constants(profile),
        **({"latent_attention": note} if (note := latent_note(model, profile)) else {}),
    }


def compare(predicted: float | None, measured: float | None) -> float | None:
    """``predicted / measured`` (None where either is missing)."""
    if predicted is None or measured is None or not measured or not math.isfinite(measured):
        return None
    return predicted / measured


# ------------------------------------------------------------------------ from recorded cells
def skeleton(
    spec: str, dims: dict[str, int] | None = None, dtype: str = "bfloat16", fused: bool = True
) -> Any:
    """The structure of a (compressed) model on the meta device: no weights drawn, shapes only.

    ``spec`` is a ``shape:`` or ``tiny:`` spec (other specs: a config-only load from a local
    directory or the hub cache);
    ``dims`` a cell's kept dims. A dim at an ``nn.Linear`` factorizes it at that rank (unless the
    rank saves nothing: the site stays dense, as the low-rank compressors leave it); a dim at an
    MLP module keeps that many channels of its gate/up outputs and down inputs; a dim at an
    attention module keeps that many KV-head groups (q/k/v outputs, o inputs); PaLU's dims
    (``<attention>.k_proj:g0``, one per key or value group) make that attention a
    :class:`~gac.nn.latent.LatentAttention` at those ranks (values unfolded). ``fused``
    applies :func:`gac.nn.fused.fuse_projections_`, as the ``infer`` eval does.
    """
    import torch
    from torch import nn

    from gac.models.adapters import ROLE_NAMES
    from gac.nn import FactorizedLinear, replace_module
    from gac.nn.fused import fuse_projections_

    dt = parse_dtype(str(dtype).removeprefix("torch."), device="cuda")  # a GPU's model: auto is bf16
    if spec.startswith("tiny:"):
        from transformers import AutoModelForCausalLM

        from gac.testing import tiny_config

        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(tiny_config(spec.split(":", 1)[1]), dtype=dt).eval()
    elif spec.startswith("shape:"):
        from gac.models.shapes import shape_model

        model, _ = shape_model(spec, dtype=dt, device="meta")
    else:
        from transformers import AutoConfig, AutoModelForCausalLM

        try:
            cfg = AutoConfig.from_pretrained(spec, local_files_only=True)
        except Exception as e:  # noqa: BLE001 - any failure means: no config at hand
            raise GacError(
                f"no config for {spec!r} at hand to build its skeleton: {type(e).__name__}"
            ) from None
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(cfg, dtype=dt).eval()

    def child(parent: nn.Module, role: str) -> tuple[str, nn.Module] | None:
        for n in ROLE_NAMES[role]:
            m = getattr(parent, n, None)
            if isinstance(m, nn.Linear):
                return n, m
        return None

    def resize(parent: nn.Module, role: str, out_f: int | None = None, in_f: int | None = None) -> None:
        c = child(parent, role)
        if c is None:
            return
        n, m = c
        new = nn.Linear(in_f or m.in_features, out_f or m.out_features, bias=m.bias is not None,
                        device="meta", dtype=m.weight.dtype)  # fmt: skip
        setattr(parent, n, new)

    heads = int(model.config.num_attention_heads)
    kvh = int(getattr(model.config, "num_key_value_heads", None) or heads)
    for fqn, d in (dims or {}).items():
        try:
            mod = model.get_submodule(fqn)
        except AttributeError:
            continue  # a site of a model with fewer layers, or a sub-site (PaLU's fqn:gN)
        d = int(d)
        if isinstance(mod, nn.Linear):
            i, o = mod.in_features, mod.out_features
            if d < (i * o) // (i + o):  # below the break-even rank (the low-rank sites' max_dim)
                replace_module(model, fqn, FactorizedLinear(i, d, o, bias=mod.bias is not None,
                                                            device="meta", dtype=mod.weight.dtype))  # fmt: skip
        elif child(mod, "down") is not None:  # an MLP: d channels
            if d < child(mod, "down")[1].in_features:
                resize(mod, "gate", out_f=d)
                resize(mod, "up", out_f=d)
                resize(mod, "down", in_f=d)
        elif child(mod, "q") is not None and child(mod, "k") is not None:  # attention: d KV groups
            hd = int(getattr(mod, "head_dim", None) or child(mod, "q")[1].out_features // heads)
            if d < child(mod, "k")[1].out_features // hd:
                n_rep = heads // kvh
                resize(mod, "q", out_f=d * n_rep * hd)
                resize(mod, "k", out_f=d * hd)
                resize(mod, "v", out_f=d * hd)
                resize(mod, "o", in_f=d * n_rep * hd)
    latent_skeleton_(model, dims or {})
    if fused:
        fuse_projections_(model)
    return model


def latent_skeleton_(model: Any, dims: dict[str, int], device: Any = "meta") -> None:
    """PaLU's kept dims (``<attention>.k_proj:g0``... one per key or value group) as
    :class:`~gac.nn.latent.LatentAttention` layers on the meta device (values unfolded, the default);
    on another ``device`` the latent projections get ``nn.Linear``'s random init (speed runs). There a group kept at
    full width gets the identity as its up-projection, as PaLU stores it, so the decode kernel reads those keys raw
    as it does in the compressed model (:func:`gac.nn.latent.raw_key_groups`)."""
    import torch

    from gac.models.adapters import model_rotary
    from gac.nn import replace_module
    from gac.nn.latent import LatentAttention, LatentProjection

    groups: dict[str, dict[str, dict[int, int]]] = {}
    for fqn, d in dims.items():
        proj, sep, g = fqn.rpartition(":g")
        if sep and g.isdigit():
            attn, _, role = proj.rpartition(".")
            groups.setdefault(attn, {}).setdefault(role, {})[int(g)] = int(d)
    if not groups:
        return
    cfg = model.config
    heads = int(cfg.num_attention_heads)
    kvh = int(getattr(cfg, "num_key_value_heads", None) or heads)
    rotary = model_rotary(model)
    for attn_name, roles in groups.items():
        try:
            a = model.get_submodule(attn_name)
        except AttributeError:
            continue  # a layer of a model with fewer layers
        if set(roles) != {"k_proj", "v_proj"}:
            raise GacError(f"PaLU dims of {attn_name} name {sorted(roles)}, not k_proj and v_proj groups")
        hd = int(getattr(a, "head_dim", None) or a.q_proj.out_features // heads)
        projs = []
        for role in ("k_proj", "v_proj"):
            ranks = [roles[role][g] for g in sorted(roles[role])]
            lin = getattr(a, role)
            width = kvh * hd // len(ranks)  # a group's full width
            with torch.device(device):
                lp = LatentProjection(
                    lin.in_features, ranks, width, bias=lin.bias is not None, dtype=lin.weight.dtype
                )
            if str(device) != "meta":
                with torch.no_grad():
                    for r, up in zip(ranks, lp.ups, strict=True):
                        if r >= width:  # full width: the identity, as PaLU.apply stores it
                            up.weight.copy_(torch.eye(r, dtype=up.weight.dtype))
            projs.append(lp)
        new = LatentAttention(a.q_proj, projs[0], projs[1], a.o_proj, heads, kvh, hd,
                              int(getattr(a, "layer_idx", 0) or 0), cfg, float(getattr(a, "scaling", hd**-0.5)),
                              rotary, q_norm=getattr(a, "q_norm", None), k_norm=getattr(a, "k_norm", None))  # fmt: skip
        replace_module(model, attn_name, new)


def infer_of(cell: dict[str, Any]) -> dict[str, Any] | None:
    """The ``infer`` eval of a recorded cell (``gac run`` cell JSON), or None."""
    if not cell or cell.get("status") != "ok":
        return None
    return ((cell.get("results") or {}).get("evals") or {}).get("infer")


def gqa_decode_of(infer: dict[str, Any]) -> bool:
    """Whether an ``infer`` record decoded on the KV heads (cells recorded before the option: no)."""
    return bool((infer.get("config") or {}).get("gqa_decode", False))


def compiled_of(infer: dict[str, Any], phase: str) -> bool:
    """Whether an ``infer`` record ran ``phase`` through ``torch.compile`` (default: yes)."""
    return bool(infer.get(f"compiled_{phase}", True))


def predict_pair(
    base: Any,
    variant: Any,
    profile: Profile,
    base_infer: dict[str, Any],
    infer: dict[str, Any],
) -> list[dict[str, Any]]:
    """Per grid point measured in both ``infer`` records: measured and predicted speedup and their ratio.

    Each row: ``point``, ``phase``, ``measured_ms`` (base, variant), ``predicted_ms`` (base,
    variant), ``measured_speedup``, ``predicted_speedup``, ``ratio`` = predicted / measured speedup.
    """
    ref = {Point.from_record(r).key: r for r in base_infer.get("prefill", []) + base_infer.get("decode", [])
           if r.get("status") == "ok"}  # fmt: skip
    rows = []
    for r in infer.get("prefill", []) + infer.get("decode", []):
        if r.get("status") != "ok":
            continue
        p = Point.from_record(r)
        b = ref.get(p.key)
        if b is None:
            continue
        pb = predict(base, profile, p, gqa_decode_of(base_infer), compiled_of(base_infer, p.phase))["ms"]
        pv = predict(variant, profile, p, gqa_decode_of(infer), compiled_of(infer, p.phase))["ms"]
        ms_sp = b["median_ms"] / r["median_ms"]
        pr_sp = pb / pv
        rows.append({
            "point": p.key, "phase": p.phase,
            "measured_ms": [b["median_ms"], r["median_ms"]], "predicted_ms": [pb, pv],
            "measured_speedup": ms_sp, "predicted_speedup": pr_sp, "ratio": pr_sp / ms_sp,
        })  # fmt: skip
    note = latent_note(variant, profile)
    for row in rows if note else []:  # how the variant's latent attention was priced
        row["latent_attention"] = note["pricing"]
    return rows


def worst(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The row whose predicted/measured ratio is furthest from 1 (in log terms)."""
    ok = [r for r in rows if r.get("ratio")]
    return max(ok, key=lambda r: abs(math.log(r["ratio"])), default=None)


def profile_of(cell: dict[str, Any], default: Profile | None = None) -> Profile:
    """The profile a cell's ``predict`` eval named, else the shipped one of the cell's GPU and dtype."""
    if default is not None:
        return default
    pid = (((cell.get("results") or {}).get("evals") or {}).get("predict") or {}).get("profile")
    if pid:
        try:
            return load_profile(pid)
        except GacError:
            pass
    inf = infer_of(cell) or {}
    return load_profile(
        None, dtype=str(inf.get("dtype") or "bfloat16"), gpu=str((cell.get("env") or {}).get("gpu"))
    )
