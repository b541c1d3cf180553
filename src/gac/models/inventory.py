"""The dimension inventory: every dim of a model that reaches a GPU kernel, judged against a profile.

:func:`inventory` lists :class:`Dim` records (found through the family adapter, so factorized and
pruned layers are seen as they are); :func:`analyze` adds, for each dim, whether the profile calls
it aligned, its predicted latency penalty and the dim that repair would pad it to.

Dim kinds and the profile operator class that governs them:

=====================  ==================  ==========================================
kind                   op class            what
=====================  ==================  ==========================================
``<role>.out``         ``gemm_n``          output features of projection ``role``
``<role>.in``          ``gemm_k``          input features of projection ``role``
``<role>.rank``        ``lowrank_r``       inner rank of a factorized projection (or a PaLU latent group;
                                           a latent key rank also on the kernel's key rank tile)
``intermediate``       ``gemm_n``          MLP width of one layer
``head_dim``           ``sdpa_head_dim``   per-head width (one record per layer)
``vocab``              ``gemm_n``          ``lm_head`` output features
``embedding``          ``gemm_k``          embedding dim (``lm_head`` input features)
``heads``/``kv_heads``  (none)             head counts: reported, not judged
=====================  ==================  ==========================================
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from gac.alignment import round_up
from gac.errors import GacError
from gac.guard import atomic_savefig
from gac.hardware.profile import Profile
from gac.models.adapters import get_adapter, in_features, out_features
from gac.nn import FactorizedLinear
from gac.nn.latent import LatentProjection, latent_modules

#: op class for the kinds that are not ``<role>.in/out/rank``
KIND_OPS: dict[str, str | None] = {
    "intermediate": "gemm_n",
    "head_dim": "sdpa_head_dim",
    "vocab": "gemm_n",
    "embedding": "gemm_k",
    "heads": None,
    "kv_heads": None,
}


def op_for_kind(kind: str) -> str | None:
    """The profile operator class that governs a dim of ``kind``."""
    if kind.endswith(".out"):
        return "gemm_n"
    if kind.endswith(".in"):
        return "gemm_k"
    if kind.endswith(".rank"):
        return "lowrank_r"
    return KIND_OPS.get(kind)


@dataclass
class Dim:
    """One dim that reaches a kernel.

    Attributes:
        kind: see the module docstring.
        where: the module (fully qualified name) or ``model``.
        value: the dim.
        layer: decoder layer index, or None for model-wide dims.
        op: the governing operator class (None: reported only).
        aligned: under the profile's rule (None until :func:`analyze`, and for ``op`` None).
        penalty: predicted slow-down against an aligned dim (1.0 when aligned).
        target: the dim that zero-padding to the profile's rule gives.
        key_group: for a PaLU latent key rank, ``{"key_group", "query_rows", "width"}`` of its group: the decode
            kernel rebuilds it, so the profile's key rank tile applies too (:func:`dim_modulus`).
    """

    kind: str
    where: str
    value: int
    layer: int | None = None
    op: str | None = None
    aligned: bool | None = None
    penalty: float = 1.0
    target: int | None = None
    key_group: dict[str, int] | None = None


def dim_modulus(profile: Profile, d: Dim) -> int:
    """The modulus ``d`` aligns to under ``profile``: its operator class's, and for a PaLU latent key rank of a group
    wider than the decode kernel's key rank tile (:meth:`Profile.key_rank_tile`) the least common multiple with
    it, as ``--align gac`` picks them (:func:`gac.hardware.latency.site_modulus`)."""
    m = profile.modulus(d.op)
    if d.key_group:
        k = d.key_group
        m = profile.key_rank_modulus(m, k["key_group"], k["query_rows"], k["width"])
    return m


def inventory(model: nn.Module) -> list[Dim]:
    """Every dim of ``model`` that reaches a kernel (supported families only)."""
    ad = get_adapter(model)
    dims: list[Dim] = []

    def add(kind: str, where: str, value: int, layer: int | None = None) -> None:
        dims.append(Dim(kind, where, int(value), layer, op_for_kind(kind)))

    for i in range(ad.num_layers):
        for role, fqn in ad.projections(i).items():
            mod = model.get_submodule(fqn)
            add(f"{role}.in", fqn, in_features(mod), i)
            if isinstance(mod, FactorizedLinear):
                add(f"{role}.rank", fqn, mod.rank, i)
            elif isinstance(mod, LatentProjection):  # PaLU: one latent rank per KV group
                for g, r in enumerate(mod.ranks):
                    add(f"{role}.rank", f"{fqn}:g{g}", r, i)
                    if role == "k":  # rebuilt at every decode step: the kernel's key rank tile applies
                        dims[-1].key_group = model.get_submodule(ad.attention_fqn(i)).key_group_shape(g)
            add(f"{role}.out", fqn, out_features(mod), i)
        add("intermediate", ad.mlp_fqn(i), ad.intermediate(i), i)
        add(
            "head_dim",
            ad.attention_fqn(i),
            int(getattr(model.get_submodule(ad.attention_fqn(i)), "head_dim", ad.head_dim)),
            i,
        )
    # factorized layers outside the decoder projections (e.g. a factorized lm_head)
    known = {f for _, _, f in ad.all_projections()}
    for name, mod in model.named_modules():
        if isinstance(mod, FactorizedLinear) and name not in known:
            add("other.rank", name, mod.rank)
    add("heads", "model", ad.heads)
    add("kv_heads", "model", ad.kv_heads)
    add("vocab", ad.lm_head_fqn, ad.vocab)
    add("embedding", ad.embed_fqn, ad.hidden)
    return dims


@dataclass
class Analysis:
    """A model's dims judged against a profile.

    Attributes:
        family: the adapter's family.
        profile: ``{"id", "label", "measured"}`` of the profile used.
        dims: all :class:`Dim` records, judged.
        summary: headline dims of the model (:meth:`FamilyAdapter.summary`).
    """

    family: str
    profile: dict[str, Any]
    dims: list[Dim] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)

    @property
    def judged(self) -> list[Dim]:
        return [d for d in self.dims if d.op is not None]

    @property
    def misaligned(self) -> list[Dim]:
        return [d for d in self.judged if not d.aligned]

    @property
    def pct_aligned(self) -> float:
        j = self.judged
        return 100.0 * sum(bool(d.aligned) for d in j) / len(j) if j else 100.0

    def groups(self) -> list[dict[str, Any]]:
        """Per kind: count, distinct values, % aligned, worst penalty, op class."""
        by: dict[str, list[Dim]] = defaultdict(list)
        for d in self.dims:
            by[d.kind].append(d)
        out = []
        for kind, ds in by.items():
            judged = [d for d in ds if d.op is not None]
            out.append(
                {
                    "kind": kind,
                    "op": ds[0].op,
                    "count": len(ds),
                    "values": sorted({d.value for d in ds}),
                    "pct_aligned": (100.0 * sum(bool(d.aligned) for d in judged) / len(judged))
                    if judged
                    else None,
                    "worst_penalty": max((d.penalty for d in judged), default=1.0),
                }
            )
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "family": self.family,
            "profile": self.profile,
            "summary": self.summary,
            "pct_aligned": self.pct_aligned,
            "n_dims": len(self.judged),
            "n_misaligned": len(self.misaligned),
            "groups": self.groups(),
            "dims": [asdict(d) for d in self.dims],
        }


def analyze(model: nn.Module, profile: Profile) -> Analysis:
    """Judge every dim of ``model`` under ``profile``: aligned?, predicted penalty, repair target."""
    ad = get_adapter(model)
    dims = inventory(model)
    for d in dims:
        if d.op is None:
            continue
        m = dim_modulus(profile, d)
        d.aligned = d.value % m == 0
        d.penalty = 1.0 if d.aligned else profile.penalty(d.op, d.value)
        if not d.aligned and profile.is_aligned(d.op, d.value):  # off the key rank tile only
            d.penalty = float(profile.key_rank_penalty(d.key_group["key_group"], d.key_group["query_rows"]))
        d.target = round_up(d.value, m)
    return Analysis(
        family=ad.family,
        profile={"id": profile.id, "label": profile.label, "measured": profile.measured},
        dims=dims,
        summary=ad.summary(),
    )


def plot_histogram(an: Analysis, path: str | Path, title: str = "") -> Path:
    """The "dimension distribution" figure: judged dims by value, aligned in green, misaligned in red."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    vals_ok = [d.value for d in an.judged if d.aligned]
    vals_bad = [d.value for d in an.judged if not d.aligned]
    allv = vals_ok + vals_bad
    fig, ax = plt.subplots(figsize=(9, 4.5))
    if allv:
        lo, hi = min(allv), max(allv)
        distinct = sorted(set(allv))
        if len(distinct) <= 40:
            # one bar per distinct value, stacked aligned / misaligned
            x = np.arange(len(distinct))
            ok = [vals_ok.count(v) for v in distinct]
            bad = [vals_bad.count(v) for v in distinct]
            ax.bar(x, ok, color="#2ca02c", label="aligned")
            ax.bar(x, bad, bottom=ok, color="#d62728", label="misaligned")
            ax.set_xticks(x, [str(v) for v in distinct], rotation=60, fontsize=8)
        else:
            bins = min(60, max(10, hi - lo + 1))
            ax.hist(
                [vals_ok, vals_bad],
                bins=bins,
                stacked=True,
                color=["#2ca02c", "#d62728"],
                label=["aligned", "misaligned"],
            )
    ax.set_xlabel("dimension")
    ax.set_ylabel("count (kernel operands)")
    ax.set_title(
        (title + "\n" if title else "")
        + f"{len(allv)} dims, {an.pct_aligned:.1f}% aligned under {an.profile['id']}",
        fontsize=10,
    )
    ax.legend()
    fig.tight_layout()
    try:
        return atomic_savefig(fig, path, dpi=120)
    finally:
        plt.close(fig)


def kv_bytes_per_token(model: nn.Module, dtype: torch.dtype | None = None) -> dict[str, int]:
    """Cache bytes per token (all layers) as the model is, and for its dense original.

    A layer with latent attention caches its latent ranks; any other layer its K and V heads, read
    from its own ``k_proj``/``v_proj`` widths where the family's projections are found (pruned
    models keep different KV heads per layer), else from the config.

    Returns:
        ``{"cache": bytes, "dense": bytes}``; equal for a model that is neither latent nor pruned.
    """
    cfg = model.config
    dt = dtype or next(model.parameters()).dtype
    el = torch.empty((), dtype=dt).element_size()
    layers = int(cfg.num_hidden_layers)
    kvh = int(getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads)
    hd = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)
    dense = layers * 2 * kvh * hd * el
    lat = dict(latent_modules(model))
    per_layer = [2 * kvh * hd * el] * layers
    try:
        ad = get_adapter(model)
        for i in range(min(ad.num_layers, layers)):
            attn = ad.attention_fqn(i)
            if attn in lat:
                rk, rv = lat[attn].latent_dims()
                per_layer[i] = (rk + rv) * el
                continue
            p = ad.projections(i)
            if "k" in p and "v" in p:
                k, v = model.get_submodule(p["k"]), model.get_submodule(p["v"])
                per_layer[i] = (int(k.out_features) + int(v.out_features)) * el
    except GacError:  # a family the adapter does not know: latent layers by count, the rest from the config
        per_layer = [2 * kvh * hd * el] * (layers - len(lat))
        per_layer += [(rk + rv) * el for rk, rv in (m.latent_dims() for m in lat.values())]
    return {"cache": int(sum(per_layer)), "dense": dense}
