"""``llm-pruner`` (Ma et al., NeurIPS 2023, "LLM-Pruner: on the structural pruning of LLMs").

Structured pruning of whole dependency groups, written after the paper and ``horseee/LLM-Pruner``
(``hf_prune.py``, ``LLMPruner/pruner/hf_llama_pruner.py`` and ``llama3.py`` for grouped-query
attention); none of its code is copied.

* **Dependency groups.** An *attention group* is one KV head with the ``n_rep`` query heads that
  share it: ``n_rep·head_dim`` rows of ``q_proj``, ``head_dim`` rows of ``k_proj`` and ``v_proj``
  and the matching ``n_rep·head_dim`` columns of ``o_proj``. GQA stays intact and head_dim never
  changes. An *MLP group* is one intermediate channel: a row of ``gate_proj`` and ``up_proj`` and a
  column of ``down_proj``.
* **Importance.** First-order Taylor on the language-modelling loss of the calibration text
  (gradients summed over the windows, one backward per batch): ``param_first`` scores every
  weight by ``|W ⊙ ∇W|`` and sums a member's elements per group; ``vectorize`` takes
  ``|Σ W ⊙ ∇W|`` over a member's group vector. The group's members are then reduced with
  ``sum`` (default), ``mean`` or ``max``.
* **Native allocation.** Block-wise: one pruning ratio for every layer inside a layer range (the
  reference's ``block_*_layer_start=4 .. end=30`` of 32 layers, scaled to the model's depth), the
  largest ratio whose cost fits the budget; the reference floors the removed count per layer.
  ``global_pruning=True`` instead removes the least important groups model-wide.
* **Sites.** Per layer in range: the MLP width (``op="gemm_n"``, unit cost ``3·hidden`` per
  channel) and the number of KV groups (``op="kv_groups"``: any count keeps every GEMM a multiple
  of head_dim, so every count is aligned; the latency model prices its FLOPs). The loss curve is
  the cumulative importance of the channels or groups removed, lowest first.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

import numpy as np
import torch
from torch import nn

from gac.compressors.base import Compressor, bisect_fraction, register_compressor
from gac.errors import GacError
from gac.sites import Site
from gac.utils import track

log = logging.getLogger(__name__)

IMPORTANCE = ("param_first", "vectorize")
REDUCTIONS = ("sum", "mean", "max")
#: the reference's block range on 32-layer Llama: layers [4, 30)
REF_RANGE = (4, 30, 32)


def default_layer_range(n_layers: int) -> tuple[int, int]:
    """The reference's ``[4, 30)`` of 32 layers, scaled to ``n_layers``.

    >>> default_layer_range(32), default_layer_range(30), default_layer_range(2)
    ((4, 30), (4, 28), (0, 2))
    """
    a, b, n = REF_RANGE
    start, end = round(a * n_layers / n), round(b * n_layers / n)
    if end <= start:
        return 0, n_layers
    return start, end


def group_scores(parts: list[torch.Tensor], reduction: str) -> torch.Tensor:
    """Reduce per-member group scores ``[n_groups]`` with ``sum``/``mean``/``max``."""
    st = torch.stack(parts)
    if reduction == "sum":
        return st.sum(0)
    if reduction == "mean":
        return st.mean(0)
    return st.max(0).values


def member_scores(w: torch.Tensor, g: torch.Tensor, n_groups: int, dim: int, kind: str) -> torch.Tensor:
    """One member's score per group: ``w, g`` split into ``n_groups`` equal slices along ``dim``."""
    prod = (w.double() * g.double()).movedim(dim, 0).reshape(n_groups, -1)
    if kind == "param_first":
        return prod.abs().sum(1)
    return prod.sum(1).abs()


@register_compressor("llm-pruner")
class LlmPrunerCompressor(Compressor):
    """First-order Taylor structured pruning of attention groups and MLP channels."""

    def __init__(
        self,
        importance: str = "param_first",
        reduction: str = "sum",
        layer_start: int | None = None,
        layer_end: int | None = None,
        global_pruning: bool = False,
    ) -> None:
        if importance not in IMPORTANCE:
            raise GacError(
                f"llm-pruner: importance must be one of {', '.join(IMPORTANCE)}, got {importance!r}"
            )
        if reduction not in REDUCTIONS:
            raise GacError(f"llm-pruner: reduction must be one of {', '.join(REDUCTIONS)}, got {reduction!r}")
        self.importance_kind = importance
        self.reduction = reduction
        self.layer_start = layer_start
        self.layer_end = layer_end
        self.global_pruning = bool(global_pruning)
        self._scores: dict[str, torch.Tensor] = {}
        self._info: dict[str, dict[str, Any]] = {}
        self._range: tuple[int, int] | None = None

    # ------------------------------------------------------------------ sites
    def _layer_range(self, n: int) -> tuple[int, int]:
        d0, d1 = default_layer_range(n)
        s = d0 if self.layer_start is None else self.layer_start
        e = d1 if self.layer_end is None else self.layer_end
        if not (0 <= s < e <= n):
            raise GacError(f"llm-pruner: layer range [{s}, {e}) lies outside the model's {n} layers")
        return s, e

    def sites(self, model: nn.Module) -> list[Site]:
        from gac.models.adapters import get_adapter

        ad = get_adapter(model)
        if not {"q", "k", "v", "gate", "up", "down"} <= set(ad.roles):
            raise GacError(
                f"llm-pruner needs separate q/k/v and gate/up/down projections; this {ad.family} model has "
                f"{', '.join(ad.roles)}"
            )
        s, e = self._range = self._layer_range(ad.num_layers)
        hidden, heads, kv, hd = ad.hidden, ad.heads, ad.kv_heads, ad.head_dim
        n_rep = heads // kv
        out: list[Site] = []
        self._info.clear()
        for i in range(s, e):
            p = ad.projections(i)
            mods = {r: model.get_submodule(f) for r, f in p.items()}
            inter = mods["gate"].out_features
            mlp_bias = sum(mods[r].bias is not None for r in ("gate", "up"))
            mlp_unit = 3 * hidden + mlp_bias
            mlp_fixed = hidden if mods["down"].bias is not None else 0
            name = ad.mlp_fqn(i)
            members = (p["gate"], p["up"], p["down"])
            meta = {"kind": "mlp", "layer": i}
            out.append(
                _group_site(name, "gemm_n", inter, mlp_unit, mlp_fixed, (inter, hidden), members, meta)
            )
            self._info[name] = {"kind": "mlp", "layer": i, "fqns": p}
            groups = mods["k"].out_features // hd
            qkv_bias = sum(
                hd * (n_rep if r == "q" else 1) for r in ("q", "k", "v") if mods[r].bias is not None
            )
            attn_unit = hidden * hd * (2 * n_rep + 2) + qkv_bias
            attn_fixed = hidden if mods["o"].bias is not None else 0
            name = ad.attention_fqn(i)
            shape = (groups * n_rep * hd, hidden)
            members = (p["q"], p["k"], p["v"], p["o"])
            meta = {"kind": "attn", "layer": i, "n_rep": n_rep, "head_dim": hd}
            out.append(_group_site(name, "kv_groups", groups, attn_unit, attn_fixed, shape, members, meta))
            self._info[name] = {"kind": "attn", "layer": i, "fqns": p, "n_rep": n_rep, "head_dim": hd}
        return out

    # ------------------------------------------------------------ calibration
    def calibrate(self, model: nn.Module, batches: Iterable[torch.Tensor]) -> None:
        """Sum the LM-loss gradients over ``batches`` and score every group (first-order Taylor)."""
        if not self._info:
            self.sites(model)
        targets: dict[str, nn.Parameter] = {}
        for info in self._info.values():
            for r in ("q", "k", "v", "o") if info["kind"] == "attn" else ("gate", "up", "down"):
                targets[info["fqns"][r]] = model.get_submodule(info["fqns"][r]).weight
        bad = [n for n, w in targets.items() if not w.dtype.is_floating_point]
        if bad:
            raise GacError(
                f"llm-pruner: {bad[0]} has non-float weights ({targets[bad[0]].dtype}); no gradient path"
            )
        saved = {n: p.requires_grad for n, p in model.named_parameters()}
        was_training = model.training
        try:
            for p in model.parameters():
                p.requires_grad_(False)
                p.grad = None
            for w in targets.values():
                w.requires_grad_(True)
            model.eval()
            n = 0
            for b in track(list(batches), "llm-pruner: gradients"):
                b = b.to(next(model.parameters()).device)
                out = model(input_ids=b, labels=b)
                if out.loss is None or not out.loss.requires_grad:
                    raise GacError("llm-pruner: the model's loss has no gradient path to its projections")
                out.loss.backward()
                n += 1
            if n == 0:
                raise GacError("llm-pruner: calibration gave no windows (text too short for one window?)")
            self._scores.clear()
            for name, info in self._info.items():
                self._scores[name] = self._score(model, info)
        finally:
            for w in targets.values():
                w.grad = None
            for nm, p in model.named_parameters():
                p.requires_grad_(saved.get(nm, p.requires_grad))
            model.train(was_training)

    def _score(self, model: nn.Module, info: dict[str, Any]) -> torch.Tensor:
        k = self.importance_kind

        def wg(role: str) -> tuple[torch.Tensor, torch.Tensor]:
            w = model.get_submodule(info["fqns"][role]).weight
            if w.grad is None:
                raise GacError(f"llm-pruner: {info['fqns'][role]} received no gradient (no gradient path)")
            return w.detach(), w.grad.detach()

        if info["kind"] == "mlp":
            parts = []
            for role, dim in (("gate", 0), ("up", 0), ("down", 1)):
                w, g = wg(role)
                parts.append(member_scores(w, g, w.shape[dim], dim, k))
        else:
            hd = info["head_dim"]
            groups = model.get_submodule(info["fqns"]["k"]).out_features // hd
            parts = []
            for role, dim in (("q", 0), ("k", 0), ("v", 0), ("o", 1)):
                w, g = wg(role)
                parts.append(member_scores(w, g, groups, dim, k))
        return group_scores(parts, self.reduction).cpu()

    def scores(self, site: Site) -> torch.Tensor:
        if site.name not in self._scores:
            raise GacError(f"llm-pruner: no importance for {site.name}; call calibrate() first")
        return self._scores[site.name]

    # ------------------------------------------------------------ curves etc
    def loss_curve(self, site: Site) -> np.ndarray:
        """``loss[d]`` = summed importance of the ``max_dim - d`` least important groups."""
        s = np.sort(self.scores(site).numpy())
        removed = np.concatenate([[0.0], np.cumsum(s)])  # removed[j]: the j lowest
        return removed[site.max_dim - np.arange(site.max_dim + 1)]

    def native_allocation(self, model: nn.Module, sites: list[Site], budget: int) -> dict[str, int]:
        if self.global_pruning:
            return self._global(sites, budget)

        def dims_at(r: float) -> dict[str, int]:
            return {s.name: max(s.max_dim - int(s.max_dim * r), s.min_dim) for s in sites}

        def cost(d: dict[str, int]) -> int:
            return sum(s.cost(d[s.name]) for s in sites)

        if cost(dims_at(1.0)) > budget:
            raise GacError(
                f"llm-pruner: budget of {budget:,} parameters would remove every head or channel of a layer"
            )
        return dims_at(bisect_fraction(lambda r: cost(dims_at(r)) <= budget, fits_high=True))

    def _global(self, sites: list[Site], budget: int) -> dict[str, int]:
        dims = {s.name: s.max_dim for s in sites}
        items = sorted((float(v), s.name) for s in sites for v in self.scores(s).tolist())
        by = {s.name: s for s in sites}
        total = sum(s.cost(s.max_dim) for s in sites)
        for _, name in items:
            if total <= budget:
                break
            s = by[name]
            if dims[name] <= s.min_dim:
                continue
            total -= s.cost(dims[name]) - s.cost(dims[name] - 1)
            dims[name] -= 1
        if total > budget:
            raise GacError(f"llm-pruner: budget of {budget:,} parameters cannot be met")
        return dims

    # ------------------------------------------------------------------ apply
    def apply(self, model: nn.Module, sites: list[Site], dims: dict[str, int]) -> None:
        """Slice the least important groups out of every site's weights (in place)."""
        pruned: dict[str, list[int]] = dict(getattr(model, "_gac_pruned", {}))
        for s in sites:
            d = int(dims[s.name])
            if d >= s.max_dim:
                continue
            keep = torch.sort(torch.topk(self.scores(s), d).indices).values
            info = self._info[s.name]
            f = info["fqns"]
            if info["kind"] == "mlp":
                _slice(model, f["gate"], keep, 0, 1)
                _slice(model, f["up"], keep, 0, 1)
                _slice(model, f["down"], keep, 1, 1)
                for r in ("gate", "up", "down"):
                    pruned[f[r]] = list(model.get_submodule(f[r]).weight.shape)
            else:
                hd, n_rep = info["head_dim"], info["n_rep"]
                _slice(model, f["q"], keep, 0, n_rep * hd)
                _slice(model, f["k"], keep, 0, hd)
                _slice(model, f["v"], keep, 0, hd)
                _slice(model, f["o"], keep, 1, n_rep * hd)
                attn = model.get_submodule(s.name)
                for attr, val in (("num_heads", d * n_rep), ("num_key_value_heads", d)):
                    if hasattr(attn, attr):
                        setattr(attn, attr, val)
                for r in ("q", "k", "v", "o"):
                    pruned[f[r]] = list(model.get_submodule(f[r]).weight.shape)
        model._gac_pruned = pruned  # type: ignore[attr-defined]

    def options(self) -> dict[str, Any]:
        return {
            "importance": self.importance_kind,
            "reduction": self.reduction,
            "layer_range": list(self._range) if self._range else None,
            "global_pruning": self.global_pruning,
        }


def _group_site(
    name: str, op: str, groups: int, unit: int, fixed: int, shape: tuple, members: tuple, meta: dict
) -> Site:
    """A site of ``groups`` prunable groups (channels or KV heads), each costing ``unit`` parameters."""
    return Site(
        name=name,
        op=op,
        max_dim=groups,
        unit_cost=unit,
        fixed_cost=fixed,
        dense_cost=fixed + unit * groups,
        shape=shape,
        members=members,
        meta=meta,
    )


def _slice(model: nn.Module, fqn: str, groups: torch.Tensor, dim: int, width: int) -> None:
    """Keep ``groups`` (each ``width`` wide) of ``fqn``'s weight along ``dim`` (0: rows, 1: columns)."""
    lin = model.get_submodule(fqn)
    idx = (groups[:, None] * width + torch.arange(width)[None, :]).reshape(-1).to(lin.weight.device)
    with torch.no_grad():
        rg = lin.weight.requires_grad
        lin.weight = nn.Parameter(lin.weight.index_select(dim, idx).contiguous(), requires_grad=rg)
        if dim == 0 and lin.bias is not None:
            lin.bias = nn.Parameter(lin.bias.index_select(0, idx).contiguous(), requires_grad=rg)
    if dim == 0:
        lin.out_features = idx.numel()
    else:
        lin.in_features = idx.numel()
