"""The shape contract: a per-GPU, per-dtype record of which dims are fast.

A profile is a small versioned JSON document (schema ``gac.profile/1``)::

    {
      "schema": "gac.profile/1",
      "id": "nvidia-h200-bfloat16-torch2.11-cuda13.0",
      "measured": true,                 # false for the built-in default
      "label": "NVIDIA H200, bfloat16, torch 2.11.0+cu130 (measured 2026-11-21)",
      "dtype": "bfloat16",
      "env": {...},                     # gac.hardware.timing.environment()
      "ops": {
        "gemm_n": {
          "rule": {"modulus": 8, "prefer": 64, "tolerance": 0.05},
          "class_efficiency": {"1": 0.15, "2": 0.2, ..., "128": 1.0},
          "curve": {"dims": [...], "ms": [...], "tflops": [...], "context": {"M": 8192, "K": 4096}},
          "cliffs": [{"dim": 1001, "ratio": 6.6}, ...]
        },
        ...
      }
    }

Operator classes (:data:`OPS`): ``gemm_k`` (reduction dim of a GEMM), ``gemm_n`` (output dim
of a linear layer), ``gemv`` (output dim at M=1, decode), ``sdpa_head_dim`` and
``lowrank_r`` (inner rank of an x -> r -> d factorized pair).

Optional launch constants (the latency model of :mod:`gac.hardware.latency`; absent from
profiles measured before them, which then load with the documented defaults
:data:`DEFAULT_LAUNCH_US`, :data:`DEFAULT_AUX_US`, :data:`DEFAULT_COPY_GBPS` and say so in
:meth:`Profile.latency_note`)::

      "launch_us": 5.05,      # fixed time of one GEMM/GEMV launch in a CUDA graph (fit intercept)
      "copy_gbps": 4494.9,    # weight-streaming bandwidth, GB/s (fit slope: bytes read per second)
      "aux_us": 2.14,         # fixed time of one non-GEMM kernel (norm, rotary, activation...)
      "latency_fit": {...},   # provenance: source, method, points
      "fused_lowrank": {      # the fused low-rank kernel (gac.kernels.lowrank_fused), if measured
        "launch_us": 6.56, "gbps": 4072.3, "rows": [1], "fit": {...}
      },
      "latent_attention": {   # PaLU's latent decode kernel (gac.kernels.latent_attention), if measured
        "groups": {           # one row per measured key group size G (KV heads per key group)
          "1": {"launch_us": ...,  # fixed time of one call: the split-KV kernel and its combine
                "gbps": ...,       # latent cache bytes per second
                "tflops": ...,     # executed key-rebuild FLOP rate (null: the rebuild never showed)
                "block_r": ...,    # the rank tile the kernel ran: ranks are rebuilt padded to it
                "points": ..., "max_abs_rel_err": ..., "rel_err": [...]},
          "2": {...}, "4": {...}
        },
        "rank_round": 32, "fit": {...},  # the packed rank's rounding; provenance, every timed call
        "wide": {"rows_over": 16, "groups": {"4": {...}}, "rank_round": 32, "fit": {...}}
                              # the same, timed on a geometry whose key groups have more query rows than
                              # rows_over (the kernel's QROT_ROWS: Qwen2.5-7B's 28 at key group 4)
      }
      "gemv_kernel": {        # the Triton decode GEMV (gac.kernels.gemv), if measured: per row class
        "rows": {"1": {"launch_us": 3.76, "gbps": 3179.2, ...}, "16": {...}}, "fit": {...}
      },
      "prefill_attention": {  # one layer's prefill attention as the compiled step runs it, if measured
        "geometry": [32, 8, 128], "points": [{"batch": 1, "seq": 128, "us": 22.7}, ...],
        "mask": "...", "fit": {...}
      }

The latent class is an operator class of its own: a call of the kernel at key group size ``G``
(KV heads per key group), key rank ``r`` per group, batch ``B`` and ``KV`` cached tokens is priced
``launch_us + bytes / gbps + flops / tflops`` (:func:`gac.hardware.latency.latent_call`); a
profile without it prices the call at the profile's peak tensor FLOP/s and copy bandwidth and says
so (:meth:`Profile.latent_rates`).

``rule.modulus`` is the smallest modulus m such that dims = 0 (mod m) run within
``tolerance`` of the best nearby dim; ``rule.prefer`` is the modulus that reaches the best
throughput.  ``class_efficiency`` maps the alignment class of a dim (the largest power of
two dividing it, capped at 128) to its median throughput relative to the best aligned dim;
it lets gac predict the penalty of any dim, also far from the measured curve.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from gac.alignment import aligned_candidates, is_aligned, pow2_class, round_up
from gac.errors import GacError
from gac.guard import atomic_write_text

SCHEMA = "gac.profile/1"
OPS: tuple[str, ...] = ("gemm_k", "gemm_n", "gemv", "sdpa_head_dim", "lowrank_r")

#: Launch constants used when a profile has none (not measured on the profile's GPU): the
#: intercept of the H200 GEMV fit, a typical small-kernel time, and an HBM3-class bandwidth.
DEFAULT_LAUNCH_US = 5.0
DEFAULT_AUX_US = 2.0
DEFAULT_COPY_GBPS = 3000.0

# Conservative built-in rule, used (and labelled) when no measured profile matches.
_DEFAULT_CLASS_EFF = {"1": 0.25, "2": 0.35, "4": 0.5, "8": 0.9, "16": 1.0, "32": 1.0, "64": 1.0, "128": 1.0}


@dataclass
class OpRule:
    """The rule and the evidence for one operator class."""

    modulus: int = 8
    prefer: int = 16
    tolerance: float = 0.05
    class_efficiency: dict[str, float] = field(default_factory=lambda: dict(_DEFAULT_CLASS_EFF))
    curve: dict[str, Any] = field(default_factory=dict)
    cliffs: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "rule": {"modulus": self.modulus, "prefer": self.prefer, "tolerance": self.tolerance},
            "class_efficiency": self.class_efficiency,
            "curve": self.curve,
            "cliffs": self.cliffs,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> OpRule:
        rule = d.get("rule", {})
        return cls(
            modulus=int(rule.get("modulus", 8)),
            prefer=int(rule.get("prefer", rule.get("modulus", 8))),
            tolerance=float(rule.get("tolerance", 0.05)),
            class_efficiency={
                str(k): float(v) for k, v in d.get("class_efficiency", _DEFAULT_CLASS_EFF).items()
            },
            curve=dict(d.get("curve", {})),
            cliffs=list(d.get("cliffs", [])),
        )


#: Pseudo operator classes whose every dim is aligned: a count of whole KV-head groups (pruned
#: attention) keeps every GEMM a multiple of head_dim, so it has no cliff of its own; the
#: latency model prices its FLOPs at full efficiency.
STRUCTURAL_OPS: dict[str, OpRule] = {"kv_groups": OpRule(modulus=1, prefer=1, class_efficiency={"1": 1.0})}


@dataclass
class Profile:
    """A shape contract for one GPU and dtype. Load with :func:`load_profile`."""

    id: str
    ops: dict[str, OpRule]
    measured: bool = False
    label: str = ""
    dtype: str = "float16"
    env: dict[str, Any] = field(default_factory=dict)
    schema: str = SCHEMA
    #: fixed time (us) of one GEMM launch in a CUDA graph; None = not measured (default applies)
    launch_us: float | None = None
    #: weight-streaming bandwidth (GB/s); None = not measured
    copy_gbps: float | None = None
    #: fixed time (us) of one non-GEMM kernel; None = not measured
    aux_us: float | None = None
    #: where the launch constants come from (source file, method, points)
    latency_fit: dict[str, Any] = field(default_factory=dict)
    #: the fused low-rank kernel (:mod:`gac.kernels.lowrank_fused`) on this GPU, ``{}`` if unknown:
    #: ``launch_us`` and ``gbps`` of its fit ``t = launch_us + bytes / gbps`` (both stages of a
    #: factorized site in one launch), ``rows``: the token-row counts it is dispatched at, ``fit``:
    #: provenance
    fused_lowrank: dict[str, Any] = field(default_factory=dict)
    #: PaLU's latent decode kernel (:mod:`gac.kernels.latent_attention`) on this GPU, ``{}`` if not
    #: measured: ``groups`` (per key group size: ``launch_us``, ``gbps`` of latent bytes, ``tflops`` of
    #: executed key-rebuild FLOPs or None where not limiting, ``block_r`` the rank tile), ``rank_round``,
    #: ``fit`` (provenance)
    latent_attention: dict[str, Any] = field(default_factory=dict)
    #: the Triton decode GEMV (:mod:`gac.kernels.gemv`) on this GPU, ``{}`` if not measured: ``rows``, per
    #: row class (``"1"``, ``"16"``) the ``launch_us`` and ``gbps`` of its fit ``t = launch_us + bytes / gbps``
    #: over the shapes where it beat cuBLAS (the only ones its dispatch runs it at); ``fit``: provenance
    gemv_kernel: dict[str, Any] = field(default_factory=dict)
    #: prefill attention as the compiled prefill step runs it, ``{}`` if not measured: ``geometry`` (query
    #: heads, KV heads, head_dim), ``points`` (``batch``, ``seq``, ``us`` of one layer's call), ``mask``, ``fit``
    prefill_attention: dict[str, Any] = field(default_factory=dict)

    # ------------------------------------------------------------------ rules
    def rule(self, op: str) -> OpRule:
        if op in STRUCTURAL_OPS and op not in self.ops:
            return STRUCTURAL_OPS[op]
        if op not in self.ops:
            raise GacError(
                f"profile {self.id!r} has no operator class {op!r}; known: {', '.join(sorted(self.ops))}"
            )
        return self.ops[op]

    def modulus(self, op: str) -> int:
        """Smallest modulus whose multiples run within tolerance of the best."""
        return self.rule(op).modulus

    def prefer(self, op: str) -> int:
        """The modulus at which throughput is best."""
        return self.rule(op).prefer

    def is_aligned(self, op: str, d: int) -> bool:
        return is_aligned(d, self.modulus(op))

    def efficiency(self, op: str, d: int) -> float:
        """Predicted throughput of dim ``d`` relative to the best aligned dim (0 < eff <= 1).

        A measured curve point at ``d`` wins; otherwise the dim's alignment class decides.
        """
        r = self.rule(op)
        dims = r.curve.get("dims") or []
        eff = r.curve.get("efficiency") or []
        if d in dims and len(eff) == len(dims):
            return float(eff[dims.index(d)])
        cls = pow2_class(d)
        ce = r.class_efficiency
        while str(cls) not in ce and cls > 1:
            cls //= 2
        return float(ce.get(str(cls), 1.0))

    def penalty(self, op: str, d: int) -> float:
        """Predicted slow-down of ``d`` against a perfectly aligned dim of the same size (>= 1)."""
        return 1.0 / max(self.efficiency(op, d), 1e-6)

    def repair_target(self, op: str, d: int) -> int:
        """The dim that zero-padding ``d`` to this profile's rule gives."""
        return round_up(d, self.modulus(op))

    def candidates(self, op: str, d: int, lo: int = 1, hi: int | None = None, window: int = 4) -> list[int]:
        """Aligned dims near ``d`` that this profile marks fast."""
        return aligned_candidates(d, self.modulus(op), lo=lo, hi=hi, window=window)

    # ----------------------------------------------------------- latency model
    def gemm_ms(self, m: int, k: int, n: int, op: str = "gemm_n") -> float:
        """Predicted GEMM time (ms) for [m,k] @ [k,n] from the profile's peak and efficiencies.

        The peak is the best measured TFLOP/s on the ``op`` curve (or 100 TFLOP/s, unmeasured);
        the efficiency is the product of the K and N efficiencies.
        """
        r = self.rule(op)
        peak = max(r.curve.get("tflops") or [100.0])
        eff_n = self.efficiency(op, n)
        eff_k = self.efficiency("gemm_k", k) if "gemm_k" in self.ops else 1.0
        flops = 2.0 * m * k * n
        return flops / (peak * 1e12 * eff_n * eff_k) * 1e3

    @property
    def launch_us_or_default(self) -> float:
        return float(self.launch_us) if self.launch_us is not None else DEFAULT_LAUNCH_US

    @property
    def aux_us_or_default(self) -> float:
        return float(self.aux_us) if self.aux_us is not None else DEFAULT_AUX_US

    @property
    def copy_gbps_or_default(self) -> float:
        return float(self.copy_gbps) if self.copy_gbps is not None else DEFAULT_COPY_GBPS

    def latency_note(self) -> str | None:
        """A line saying which launch constants are defaults, or None when all were measured."""
        missing = [k for k in ("launch_us", "copy_gbps", "aux_us") if getattr(self, k) is None]
        if not missing:
            return None
        return (
            f"profile {self.id!r} has no measured {', '.join(missing)}: the latency model uses the defaults "
            f"launch_us={DEFAULT_LAUNCH_US}, copy_gbps={DEFAULT_COPY_GBPS:g}, aux_us={DEFAULT_AUX_US} "
            "(re-run gac profile on the GPU to measure them)"
        )

    def fused_lowrank_at(self, rows: int) -> tuple[float, float] | None:
        """``(launch_us, gbps)`` of the fused low-rank kernel at ``rows`` token rows.

        None where the profile knows no fused kernel, or the kernel is not dispatched at ``rows``.
        """
        fl = self.fused_lowrank
        if not fl or int(rows) not in fl["rows"]:
            return None
        return float(fl["launch_us"]), float(fl["gbps"])

    def gemv_kernel_at(self, row_class: int) -> tuple[float, float] | None:
        """``(launch_us, gbps)`` of the Triton decode GEMV's fit at ``row_class`` (a row class of its
        dispatch table), None where the profile has none there."""
        r = (self.gemv_kernel.get("rows") or {}).get(str(int(row_class)))
        return (float(r["launch_us"]), float(r["gbps"])) if r else None

    def prefill_attention_ms(self, batch: int, seq: int, q_width: int, head_dim: int) -> float | None:
        """Milliseconds of one layer's prefill attention over ``batch x seq`` tokens, from the measured
        ``prefill_attention`` points (None where the profile has none).

        Interpolated log-linearly in batch and sequence between the measured points (beyond them: linear in
        the batch, quadratic in the sequence), scaled by the query width over the measured geometry's and by
        the ``sdpa_head_dim`` efficiency of the measured head_dim over ``head_dim``'s.
        """
        pa = self.prefill_attention
        if not pa:
            return None
        h, _, d = (int(x) for x in pa["geometry"])
        table = {(int(p["batch"]), int(p["seq"])): float(p["us"]) for p in pa["points"]}
        bs, ss = sorted({b for b, _ in table}), sorted({s for _, s in table})
        s = min(max(seq, ss[0]), ss[-1])
        b = min(max(batch, bs[0]), bs[-1])
        t = _log_interp(bs, b, lambda bb: _log_interp(ss, s, lambda x: table[(bb, x)]))
        t *= (seq / s) ** 2 * batch / b * q_width / (h * d)
        if "sdpa_head_dim" in self.ops and head_dim != d:
            t *= self.efficiency("sdpa_head_dim", d) / max(self.efficiency("sdpa_head_dim", head_dim), 1e-6)
        return t * 1e-3

    def peak_tflops(self) -> float:
        """The best measured TFLOP/s on any operator class's curve (100 where none is measured)."""
        peak = max((max(r.curve.get("tflops") or [0.0]) for r in self.ops.values()), default=0.0)
        return float(peak) if peak > 0 else 100.0

    def latent_rates(self, key_group: int = 1, rows: int = 0) -> dict[str, Any]:
        """How a latent decode attention call of key group size ``key_group`` is priced on this profile.

        ``{"source", "launch_us", "gbps", "tflops", "block_r", "rank_round", "key_group", "wide"}``: the
        measured ``latent_attention`` class's row of the smallest measured key group size at or above
        ``key_group`` (else the largest: the kernel's launch table is laid out the same way),
        ``source`` ``"measured"``; where the call's key group has ``rows`` query rows (its KV heads times
        the query heads of each) past the class's ``wide.rows_over``, its ``wide`` rows (timed on a
        geometry with that many: the kernel splits such a group into programs of fewer), ``wide`` True.
        Else the roofline of the profile (``source`` ``"roofline (not profiled)"``: the peak tensor
        FLOP/s of :meth:`peak_tflops` for the rebuild, the copy bandwidth for the latent bytes, one GEMM
        launch and no rank padding). ``tflops`` None: the rebuild's FLOPs cost nothing on top of the bytes.
        """
        cls = self.latent_class(rows)
        table = cls.get("groups") or {}
        if table:
            gs = sorted(int(g) for g in table)
            g = min((x for x in gs if x >= key_group), default=gs[-1])
            r = table[str(g)]
            return {"source": "measured", "launch_us": float(r["launch_us"]), "gbps": float(r["gbps"]),
                    "tflops": r.get("tflops"), "block_r": int(r.get("block_r") or 1),
                    "rank_round": int(cls.get("rank_round") or 1), "key_group": g,
                    "wide": cls is not self.latent_attention}  # fmt: skip
        return {"source": "roofline (not profiled)", "launch_us": self.launch_us_or_default,
                "gbps": self.copy_gbps_or_default, "tflops": self.peak_tflops(), "block_r": 1,
                "rank_round": 1, "key_group": key_group, "wide": False}  # fmt: skip

    def latent_class(self, rows: int = 0) -> dict[str, Any]:
        """The ``latent_attention`` class (``{}`` if not measured) that prices calls whose key groups have
        ``rows`` query rows: its ``wide`` rows past their ``rows_over``, else the class itself."""
        cls = self.latent_attention or {}
        wide = cls.get("wide") or {}
        if rows and wide.get("groups") and int(rows) > int(wide.get("rows_over") or 0):
            return wide
        return cls

    def _key_calls(self, key_group: int, rows: int) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """The class row's rates and the calls it timed for that row (none on the roofline)."""
        rates = self.latent_rates(key_group, rows)
        if rates["source"] != "measured":
            return rates, []
        calls = (self.latent_class(rows).get("fit") or {}).get("calls") or []
        return rates, [c for c in calls if int(c.get("key_group", 0)) == int(rates["key_group"])]

    def key_rank_penalty(self, key_group: int = 1, rows: int = 0) -> float | None:
        """The measured class's median time of a key rank just short of its rank tile (within one
        ``rank_round``, as its ``G·hd/2 - 8`` calls are) over the tile's own time at the same shapes; None
        where the class timed no such pair (or there is no class). 1.09-1.10 at key group 4 on the shipped
        H100 and H200 classes, 1.01-1.04 at key groups 1 and 2."""
        rates, calls = self._key_calls(key_group, rows)
        times = {  # the calls with values at the key's rank
            (int(c["rank"]), int(c["batch"]), int(c["kv"])): float(c["us"])
            for c in calls
            if c.get("us") and int(c.get("rank_v", c["rank"])) == int(c["rank"])
        }
        tile, near = int(rates.get("block_r") or 1), max(int(rates.get("rank_round") or 1), 1)
        ratios = []
        for (r, b, kv), us in times.items():
            full = -(-r // tile) * tile
            if tile > 1 and r % tile and full - r < near and (full, b, kv) in times:
                ratios.append(us / times[(full, b, kv)])
        return float(statistics.median(ratios)) if ratios else None

    def key_rank_tile(self, key_group: int = 1, rows: int = 0) -> int:
        """The rank tile a rebuilt key's rank aligns to (PaLU's latent keys): the ``block_r`` the measured
        ``latent_attention`` class ran this key group size in, where a rank just short of it took at least the
        tile's time (:meth:`key_rank_penalty` >= 1: fewer cache bytes, no faster); 1 (no tile) on the roofline,
        or where the class timed no such pair or the short rank ran faster.

        The decode kernel rebuilds keys in ``block_r``-wide rank chunks: a rank short of a chunk pays the whole
        chunk's FLOPs, and the key latent rows of a layer whose ranks are not multiples of it no longer start on
        128-byte lines. On an H200 a key rank of 248 took 1.08-1.12x the time of 256 at key group 4 from 16
        sequences (values at 248: 1.01-1.04x; ``benchmarks/results/h200/palu-default/call5/ranks/``).

        >>> default_profile("bfloat16").key_rank_tile(4)
        1
        """
        pen = self.key_rank_penalty(key_group, rows)
        return (
            int(self.latent_rates(key_group, rows).get("block_r") or 1)
            if pen is not None and pen >= 1.0
            else 1
        )

    def timed_key_rank(self, key_group: int = 1, rows: int = 0) -> int | None:
        """The largest key rank (as the kernel ran it, ``rank_run``) the measured ``latent_attention`` class timed
        for the row of ``key_group`` (and ``rows`` query rows: the class or its ``wide`` rows); None where it timed
        none (no class: the roofline)."""
        _, calls = self._key_calls(key_group, rows)
        return max((int(c.get("rank_run") or c.get("rank") or 0) for c in calls), default=None)

    def kernel_rank_limit(
        self, key_group: int = 1, rows: int = 0, head_dim: int | None = None
    ) -> dict[str, Any] | None:
        """Where the measured class ran a key group's smaller key ranks on one decode kernel and its larger ones on
        another (each timed call records the kernel that ran it), the largest key rank and value rank it timed on the
        first: ``{"key", "value", "kernel", "past", "why"}``; None where its calls name no kernel, where one kernel
        ran every rank, with no class (the roofline), or where ``head_dim`` is given and the class timed another (the
        Hopper kernel serves head_dim 128 alone: a model of another runs every rank on the Triton one).

        On the shipped H200 class, key group 4 (and its ``wide`` rows) ran key rank 128 with values up to 384 on the
        Hopper kernel and key ranks 248-256 on the Triton one ("the up-projections of a program stay on chip up to
        rank 128"). With PaLU's ranks capped there (its ``bind_profile``, ``--align gac``'s default) the Llama-3-8B
        shape decoded at 0.94-1.10x dense, where the search's key ranks of 192-256 read 0.85-0.97x, at the same cache
        size (``benchmarks/results/h200/palu-default/README.md``, calls
        67 and 56). Key groups 1 and 2 ran every rank on one kernel: no limit there.

        >>> load_profile("h200-bfloat16").kernel_rank_limit(4, 16)["key"], default_profile().kernel_rank_limit(4)
        (128, None)
        """
        _, calls = self._key_calls(key_group, rows)
        geom = (self.latent_class(rows).get("fit") or {}).get("geometry") or {}
        if head_dim is not None and int(geom.get("head_dim") or 0) != int(head_dim):
            return None
        by: dict[str, list[dict[str, Any]]] = {}
        for c in calls:
            k = (c.get("launch") or {}).get("kernel")
            if not k:
                return None
            by.setdefault(str(k), []).append(c)
        if len(by) < 2:
            return None

        def rank(c: dict[str, Any]) -> int:
            return int(c.get("rank_run") or c.get("rank") or 0)

        # the kernel of the smallest rank, and whether every rank past its largest ran elsewhere
        first = min(by, key=lambda k: min(rank(c) for c in by[k]))
        top = max(rank(c) for c in by[first])
        past = [c for k, cs in by.items() if k != first for c in cs]
        if not past or min(rank(c) for c in past) <= top:
            return None
        why = next((c["launch"].get("gluon_refused") for c in past if c["launch"].get("gluon_refused")), None)
        return {
            "key": top,
            "value": max(int(c.get("rank_v") or c.get("rank") or 0) for c in by[first]),
            "kernel": first,
            "past": sorted({str(c["launch"]["kernel"]) for c in past}),
            "why": why,
        }

    def key_rank_modulus(self, modulus: int, key_group: int, rows: int, width: int) -> int:
        """The modulus of a rebuilt key rank (PaLU's latent keys) of a group ``width`` wide: ``modulus`` (its
        projection's), and where the group is wider than the kernel's key rank tile (:meth:`key_rank_tile`), the
        least common multiple with it. The one rule ``--align gac``, ``gac analyze`` and ``gac repair`` hold key
        ranks to.

        >>> default_profile("bfloat16").key_rank_modulus(8, 4, 16, 512)
        8
        """
        tile = self.key_rank_tile(key_group, rows)
        return math.lcm(modulus, tile) if 1 < tile < width else modulus

    # ------------------------------------------------------------------- I/O
    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "schema": self.schema,
            "id": self.id,
            "measured": self.measured,
            "label": self.label,
            "dtype": self.dtype,
            "env": self.env,
        }
        for k in ("launch_us", "copy_gbps", "aux_us"):
            if getattr(self, k) is not None:
                d[k] = getattr(self, k)
        if self.latency_fit:
            d["latency_fit"] = self.latency_fit
        if self.fused_lowrank:
            d["fused_lowrank"] = self.fused_lowrank
        if self.latent_attention:
            d["latent_attention"] = self.latent_attention
        for k in ("gemv_kernel", "prefill_attention"):
            if getattr(self, k):
                d[k] = getattr(self, k)
        d["ops"] = {k: v.to_dict() for k, v in self.ops.items()}
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Profile:
        if d.get("schema") != SCHEMA:
            raise GacError(f"not a gac profile (schema {d.get('schema')!r}, expected {SCHEMA!r})")
        return cls(
            id=str(d["id"]),
            ops={k: OpRule.from_dict(v) for k, v in d.get("ops", {}).items()},
            measured=bool(d.get("measured", False)),
            label=str(d.get("label", "")),
            dtype=str(d.get("dtype", "float16")),
            env=dict(d.get("env", {})),
            launch_us=_opt_float(d.get("launch_us")),
            copy_gbps=_opt_float(d.get("copy_gbps")),
            aux_us=_opt_float(d.get("aux_us")),
            latency_fit=dict(d.get("latency_fit") or {}),
            fused_lowrank=_fused_lowrank(d.get("fused_lowrank"), str(d["id"])),
            latent_attention=_latent_attention(d.get("latent_attention"), str(d["id"])),
            gemv_kernel=_gemv_kernel(d.get("gemv_kernel"), str(d["id"])),
            prefill_attention=_prefill_attention(d.get("prefill_attention"), str(d["id"])),
        )

    def save(self, path: str | Path) -> None:
        atomic_write_text(Path(path), json.dumps(self.to_dict(), indent=1))


def _opt_float(x: Any) -> float | None:
    return None if x is None else float(x)


def _fused_lowrank(x: Any, pid: str) -> dict[str, Any]:
    """A profile's ``fused_lowrank`` entry, checked (``{}`` when absent)."""
    if not x:
        return {}
    try:
        out = {**x, "launch_us": float(x["launch_us"]), "gbps": float(x["gbps"]),
               "rows": sorted({int(r) for r in x["rows"]})}  # fmt: skip
    except (KeyError, TypeError, ValueError) as e:
        raise GacError(f"profile {pid!r}: fused_lowrank needs launch_us, gbps and rows ({e})") from None
    if not (out["launch_us"] >= 0 and out["gbps"] > 0 and out["rows"] and min(out["rows"]) >= 1):
        raise GacError(f"profile {pid!r}: fused_lowrank has a negative time, no bandwidth or no rows: {x}")
    return out


def _latent_attention(x: Any, pid: str) -> dict[str, Any]:
    """A profile's ``latent_attention`` entry, checked (``{}`` when absent)."""
    if not x:
        return {}
    try:
        rows = {}
        for g, r in x["groups"].items():
            tf = r.get("tflops")
            rows[str(int(g))] = {**r, "launch_us": float(r["launch_us"]), "gbps": float(r["gbps"]),
                                 "tflops": None if tf is None else float(tf), "block_r": int(r.get("block_r") or 1)}  # fmt: skip
        out = {**x, "groups": rows, "rank_round": int(x.get("rank_round") or 1)}
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise GacError(
            f"profile {pid!r}: latent_attention needs groups of launch_us, gbps and tflops ({e!r})"
        ) from None
    bad = [g for g, r in rows.items() if int(g) < 1 or not (r["launch_us"] >= 0 and r["gbps"] > 0)
           or (r["tflops"] is not None and not r["tflops"] > 0) or r["block_r"] < 1]  # fmt: skip
    if not rows or bad or out["rank_round"] < 1:
        raise GacError(
            f"profile {pid!r}: latent_attention has no key group row, or one with a negative time, no "
            f"bandwidth, or a rate or rank tile that is not positive: {x}"
        )
    if x.get("wide"):
        wide = _latent_attention({k: v for k, v in x["wide"].items() if k != "rows_over"}, pid)
        try:
            over = int(x["wide"]["rows_over"])
        except (KeyError, TypeError, ValueError):
            raise GacError(f"profile {pid!r}: latent_attention.wide needs rows_over (query rows)") from None
        out["wide"] = {**wide, "rows_over": over}
    return out


def _log_interp(xs: list[int], x: float, f: Callable[[int], float]) -> float:
    """``f`` between the two measured ``xs`` around ``x`` (sorted, ``x`` within them), linear in log-log."""
    j = max(i for i, v in enumerate(xs) if v <= x)
    lo, hi = xs[j], xs[min(j + 1, len(xs) - 1)]
    if hi == lo:
        return f(lo)
    w = (math.log(x) - math.log(lo)) / (math.log(hi) - math.log(lo))
    return math.exp(math.log(f(lo)) + (math.log(f(hi)) - math.log(f(lo))) * w)


def _gemv_kernel(x: Any, pid: str) -> dict[str, Any]:
    """A profile's ``gemv_kernel`` entry, checked (``{}`` when absent)."""
    if not x:
        return {}
    try:
        rows = {str(int(c)): {**r, "launch_us": float(r["launch_us"]), "gbps": float(r["gbps"])}
                for c, r in x["rows"].items()}  # fmt: skip
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise GacError(f"profile {pid!r}: gemv_kernel needs rows of launch_us and gbps ({e!r})") from None
    if not rows or any(int(c) < 1 or not (r["launch_us"] >= 0 and r["gbps"] > 0) for c, r in rows.items()):
        raise GacError(
            f"profile {pid!r}: gemv_kernel has no row class, or one with a negative time or no bandwidth"
        )
    return {**x, "rows": rows}


def _prefill_attention(x: Any, pid: str) -> dict[str, Any]:
    """A profile's ``prefill_attention`` entry, checked (``{}`` when absent): a full grid of batches x sequences."""
    if not x:
        return {}
    try:
        geo = [int(v) for v in x["geometry"]]
        pts = [
            {**p, "batch": int(p["batch"]), "seq": int(p["seq"]), "us": float(p["us"])} for p in x["points"]
        ]
    except (KeyError, TypeError, ValueError) as e:
        raise GacError(
            f"profile {pid!r}: prefill_attention needs geometry and points of batch, seq, us ({e!r})"
        ) from None
    grid = {(p["batch"], p["seq"]) for p in pts}
    full = {(b, s) for b in {p["batch"] for p in pts} for s in {p["seq"] for p in pts}}
    if len(geo) != 3 or min(geo) < 1 or not pts or grid != full or min(p["us"] for p in pts) <= 0:
        raise GacError(f"profile {pid!r}: prefill_attention needs a geometry of three positive ints and a full "
                       "grid of batches x sequences with positive times")  # fmt: skip
    return {**x, "geometry": geo, "points": pts}


def default_profile(dtype: str = "float16") -> Profile:
    """The conservative built-in contract: multiples of 8, prefer 16. Not measured."""
    return Profile(
        id=f"builtin-default-{dtype}",
        ops={op: OpRule() for op in OPS},
        measured=False,
        label="built-in default (NOT measured): multiples of 8, prefer 16",
        dtype=dtype,
    )


def shipped_profiles() -> list[Path]:
    """Measured profiles shipped inside the package (``gac/profiles/*.json``)."""
    root = resources.files("gac") / "profiles"
    try:
        return sorted(Path(str(p)) for p in root.iterdir() if str(p).endswith(".json"))
    except (FileNotFoundError, NotADirectoryError):
        return []


def load_profile(spec: str | Path | None = None, dtype: str = "bfloat16", gpu: str | None = None) -> Profile:
    """Load a profile.

    Args:
        spec: a JSON path, the id of a shipped profile, ``"default"``, or None (auto: the
            shipped profile matching ``gpu`` and ``dtype``, else the built-in default).
        dtype: used for auto selection.
        gpu: GPU name for auto selection (defaults to the current CUDA device, if any).
    """
    if spec is not None and str(spec) != "auto":
        if str(spec) == "default":
            return default_profile(dtype)
        p = Path(spec)
        if p.is_file():
            try:
                return Profile.from_dict(json.loads(p.read_text()))
            except json.JSONDecodeError as e:
                raise GacError(f"profile {p} is not valid JSON: {e}") from None
        for sp in shipped_profiles():
            prof = Profile.from_dict(json.loads(sp.read_text()))
            if prof.id == str(spec) or sp.stem == str(spec):
                return prof
        known = ", ".join(sp.stem for sp in shipped_profiles()) or "none"
        raise GacError(
            f"no profile {str(spec)!r}: not a file and not a shipped profile (shipped: {known}; or 'default')"
        )
    if gpu is None:
        try:
            import torch

            gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else None
        except Exception:  # noqa: BLE001 - no usable CUDA means no auto match
            gpu = None
    candidates = [Profile.from_dict(json.loads(sp.read_text())) for sp in shipped_profiles()]
    if gpu:
        key = gpu.lower()
        same_gpu = [p for p in candidates if str(p.env.get("gpu", "")).lower() == key]
        for p in same_gpu:
            if p.dtype == dtype:
                return p
        if same_gpu:
            return same_gpu[0]
    return default_profile(dtype)


def predicted_speedup(profile: Profile, op: str, before: list[int], after: list[int]) -> float:
    """Ratio of summed predicted costs (dim / efficiency) before and after a change of dims.

    A crude but profile-driven estimate for reports: each dim's work is taken as proportional
    to the dim itself, slowed by its predicted efficiency.
    """
    t0 = sum(d / profile.efficiency(op, d) for d in before)
    t1 = sum(d / profile.efficiency(op, d) for d in after)
    return t0 / t1 if t1 > 0 else math.nan
