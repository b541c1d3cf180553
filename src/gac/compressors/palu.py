"""``palu`` (Chang et al., EMNLP 2024, "Palu: KV-cache compression with low-rank projection").

Written after the paper and ``shadowpa0327/Palu`` (``palu/rank_search.py``,
``palu/decomposition.py``, ``palu/model/modules/svd_linear.py``, ``kernel/palu_attention.py``);
none of its code is copied.

* **What is factorized.** Only ``k_proj`` and ``v_proj``, by group-head low-rank decomposition
  (G-LRD): the KV heads are split into groups of ``group_size`` heads (default 4, the reference's;
  1 = per head "M-LRD", all KV heads = joint "J-LRD"); each group's rows ``W_g [G·hd, hidden]``
  get their own rank ``r_g``. The model then caches ``Σ r_g`` latents per token and projection
  (:mod:`gac.nn.latent`). Keys and values may be grouped apart
  (``k_group_size``/``v_group_size``, each defaulting to ``group_size``): keys are rebuilt from
  their latents at every decode step (``G_k·hd/2`` FLOP per latent byte), values never are.
* **Layouts.** q/k/v/o projections with a key bias (Qwen2: the bias is the up-projection's, added
  before RoPE) or a per-head key norm (Qwen3, Gemma-3: the latent stays linear, the rebuilt key rows
  are RMS-normalized before RoPE). Refused by name, before any work: a norm over all heads jointly
  (OLMo-2), partial rotary, sliding-window and cross attention, fused qkv.
* **Decomposition.** The reference default ``whiten``: SVD-LLM's truncation-aware whitening with
  the Cholesky factor of the projection input's Gram matrix (gac's
  :func:`~gac.compressors.svdllm.whitening_factor` and
  :func:`~gac.compressors.lowrank.truncated_factors`). ``decompose="svd"`` is plain SVD.
* **Rank search** (the native allocation), the reference's three methods with
  ``target = ratio · Σ max_dim`` latent dims:

  - ``fisher_uniform`` (default): one Fisher score per projection (all KV heads as one group), a
    rank per projection proportional to it (floored, capped at full rank, the shortfall added one
    by one in the reference's order), then split evenly (integer division) over its groups;
  - ``fisher``: the same per group;
  - ``uniform``: ``ratio · G·hd`` for every group.

  Fisher information is the reference's: ``sqrt(mean over batches of grad²)`` of each weight
  under the language-modelling loss, averaged over a group's rows.
* **Rank caps** (not the reference's): ``key_rank_max`` / ``value_rank_max`` cap every key / value group's rank. The
  search runs with the caps as its groups' full ranks, so what a capped group gives up goes to the others in the
  reference's order and the budget is still spent; a key group the uncapped search keeps past 7/8 of its width keeps
  it whole (cached raw), and every strategy's candidates stop at the cap
  (:func:`gac.allocation.strategies._candidates`). Under ``--align gac`` with neither given, the caps come from the
  profile (:meth:`PaluCompressor.bind_profile`): where its ``latent_attention`` class timed a key group's smaller
  key ranks on one decode kernel and its larger ones on another, the largest key and value ranks timed on the first
  (keys 128 and values 384 at key group 4 on the shipped H200 profiles, where the Hopper kernel keeps a program's
  up-projections on chip up to rank 128; none on the H100 profile, whose calls predate the kernel's record).
  ``-O kernel_caps=false`` turns that off. On an H200 the default decode grid then read 0.94-1.10x dense on the
  Llama-3-8B shape and 0.89-1.09x on Qwen2.5-7B's, where the search's key ranks (192-256 in its first rebuilt
  layers) read 0.85-0.97x and 0.78-1.05x (``benchmarks/results/h200/palu-default/README.md``, calls 67-68 against
  56-57). Only for head_dim 128, the one the class timed: SmolLM2 (64) takes none, and its keys take 19-91 of 192
  anyway (``benchmarks/results/cpu/palu_default_smollm2_h200.json``).
* **Rounding.** The reference rounds every group rank to a multiple of 32 after the search
  (``max(1, round(r/32))·32``), which moves it off the budget. That is what ``--align round``
  does for this compressor (``Site.meta["round_multiple"]``); ``none`` is the search's raw ranks.
* **Sites and costs.** One site per (layer, K or V, group); the cost of a site is its latent
  width (values cached per token), so the budget is the KV-cache budget. A key site also records
  ``meta["rebuild_flops_per_dim_per_cached_token"] = 2·G_k·hd`` (the decode rebuild). At a decode
  serving shape the latency guard prices each site's share of the cache read and the keys' rebuild
  (:func:`gac.hardware.latency.site_cache_ms`: the profile's ``latent_attention`` class, else its
  roofline), against the dense group's cache read. Under ``--align gac`` a key group's ranks are also
  multiples of the decode kernel's rank tile where the profile's class timed a rank short of it no
  faster (:func:`gac.hardware.latency.site_modulus`: 64 on the shipped H100 and H200 profiles), and
  none past the ranks the class timed (:func:`gac.allocation.strategies.raw_key_candidates`: the raw
  keys instead). The knapsack's value is
  the Fisher-weighted truncation loss: ``F̄_g · Σ_{i>=d} σ_i² / tokens`` on the whitened spectrum.

Settings that differ from the reference, and why: calibration uses gac's calibration windows for
both the Fisher pass and the whitening Gram (the reference uses 32 x 1024 Wikitext-2 windows for
Fisher and 256 x 2048 for whitening); the Fisher pass runs in the model's dtype (the reference
casts to float16 on the GPU).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from typing import Any

import numpy as np
import torch
from torch import nn

from gac.compressors.base import Compressor, kept_dim, register_compressor
from gac.compressors.calibration import LinearStats, linear_stats_hook
from gac.compressors.lowrank import svd_dtype_for, tail_energy_curve, truncated_factors
from gac.compressors.svdllm import whitening_factor
from gac.errors import GacError
from gac.models.adapters import model_rotary
from gac.nn.latent import ONE_GEMM_MAX_MACS
from gac.sites import Site
from gac.utils import track

log = logging.getLogger(__name__)

SEARCH_METHODS = ("fisher_uniform", "fisher", "uniform")
DECOMPOSE = ("whiten", "svd")
#: the reference's rank rounding (``rounding_search_result(block_size=32)``)
REF_ROUND = 32
DEFAULT_GROUP_SIZE = 4


def fisher_ranks(scores: list[float], caps: list[int], target: int) -> list[int]:
    """The reference's proportional rank search: ``floor(target·F_i/ΣF)`` capped, then +1 one by one.

    The shortfall is handed out one rank at a time over the entries sorted by ascending
    ``float_rank - rank`` (the reference's order), skipping full-rank entries, until the target is
    reached. ``target`` is an integer here, so the result never exceeds it.

    >>> fisher_ranks([1.0, 3.0], [100, 100], 50)
    [13, 37]
    """
    total = float(sum(scores))
    if total <= 0 or not math.isfinite(total):
        raise GacError("palu: Fisher information is zero or not finite (no gradient reached K/V?)")
    floats = [target * s / total for s in scores]
    ranks = [min(c, math.floor(f)) for f, c in zip(floats, caps, strict=True)]
    order = sorted(range(len(ranks)), key=lambda i: floats[i] - ranks[i])
    dif = target - sum(ranks)
    while dif > 0:
        moved = False
        for i in order:
            if ranks[i] >= caps[i]:
                continue
            ranks[i] += 1
            dif -= 1
            moved = True
            if dif == 0:
                break
        if not moved:
            break
    return ranks


def round_reference(r: int, block: int = REF_ROUND) -> int:
    """``max(1, round(r / block)) · block`` (Python's round: half to even, as the reference)."""
    return max(1, round(r / block)) * block


def _gemm_launches(groups: int, kind: str, fold_values: bool) -> dict[str, float]:
    """One PaLU group's GEMM launches: kept dense, latent at a prefill (its own up-projection, or its share of
    the one block-diagonal GEMM of a prompt of few rows: :meth:`gac.nn.latent.LatentProjection.one_gemm`),
    latent at a decode step.

    >>> _gemm_launches(2, "k", False), _gemm_launches(2, "v", False)["decode"], _gemm_launches(2, "v", True)["decode"]
    ({'dense': 0.5, 'prefill': 1.5, 'prefill_one_gemm': 1.0, 'decode': 0.5}, 1.5, 0.5)
    """
    share = 1.0 / groups
    rebuilt_in_kernel = kind == "k" or (kind == "v" and fold_values)
    return {
        "dense": share,
        "prefill": share + 1.0,
        "prefill_one_gemm": share + 1.0 / groups,
        "decode": share + (0.0 if rebuilt_in_kernel else 1.0),
    }


@register_compressor("palu")
class PaluCompressor(Compressor):
    """Group-head low-rank K/V projections with a latent KV cache."""

    # What the latency guard's refusal adds. A smaller KV cache pays in memory where its decode is slower (on an H200,
    # Llama-3-8B shape at 32k: 1.95x the sequences at 1.05x dense's tokens/s, benchmarks/results/h200/palu-default/
    # capacity-call60/); key and value groups of two KV heads, where the Hopper kernel serves every rebuilt layer,
    # decoded at 0.93-1.31x dense on the Llama-3-8B and Qwen2.5-7B shapes and served 1.65x dense's tokens/s at 32k, but
    # prefilled a 128-token prompt at 0.94x (0.87x before its rebuild took one GEMM), and the latency model prices
    # their decode at the default serving shapes (512 cached tokens) below dense (up to 17% pessimistic at long
    # context), so the guard refuses them as well (H200, calls 42-44, 55 and 58-59 of that folder:
    # keygroup2-values2-decode-call58-59/, capacity-keygroup2-values2-call55/, call43/, call44/).
    CAPACITY_HINT = (
        "PaLU's smaller cache may still pay in memory: compressed with --allow-slower, `gac eval infer --variant DIR "
        "--baseline-model-id MODEL --capacity-context 32768 --out R` measures the most sequences that fit, and "
        "their tokens/s, beside dense"
    )
    GROUPS2_RECORD = (
        "decoded at 0.93-1.31x dense from 4k cached tokens on the Llama-3-8B and Qwen2.5-7B shapes, and at 1.65x "
        "dense's tokens/s in the same memory at 32k (H200), but prefilled a 128-token prompt at 0.94x"
    )
    refusal_hint = (
        CAPACITY_HINT
        + "; and on a Hopper GPU, key and value groups of 2 KV heads (-O k_group_size=2 -O v_group_size=2 "
        "--allow-slower; their quality is unmeasured) " + GROUPS2_RECORD
    )

    #: what the default's kernel rank caps were measured at (:meth:`bind_profile`), said where the guard refuses them
    CAPPED_RECORD = (
        "with the kernel rank caps set here, key group 4 decoded the Llama-3-8B and Qwen2.5-7B shapes at 0.94-1.10x "
        "and 0.89-1.09x dense from 4k cached tokens on an H200 (1.05-1.10x on Llama from 16 sequences past 16k), "
        "where the latency model prices it below dense (0.91-0.98x at 512 cached tokens): --allow-slower compresses "
        "anyway"
    )

    def refusal(self) -> str:
        """:attr:`refusal_hint` for the model :meth:`sites` read: groups of 2 are named only where they divide its
        KV heads, and a model already grouped so is told what such groups were measured at, and that they need
        ``--allow-slower`` (the latency model prices their decode below dense). Where the profile set the kernel rank
        caps (:meth:`bind_profile`), :attr:`CAPPED_RECORD` comes first."""
        hint = self._refusal()
        return f"{self.CAPPED_RECORD}; {hint}" if (self.rank_max_from or "").startswith("profile") else hint

    def _refusal(self) -> str:
        kvh = int((getattr(self, "_geom", None) or {}).get("kv_heads") or 0)
        if not kvh:
            return self.refusal_hint
        if self._gsize.get("k") == 2 and self._gsize.get("v") == 2:
            return (
                f"{self.CAPACITY_HINT}; key and value groups of 2 KV heads, as here, {self.GROUPS2_RECORD} on a "
                "Hopper GPU, where the latency model prices their decode at short contexts below dense (up to 17% "
                "pessimistic at long context): they need --allow-slower"
            )
        if kvh % 2:
            return self.CAPACITY_HINT
        return self.refusal_hint

    def __init__(
        self,
        group_size: int | None = None,
        k_group_size: int | None = None,
        v_group_size: int | None = None,
        search: str = "fisher_uniform",
        decompose: str = "whiten",
        fold_values: bool = False,
        svd_dtype: str | None = None,
        key_rank_max: int | None = None,
        value_rank_max: int | None = None,
        kernel_caps: bool = True,
    ) -> None:
        if search not in SEARCH_METHODS:
            raise GacError(f"palu: search must be one of {', '.join(SEARCH_METHODS)}, got {search!r}")
        if decompose not in DECOMPOSE:
            raise GacError(f"palu: decompose must be one of {', '.join(DECOMPOSE)}, got {decompose!r}")
        for name, gs in (
            ("group_size", group_size),
            ("k_group_size", k_group_size),
            ("v_group_size", v_group_size),
        ):
            if gs is not None and int(gs) < 1:
                raise GacError(f"palu: {name} must be a positive number of KV heads, got {gs}")
        for name, cap in (("key_rank_max", key_rank_max), ("value_rank_max", value_rank_max)):
            if cap is not None and (isinstance(cap, bool) or int(cap) != cap or int(cap) < 1):
                raise GacError(f"palu: {name} must be a positive whole rank, got {cap!r}")
        #: the largest rank a key / value group may take (None: its width), but a key group the search keeps past
        #: RAW_KEY_SHARE of its width, which keeps it whole (cached raw): :meth:`native_allocation`
        self.rank_max = {
            "k": None if key_rank_max is None else int(key_rank_max),
            "v": None if value_rank_max is None else int(value_rank_max),
        }
        #: where the caps came from: "option", the profile's class (:meth:`bind_profile`), or None (no caps)
        self.rank_max_from: str | None = (
            "option" if any(v is not None for v in self.rank_max.values()) else None
        )
        #: under --align gac, with neither cap given: the caps of the profile's decode kernel (:meth:`bind_profile`)
        self.kernel_caps = bool(kernel_caps)
        self.group_size = None if group_size is None else int(group_size)
        #: key and value group sizes (each defaults to ``group_size``)
        self.k_group_size = self.group_size if k_group_size is None else int(k_group_size)
        self.v_group_size = self.group_size if v_group_size is None else int(v_group_size)
        self.search = search
        self.decompose = decompose
        self.fold_values = bool(fold_values)
        self.svd_dtype = svd_dtype
        self._layers: dict[int, dict[str, Any]] = {}
        self._gram: dict[int, torch.Tensor] = {}
        self._tokens = 0
        self._fisher: dict[str, torch.Tensor] = {}
        self._spectra: dict[str, torch.Tensor] = {}
        self._chols: dict[int, torch.Tensor | None] = {}
        self._gsize: dict[str, int] = {}

    # ------------------------------------------------------------------ sites
    def _group_size(self, kv_heads: int, kind: str) -> int:
        gs = self.k_group_size if kind == "k" else self.v_group_size
        what = {"k": "key", "v": "value"}[kind]
        if gs is not None:
            if kv_heads % gs:
                raise GacError(
                    f"palu: {what} group size {gs} does not divide the model's {kv_heads} KV heads"
                )
            return gs
        g = max(d for d in range(1, min(DEFAULT_GROUP_SIZE, kv_heads) + 1) if kv_heads % d == 0)
        if g != DEFAULT_GROUP_SIZE and kind == "k":
            log.warning("palu: the default group size 4 does not divide %d KV heads; using %d", kv_heads, g)
        return g

    @staticmethod
    def _check_qk_norms(ad: Any, hd: int) -> None:
        """Per-head q/k RMSNorms (Qwen3, Gemma-3) are served; anything else inside attention is refused."""
        if not ad.has_qk_norm:
            return
        attn = ad.model.get_submodule(ad.attention_fqn(0))
        for fqn in ad.qk_norm_fqns(0):
            name = fqn.rsplit(".", 1)[-1]
            norm = ad.model.get_submodule(fqn)
            w = getattr(norm, "weight", None)
            width = int(w.numel()) if w is not None else -1
            if name not in ("q_norm", "k_norm") or getattr(attn, name, None) is not norm:
                raise GacError(
                    f"palu: this {ad.family} model's attention holds a norm {name!r} the latent cache cannot place"
                )
            if width != hd or isinstance(norm, nn.LayerNorm):
                raise GacError(
                    f"palu: this {ad.family} model normalizes {name[0]} over all heads jointly ({name} over "
                    f"{width} features, head_dim {hd}); the latent cache rebuilds keys per group and "
                    "serves only per-head RMS norms"
                )

    def sites(self, model: nn.Module) -> list[Site]:
        from gac.models.adapters import get_adapter

        ad = get_adapter(model)
        missing = [r for r in ("q", "k", "v", "o") if r not in ad.roles]
        if missing:
            raise GacError(
                f"palu needs separate q/k/v/o attention projections; this {ad.family} model has "
                f"{', '.join(ad.roles)} (no {', '.join(missing)})"
            )
        hd, kvh, heads = ad.head_dim, ad.kv_heads, ad.heads
        self._check_qk_norms(ad, hd)
        cfg = ad.config
        window = getattr(cfg, "sliding_window", None)
        layer_types = set(getattr(cfg, "layer_types", None) or [])
        if (window and getattr(cfg, "use_sliding_window", True)) or (layer_types - {"full_attention"}):
            raise GacError(
                f"palu: the latent cache does not support sliding-window attention "
                f"(sliding_window={window}, layer types {sorted(layer_types) or 'unset'})"
            )
        if getattr(cfg, "is_encoder_decoder", False) or getattr(cfg, "add_cross_attention", False):
            raise GacError("palu: the latent cache does not support cross-attention models")
        rotary = model_rotary(model)
        inv = getattr(rotary, "inv_freq", None)
        if inv is not None and 2 * inv.numel() != hd:
            raise GacError(
                f"palu: this {ad.family} model rotates {2 * inv.numel()} of each head's {hd} dims (partial "
                "rotary); the latent cache applies RoPE to whole rebuilt keys"
            )
        gs = self._gsize = {r: self._group_size(kvh, r) for r in ("k", "v")}
        self._layers.clear()
        out: list[Site] = []
        for i in range(ad.num_layers):
            p = ad.projections(i)
            mods = {r: model.get_submodule(p[r]) for r in ("q", "k", "v", "o")}
            for r in ("k", "v"):
                if not isinstance(mods[r], nn.Linear) or mods[r].out_features != kvh * hd:
                    raise GacError(
                        f"palu: {p[r]} is not a dense {kvh * hd}-output projection "
                        f"({type(mods[r]).__name__}); compress the base model"
                    )
            self._layers[i] = {"attn": ad.attention_fqn(i), "fqns": p}
            for r in ("k", "v"):
                for g in range(kvh // gs[r]):
                    gd = gs[r] * hd
                    out.append(
                        Site(
                            name=f"{p[r]}:g{g}",
                            op="lowrank_r",
                            max_dim=gd,
                            unit_cost=1,
                            dense_cost=gd,
                            shape=(gd, ad.hidden),
                            members=(p[r],),
                            meta={
                                "kind": r,
                                "layer": i,
                                "group": g,
                                "round_multiple": REF_ROUND,
                                "flops_per_dim": ad.hidden + gd,  # a down row and an up column
                                # decode: a key dim is rebuilt to G_k·hd outputs for every cached token
                                # (G_k·hd/2 FLOP per latent byte in 16 bits); values are never rebuilt.
                                # The guard prices the cache and the rebuild at decode serving shapes
                                # (gac.hardware.latency.site_cache_ms: the latent_attention class)
                                "rebuild_flops_per_dim_per_cached_token": 2 * gd if r == "k" else 0,
                                "head_dim": hd,
                                "group_kv": gs[r],
                                "key_group": gs["k"],  # the decode kernel's launch row, values too
                                # and the key group's query rows (the class's wide rows past them)
                                "query_rows": gs["k"] * (heads // kvh),
                                # GEMM launches as LatentAttention runs them (allocation.site_ms): the
                                # projection's one GEMM (dense, or the latent down-projection) shared by its
                                # groups, plus a latent group's up-projection; none at decode for keys
                                # (the decode kernel rebuilds them) nor for values folded into o_proj
                                "gemm_launches": _gemm_launches(kvh // gs[r], r, self.fold_values),
                                # a prompt of few rows rebuilds the groups of a projection in one GEMM
                                # (LatentProjection.one_gemm: rows x Σ r x group width within the bound)
                                "one_gemm": {
                                    "max_macs": ONE_GEMM_MAX_MACS,
                                    "groups": kvh // gs[r],
                                    "width": gd,
                                },
                                "params_per_dim": ad.hidden + gd,
                                "dense_params": gd * ad.hidden,
                                "cost_unit": "latent dims per token",
                                # key_rank_max / value_rank_max: the allocation's candidates stop there
                                # (gac.allocation.strategies._candidates)
                                **({"rank_max": self.rank_max[r]} if self.rank_max[r] is not None else {}),
                            },
                        )
                    )
        self._geom = {
            "heads": heads,
            "kv_heads": kvh,
            "head_dim": hd,
            "groups": {r: kvh // gs[r] for r in ("k", "v")},
            "hidden": ad.hidden,
        }
        return out

    def bind_profile(self, sites: list[Site], profile: Any, align: str) -> str | None:
        """Under ``--align gac``, where neither ``key_rank_max`` nor ``value_rank_max`` is given (and ``kernel_caps``
        is on, the default), cap every key / value group at the largest key / value rank the profile's
        ``latent_attention`` class timed on the decode kernel that serves the key group's smaller ranks, where its
        larger ones ran on another (:meth:`gac.hardware.profile.Profile.kernel_rank_limit`: keys 128 and values 384
        at key group 4 on the shipped H200 profiles, for head_dim 128, the one the class timed; none on the H100 one,
        whose calls predate the kernel's record, nor at key groups 1 and 2). The caps then act as the options do (the
        module docstring's "Rank caps"), and the report's options record them with :attr:`rank_max_from`. Returns the
        line that says so (None where no cap was set)."""
        if (
            not self.kernel_caps
            or self.rank_max_from is not None
            or profile is None
            or not sites
            or not align.startswith("gac")
        ):
            return None
        keys = [s for s in sites if s.meta["kind"] == "k"]
        lim = profile.kernel_rank_limit(
            self._gsize["k"], int(keys[0].meta.get("query_rows") or 0), int(keys[0].meta["head_dim"])
        )
        if lim is None:
            return None
        self.rank_max = {"k": int(lim["key"]), "v": int(lim["value"])}
        self.rank_max_from = (
            f"profile {profile.id}: the latent_attention class timed key rank {lim['key']} (values up to "
            f"{lim['value']}) on the {lim['kernel']} kernel and larger key ranks on {', '.join(lim['past'])}"
            + (f": {lim['kernel']} refused {lim['why']}" if lim.get("why") else "")
        )
        for s in sites:
            s.meta["rank_max"] = self.rank_max[s.meta["kind"]]
        bound = [s for s in sites if s.meta["rank_max"] < s.max_dim]
        if not bound:
            return None
        return (
            f"palu: key ranks capped at {lim['key']} and value ranks at {lim['value']}, where profile {profile.id}'s "
            f"latent decode kernel changes ({len(bound)} of {len(sites)} groups are wider; -O kernel_caps=false "
            "lifts the caps)"
        )

    def check_budget(self, sites: list[Site], budget: int, profile: Any, align: str) -> None:
        """Aligned ranks (``gac``) need at least one rank modulus of the profile per group: the projection's, and
        for a key group the latent decode kernel's rank tile where the profile's class shows it
        (:func:`gac.hardware.latency.site_modulus`)."""
        if not align.startswith("gac") or not sites or profile is None:
            return
        from gac.hardware.latency import site_modulus

        mods = [site_modulus(profile, s) for s in sites]
        for s, m in zip(sites, mods, strict=True):
            cap = s.meta.get("rank_max")
            if cap is not None and cap < min(m, s.max_dim):
                what = {"k": "key_rank_max", "v": "value_rank_max"}[s.meta["kind"]]
                raise GacError(
                    f"palu: {what}={cap} is below one rank modulus of the profile ({m}) for {s.name} (align gac); "
                    f"use at least {m}"
                )
        if budget < sum(mods):
            dense = sum(s.max_dim for s in sites)
            m, mk = profile.modulus("lowrank_r"), max(mods)
            each = (
                f"{m}" if mk == m else f"{m} a value group, {mk} a key group (the latent kernel's rank tile)"
            )
            raise GacError(
                f"palu: this KV ratio leaves {budget / len(sites):.1f} latent dims per group, below one rank "
                f"modulus of the profile for each of the {len(sites)} groups ({each}; align gac); use a ratio "
                f">= {sum(mods) / dense:.3f} or larger groups"
            )

    # ------------------------------------------------------------ calibration
    def calibrate(self, model: nn.Module, batches: Iterable[torch.Tensor]) -> None:
        """One pass: the K/V input Gram per layer (whitening) and the Fisher information of K and V.

        Each batch runs forward with hooks on ``k_proj`` (its input is ``v_proj``'s) and backward
        on the language-modelling loss; ``grad²`` of ``k_proj``/``v_proj`` accumulates per weight.
        """
        if not self._layers:
            self.sites(model)
        targets = {}
        for info in self._layers.values():
            for r in ("k", "v"):
                targets[info["fqns"][r]] = model.get_submodule(info["fqns"][r])
        stats: dict[str, LinearStats] = {}
        handles = [
            model.get_submodule(info["fqns"]["k"]).register_forward_hook(
                linear_stats_hook(
                    stats, str(i), model.get_submodule(info["fqns"]["k"]).in_features, gram=True
                )
            )
            for i, info in self._layers.items()
        ]
        saved = {n: p.requires_grad for n, p in model.named_parameters()}
        was_training = model.training
        sq: dict[str, torch.Tensor] = {}
        n_batches = 0
        try:
            for p in model.parameters():
                p.requires_grad_(False)
            for mod in targets.values():  # Fisher: every search but uniform, and the knapsack's value
                mod.weight.requires_grad_(True)
                mod.weight.grad = None
            model.eval()
            dev = next(model.parameters()).device
            for b in track(list(batches), "palu: Fisher information and whitening statistics"):
                b = b.to(dev)
                out = model(input_ids=b, labels=b, use_cache=False)
                if out.loss is None or not out.loss.requires_grad:
                    raise GacError("palu: the model's loss has no gradient path to k_proj/v_proj")
                out.loss.backward()
                for name, mod in targets.items():
                    g2 = mod.weight.grad.detach().to(torch.float32).pow(2)
                    sq[name] = g2 if name not in sq else sq[name] + g2
                    mod.weight.grad = None
                n_batches += 1
        finally:
            for h in handles:
                h.remove()
            for mod in targets.values():
                mod.weight.grad = None
            for nm, p in model.named_parameters():
                p.requires_grad_(saved.get(nm, p.requires_grad))
            model.train(was_training)
        if n_batches == 0:
            raise GacError("palu: calibration gave no windows (text too short for one window?)")
        self._gram = {int(i): st.gram for i, st in stats.items()}
        self._tokens = stats["0"].n_tokens if "0" in stats else 0
        self._fisher = {n: (s / n_batches).sqrt().cpu() for n, s in sq.items()}
        self._spectra.clear()
        self._chols.clear()
        self._model = model

    # ------------------------------------------------------------ statistics
    def _rows(self, site: Site) -> slice:
        gd = site.max_dim
        g = site.meta["group"]
        return slice(g * gd, (g + 1) * gd)

    def group_fisher(self, site: Site) -> float:
        """Mean Fisher information over the site's rows (the reference's per-group score)."""
        f = self._fisher.get(site.members[0])
        if f is None:
            raise GacError(f"palu: no Fisher information for {site.members[0]}; call calibrate() first")
        return float(f[self._rows(site)].double().mean())

    def module_fisher(self, fqn: str) -> float:
        f = self._fisher.get(fqn)
        if f is None:
            raise GacError(f"palu: no Fisher information for {fqn}; call calibrate() first")
        return float(f.double().mean())

    def _chol(self, layer: int) -> torch.Tensor | None:
        if self.decompose != "whiten":
            return None
        if layer not in self._chols:
            g = self._gram.get(layer)
            if g is None:
                raise GacError(f"palu: no whitening statistics for layer {layer}; call calibrate() first")
            self._chols[layer] = whitening_factor(g, f"palu: layer {layer} k/v input")[0]
        return self._chols[layer]

    def _factor_svd(self, model: nn.Module, site: Site):
        lin = model.get_submodule(site.members[0])
        dt = svd_dtype_for(lin.weight.device, self.svd_dtype)
        w = lin.weight.detach()[self._rows(site)].to(dt)
        chol = self._chol(site.meta["layer"])
        if chol is not None:
            chol = chol.to(device=w.device, dtype=dt)
            ws = w @ chol
        else:
            ws = w
        u, s, vh = torch.linalg.svd(ws, full_matrices=False)
        return u, s, vh, chol

    def _spectrum(self, site: Site) -> torch.Tensor:
        if site.name not in self._spectra:
            _, s, _, _ = self._factor_svd(self._model, site)
            self._spectra[site.name] = s.detach().cpu()
        return self._spectra[site.name]

    # --------------------------------------------------------------- curves
    def loss_curve(self, site: Site) -> np.ndarray:
        """``F̄_g · Σ_{i>=d} σ_i² / tokens`` of the group's whitened spectrum (0 at full rank)."""
        return (
            tail_energy_curve(self._spectrum(site), site.max_dim)
            * self.group_fisher(site)
            / max(self._tokens, 1)
        )

    def importance(self, site: Site) -> float:
        return self.group_fisher(site)

    # ---------------------------------------------------------- allocation
    def native_allocation(self, model: nn.Module, sites: list[Site], budget: int) -> dict[str, int]:
        """The reference's rank search for ``budget`` latent dims (see the module docstring).

        With ``key_rank_max`` / ``value_rank_max`` (:attr:`rank_max`) the search runs twice: a key group it first
        keeps past :data:`~gac.hardware.latency.RAW_KEY_SHARE` of its width keeps the whole width (the keys cached
        raw, nothing rebuilt, as ``--align gac`` would offer them), and the rest is searched again with each group
        capped, so that what a capped group gives up goes to the others in the reference's own order
        (:func:`fisher_ranks`); ``uniform`` caps its ranks and leaves the rest of the budget unspent."""
        if not sites:
            return {}
        if budget < len(sites):
            raise GacError(
                f"palu: a KV budget of {budget:,} latent dims is below one rank per group ({len(sites)} groups)"
            )
        ranks = self._search(sites, budget, {s.name: s.max_dim for s in sites})
        caps = {
            s.name: min(s.max_dim, s.meta["rank_max"]) for s in sites if s.meta.get("rank_max") is not None
        }
        if not caps:
            return ranks
        from gac.hardware.latency import RAW_KEY_SHARE

        raw = {
            s.name: s.max_dim
            for s in sites
            if s.name in caps and s.meta["kind"] == "k" and ranks[s.name] > RAW_KEY_SHARE * s.max_dim
        }
        rest = [s for s in sites if s.name not in raw]
        # whole key groups that would leave the rest below one rank each are capped as the others
        if budget - sum(raw.values()) < len(rest):
            raw, rest = {}, sites
        if not rest:
            return raw
        out = self._search(
            rest, budget - sum(raw.values()), {s.name: caps.get(s.name, s.max_dim) for s in rest}
        )
        return {**out, **raw}

    def _search(self, sites: list[Site], budget: int, caps: dict[str, int]) -> dict[str, int]:
        """The reference's search (:attr:`search`) over ``sites``, each group's rank at most ``caps``."""
        if self.search == "uniform":
            return {
                s.name: max(
                    1, min(caps[s.name], math.floor(s.max_dim * budget / sum(x.max_dim for x in sites)))
                )
                for s in sites
            }
        if self.search == "fisher":
            ranks = fisher_ranks([self.group_fisher(s) for s in sites], [caps[s.name] for s in sites], budget)
            return {s.name: max(1, r) for s, r in zip(sites, ranks, strict=True)}
        # fisher_uniform: one rank per projection, split evenly over its groups
        mods: dict[str, list[Site]] = {}
        for s in sites:
            mods.setdefault(s.members[0], []).append(s)
        names = list(mods)
        ranks = fisher_ranks(
            [self.module_fisher(n) for n in names],
            [sum(caps[x.name] for x in mods[n]) for n in names],
            budget,
        )
        out: dict[str, int] = {}
        for n, r in zip(names, ranks, strict=True):
            for s in mods[n]:
                out[s.name] = max(1, min(caps[s.name], r // len(mods[n])))
        return out

    # ----------------------------------------------------------------- apply
    @torch.no_grad()
    def apply(self, model: nn.Module, sites: list[Site], dims: dict[str, int]) -> None:
        """Replace every layer's attention with :class:`~gac.nn.latent.LatentAttention`."""
        from gac.nn.latent import LatentAttention, LatentProjection
        from gac.surgery.factorized import replace_module

        by_layer: dict[int, dict[str, list[Site]]] = {}
        for s in sites:
            kept_dim(s, dims)
            by_layer.setdefault(s.meta["layer"], {}).setdefault(s.meta["kind"], []).append(s)
        geom = self._geom
        rotary = model_rotary(model)
        for i in track(sorted(by_layer), f"palu: latent attention ({len(by_layer)} layers)"):
            info = self._layers[i]
            attn = model.get_submodule(info["attn"])
            projs = {}
            for kind in ("k", "v"):
                group = sorted(by_layer[i][kind], key=lambda s: s.meta["group"])
                lin = model.get_submodule(info["fqns"][kind])
                ranks = [int(dims[s.name]) for s in group]
                lp = LatentProjection(
                    lin.in_features,
                    ranks,
                    group[0].max_dim,
                    bias=lin.bias is not None,
                    device=lin.weight.device,
                    dtype=lin.weight.dtype,
                )
                downs = []
                for s, r, up in zip(group, ranks, lp.ups, strict=True):
                    if r >= s.max_dim:
                        # kept at full width: the rows themselves, with the identity up-projection (exact;
                        # the decode kernel reads such keys raw, gac.nn.latent.raw_key_groups)
                        a, b = torch.eye(r, device=lin.weight.device), lin.weight.detach()[self._rows(s)]
                    else:
                        u, sv, vh, chol = self._factor_svd(model, s)
                        a, b = truncated_factors(u, sv, vh, r, scale_tril=chol)
                        # a rank past the group's min(G·hd, hidden) singular values: zero latents, exact
                        if a.shape[1] < r:
                            a = torch.nn.functional.pad(a, (0, r - a.shape[1]))
                            b = torch.nn.functional.pad(b, (0, 0, 0, r - b.shape[0]))
                    up.weight.copy_(a.to(up.weight.dtype))
                    if lin.bias is not None:
                        up.bias.copy_(lin.bias[self._rows(s)])
                    downs.append(b)
                lp.down.weight.copy_(torch.cat([d.to(lp.down.weight.dtype) for d in downs]))
                projs[kind] = lp
            new = LatentAttention(
                attn.q_proj,
                projs["k"],
                projs["v"],
                attn.o_proj,
                geom["heads"],
                geom["kv_heads"],
                geom["head_dim"],
                getattr(attn, "layer_idx", i),
                attn.config if hasattr(attn, "config") else model.config,
                float(getattr(attn, "scaling", geom["head_dim"] ** -0.5)),
                rotary,
                fold_values=self.fold_values,
                q_norm=getattr(attn, "q_norm", None),
                k_norm=getattr(attn, "k_norm", None),
            )
            new.train(attn.training)
            replace_module(model, info["attn"], new)
        model._gac_latent = True  # type: ignore[attr-defined]

    def release(self) -> None:
        self._gram.clear()
        self._chols.clear()

    def options(self) -> dict[str, Any]:
        gk = self._gsize.get("k", self.k_group_size)
        gv = self._gsize.get("v", self.v_group_size)
        return {
            # one group size where keys and values share it (the reference's), else None
            "group_size": gk if gk == gv else None,
            "k_group_size": gk,
            "v_group_size": gv,
            "search": self.search,
            "decompose": self.decompose,
            "fold_values": self.fold_values,
            "key_rank_max": self.rank_max["k"],
            "value_rank_max": self.rank_max["v"],
            "rank_max_from": self.rank_max_from,
            "kernel_caps": self.kernel_caps,
            "round_multiple": REF_ROUND,
            "budget_unit": "latent dims per token (KV cache)",
        }
