"""Compression sites: what the allocator sees (torch-free, so allocation stays pure numpy)."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any

_LAYER = re.compile(r"^(?:.*\.)?(?:layers|layer|h|blocks|block|decoder_layers)\.(\d+)\.")
_ATTN = re.compile(r"^(self_attn|attn|attention|self_attention)\.")
_MLP_PROJ = re.compile(r"^(mlp|feed_forward|ffn)\.(\w+?)_proj\b")


def short_name(fqn: str) -> str:
    """A module name as per-site tables print it: the layer as ``L<i>``, attention projections
    by their own name, MLP projections as ``mlp.<role>``.

    >>> short_name("model.layers.0.self_attn.q_proj"), short_name("model.layers.12.mlp.down_proj")
    ('L0.q_proj', 'L12.mlp.down')
    >>> short_name("model.layers.3.self_attn.k_proj:g1"), short_name("lm_head")
    ('L3.k_proj:g1', 'lm_head')
    >>> short_name("gpt_neox.layers.5.attention.query_key_value")
    'L5.query_key_value'
    """
    m = _LAYER.match(fqn)
    if m is None:
        return fqn
    rest = _ATTN.sub("", fqn[m.end() :])
    rest = _MLP_PROJ.sub(lambda g: f"mlp.{g.group(2)}", rest)
    return f"L{m.group(1)}.{rest}"


@dataclass(frozen=True)
class Site:
    """A weight, or a coupled group of weights, whose parameter cost is a function of a kept dim d.

    ``cost(d)`` is ``fixed_cost + unit_cost * d`` for ``d < max_dim``; ``d == max_dim`` means
    "leave this site uncompressed" and costs ``dense_cost``.  For a low-rank site of an
    ``out x in`` weight, ``unit_cost = in + out`` and ``max_dim`` is the break-even rank
    ``floor(in*out / (in+out))``; for a pruned width, ``unit_cost`` is the parameters per
    kept channel over all coupled weights.

    Attributes:
        name: fully qualified name of the (leading) weight's module.
        op: the profile operator class that governs the kept dim (``lowrank_r``, ``gemm_n``...).
        max_dim: the dim meaning "no compression".
        unit_cost: parameters per unit of kept dim.
        fixed_cost: parameters that do not depend on d.
        dense_cost: parameters of the untouched site.
        shape: ``(out_features, in_features)`` of the leading weight, for latency models.
        members: module names of all coupled weights (just ``(name,)`` for a single weight).
        min_dim: smallest allowed kept dim.
    """

    name: str
    op: str
    max_dim: int
    unit_cost: int
    dense_cost: int
    fixed_cost: int = 0
    shape: tuple[int, ...] = ()
    members: tuple[str, ...] = ()
    min_dim: int = 1
    meta: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def cost(self, d: int) -> int:
        """Parameters when keeping dim ``d``."""
        if d >= self.max_dim:
            return self.dense_cost
        return self.fixed_cost + self.unit_cost * int(d)

    def params(self, d: int) -> int:
        """Weight parameters when keeping dim ``d``: :meth:`cost` unless the budget counts
        something else (PaLU's cost is latent dims per token; its ``meta`` then holds
        ``params_per_dim`` and ``dense_params``).

        >>> s = Site("k:g0", "lowrank_r", max_dim=64, unit_cost=1, dense_cost=64,
        ...          meta={"params_per_dim": 576 + 64, "dense_params": 64 * 576})
        >>> s.cost(16), s.params(16), s.params(64)
        (16, 10240, 36864)
        """
        per = self.meta.get("params_per_dim")
        if per is None:
            return self.cost(d)
        if d >= self.max_dim:
            return int(self.meta.get("dense_params", self.dense_cost))
        return int(per) * int(d)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["shape"] = list(self.shape)
        d["members"] = list(self.members)
        return d


def lowrank_site(name: str, out_features: int, in_features: int, bias: bool = False) -> Site:
    """A site for factorizing one ``out x in`` linear layer at rank d.

    >>> s = lowrank_site("q", 576, 576)
    >>> s.max_dim, s.unit_cost, s.cost(100), s.cost(s.max_dim)
    (288, 1152, 115200, 331776)
    """
    b = out_features if bias else 0
    return Site(
        name=name,
        op="lowrank_r",
        max_dim=(out_features * in_features) // (out_features + in_features),
        unit_cost=out_features + in_features,
        fixed_cost=b,
        dense_cost=out_features * in_features + b,
        shape=(out_features, in_features),
        members=(name,),
    )
