"""Attention over a low-rank KV cache (PaLU's latent cache).

PaLU (Chang et al., EMNLP 2024) factorizes ``k_proj`` and ``v_proj`` per *group* of KV heads:
one shared down-projection ``hidden -> Σ r_g`` and, per group ``g``, an up-projection
``r_g -> G·head_dim`` (G KV heads per group). The cache then stores the ``Σ r_g`` latents of each
token instead of its ``2·kv_heads·head_dim`` keys and values.

:class:`LatentAttention` is the attention module of such a model:

* **Keys** are reconstructed from the cached latents at attention time, and RoPE is applied
  *after* reconstruction, at each cached token's own position (PaLU's order: RoPE does not commute
  with the low-rank projection).
* **Values** stay latent in the cache. Softmax rows sum to one, so
  ``Σ_t p_t·(U z_t + b) = U·(Σ_t p_t z_t) + b``: on the decode path (CUDA, static cache, one new
  token) attention runs over the value latents and each query head's latent output goes through
  its KV head's up-projection before ``o_proj``; with ``fold_values`` the up-projections are folded
  into ``o_proj`` once and every path attends over the latents. Unfolded prefill (and the CPU
  path) rebuilds K and V from the latents and attends with the model's own attention (flash kernels
  need equal key and value widths).
* The cache is any :class:`transformers.Cache` (``DynamicCache``, ``StaticCache``,
  :class:`LatentCache`): the module hands it latents shaped ``[batch, 1, tokens, Σ r]``, which
  the layers allocate from the first update. A dynamic cache also records each cached token's
  position (left-padded batches keep their own RoPE positions); a static cache's slot ``j`` holds
  position ``j``.

:meth:`LatentAttention.reference_forward` is the reconstruct-everything path (full K and V from
the latents, standard attention, original ``o_proj``): every other path must reproduce it.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from gac.errors import GacError


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """``[-x2, x1]`` for ``x = [x1, x2]`` along the last dim (the Llama RoPE convention)."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE on ``x [B, H, T, D]`` with ``cos, sin [B, T, D]``."""
    return x * cos.unsqueeze(1) + rotate_half(x) * sin.unsqueeze(1)


class LatentProjection(nn.Module):
    """Group-head low-rank projection: ``down: in -> Σ r_g`` and one ``up_g: r_g -> group_out`` per group.

    ``forward(x) = cat_g(up_g(down(x)[..., slice_g]))`` equals the original ``nn.Linear`` up to the
    truncation. State-dict keys: ``down.weight``, ``ups.{g}.weight`` (``ups.{g}.bias``).
    """

    def __init__(
        self,
        in_features: int,
        ranks: list[int],
        group_out: int,
        bias: bool = False,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        if not ranks or min(ranks) < 1:
            raise GacError(f"latent ranks must be positive, got {ranks}")
        self.in_features = in_features
        self.group_out = group_out
        self.out_features = group_out * len(ranks)
        self.down = nn.Linear(in_features, sum(ranks), bias=False, device=device, dtype=dtype)
        self.ups = nn.ModuleList(
            nn.Linear(r, group_out, bias=bias, device=device, dtype=dtype) for r in ranks
        )

    @property
    def ranks(self) -> list[int]:
        return [u.in_features for u in self.ups]

    def offsets(self) -> list[int]:
        out, o = [], 0
        for r in self.ranks:
            out.append(o)
            o += r
        return out

    def latent(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(x)

    def reconstruct(self, z: torch.Tensor) -> torch.Tensor:
        parts = z.split(self.ranks, dim=-1)
        return torch.cat([up(p) for up, p in zip(self.ups, parts, strict=True)], dim=-1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.reconstruct(self.latent(x))

    @property
    def weight(self) -> torch.Tensor:
        """The dense equivalent ``[out, in]`` (computed; for inspection)."""
        return torch.cat(
            [u.weight @ d for u, d in zip(self.ups, self.down.weight.split(self.ranks, 0), strict=True)]
        )


class LatentAttention(nn.Module):
    """Self-attention with a PaLU latent KV cache (see the module docstring).

    Args:
        q_proj, o_proj: the original query and output projections (``o_proj`` is folded with the
            value up-projections unless ``fold_values`` is False).
        k_proj, v_proj: :class:`LatentProjection` s with one up-projection per KV group.
        heads, kv_heads, head_dim: the attention geometry.
        layer_idx: the layer's index in the cache.
        config: the model config (attention implementation, dropout).
        scaling: the softmax scale.
        rotary: the model's rotary embedding module (called for the cached tokens' positions).
    """

    def __init__(
        self,
        q_proj: nn.Module,
        k_proj: LatentProjection,
        v_proj: LatentProjection,
        o_proj: nn.Linear,
        heads: int,
        kv_heads: int,
        head_dim: int,
        layer_idx: int,
        config: Any,
        scaling: float,
        rotary: nn.Module | None,
        fold_values: bool = False,
    ) -> None:
        super().__init__()
        if heads % kv_heads:
            raise GacError(f"{heads} query heads do not split over {kv_heads} KV heads")
        n_groups = len(k_proj.ranks)
        if len(v_proj.ranks) != n_groups or kv_heads % n_groups:
            raise GacError(f"{n_groups} latent groups do not divide {kv_heads} KV heads")
        self.q_proj, self.k_proj, self.v_proj = q_proj, k_proj, v_proj
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.num_key_value_groups = heads // kv_heads
        self.group_kv = kv_heads // n_groups
        self.layer_idx = layer_idx
        self.config = config
        self.scaling = scaling
        self.is_causal = True
        self.attention_dropout = float(getattr(config, "attention_dropout", 0.0) or 0.0)
        self.folded = False
        self.o_proj = o_proj
        object.__setattr__(self, "_rotary", rotary)  # shared with the model, not a submodule
        if fold_values:
            self.o_proj = self._folded_o(o_proj)
            self.folded = True

    # ----------------------------------------------------------------- geometry
    @property
    def n_groups(self) -> int:
        return len(self.k_proj.ranks)

    def group_heads(self, g: int) -> slice:
        """Query heads attending group ``g``'s KV heads."""
        q_per_group = self.group_kv * self.num_key_value_groups
        return slice(g * q_per_group, (g + 1) * q_per_group)

    def latent_dims(self) -> tuple[int, int]:
        """``(Σ r_k, Σ r_v)``: cached values per token for keys and values."""
        return sum(self.k_proj.ranks), sum(self.v_proj.ranks)

    def _folded_o(self, o_proj: nn.Linear) -> nn.Linear:
        """``o' = o_proj · blockdiag(U_v of each query head's KV head)`` (+ the folded value bias)."""
        hd, n_rep = self.head_dim, self.num_key_value_groups
        w = o_proj.weight.detach()
        cols, bias = [], (o_proj.bias.detach().clone() if o_proj.bias is not None else None)
        for h in range(self.heads):
            kvh = h // n_rep
            g, j = divmod(kvh, self.group_kv)
            up = self.v_proj.ups[g]
            u = up.weight.detach()[j * hd : (j + 1) * hd]  # [hd, r_g]
            wo = w[:, h * hd : (h + 1) * hd]  # [hidden, hd]
            cols.append(wo.to(torch.float64) @ u.to(torch.float64))
            if up.bias is not None:
                b = wo.to(torch.float64) @ up.bias.detach()[j * hd : (j + 1) * hd].to(torch.float64)
                bias = b if bias is None else bias.to(torch.float64) + b
        new = nn.Linear(
            sum(c.shape[1] for c in cols),
            w.shape[0],
            bias=bias is not None,
            device=w.device,
            dtype=w.dtype,
        )
        with torch.no_grad():
            new.weight.copy_(torch.cat(cols, dim=1).to(w.dtype))
            if bias is not None:
                new.bias.copy_(bias.to(w.dtype))
        return new

    # ------------------------------------------------------------------- cache
    def _cached(
        self,
        zk: torch.Tensor,
        zv: torch.Tensor,
        positions: torch.Tensor,
        cache: Any,
        cache_position: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Latents and positions of every cached token ``[B, T, ·]`` after appending this step's."""
        if cache is None:
            return zk, zv, positions
        static = bool(getattr(cache, "is_compileable", False))
        prev = 0 if static else int(cache.get_seq_length(self.layer_idx))
        kwargs = {"cache_position": cache_position} if cache_position is not None else {}
        k4, v4 = cache.update(zk.unsqueeze(1), zv.unsqueeze(1), self.layer_idx, kwargs)
        zk_all, zv_all = k4[:, 0], v4[:, 0]
        t = zk_all.shape[1]
        if static:  # slot j holds position j
            pos = torch.arange(t, device=zk.device).unsqueeze(0).expand(zk.shape[0], t)
            return zk_all, zv_all, pos
        store = cache.__dict__.setdefault("_gac_key_positions", {})
        old = store.get(self.layer_idx)
        old = old[:, :prev] if old is not None and prev else positions[:, :0]
        pos = torch.cat([old.to(positions.device), positions], dim=1)
        store[self.layer_idx] = pos
        if pos.shape[1] != t:
            raise GacError(
                f"latent cache of layer {self.layer_idx} holds {t} tokens but {pos.shape[1]} positions"
            )
        return zk_all, zv_all, pos

    def _keys(self, zk_all: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """Full keys ``[B, kv_heads, T, hd]`` from the latents, RoPE'd at their positions."""
        b, t, _ = zk_all.shape
        k = self.k_proj.reconstruct(zk_all).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        if self._rotary is None:
            return k
        cos, sin = self._rotary(k, pos)
        return apply_rope(k, cos.to(k.dtype), sin.to(k.dtype))

    # ------------------------------------------------------ fused decode kernel
    #: use the Triton decode kernel (CUDA, static cache, one new token) where it applies
    use_kernel: bool = True

    def _kernel_ok(
        self, hidden_states: torch.Tensor, cache: Any, cache_position: Any, position_ids: Any
    ) -> bool:
        from gac.kernels.latent_attention import kernel_supported

        return (
            self.use_kernel
            and hidden_states.is_cuda
            and hidden_states.shape[1] == 1
            and cache is not None
            and (cache_position is not None or position_ids is not None)
            and bool(getattr(cache, "is_compileable", False))
            and self.k_proj.ups[0].bias is None
            and self._rotary is not None
            and hasattr(self._rotary, "inv_freq")
            and kernel_supported(self.head_dim, self.num_key_value_groups)
        )

    def decode_pack(self) -> dict[str, Any]:
        """Packed key up-projections, latent offsets/ranks and value up-projections for the decode kernel.

        Cached until the weights move (device, dtype or storage change).
        """
        ups_k = self.k_proj.ups
        key = (ups_k[0].weight.device, ups_k[0].weight.dtype, tuple(u.weight.data_ptr() for u in ups_k))
        if self.__dict__.get("_pack_key") == key:
            return self.__dict__["_pack"]
        from gac.kernels.latent_attention import latent_align

        hd, gk = self.head_dim, self.group_kv
        rk, rv = self.k_proj.ranks, self.v_proj.ranks
        w = ups_k[0].weight
        rk_max = -(-max(rk) // 32) * 32
        uk = torch.zeros(self.kv_heads, hd, rk_max, device=w.device, dtype=w.dtype)
        koff, kr = [], []
        ko = self.k_proj.offsets()
        with torch.no_grad():
            for h in range(self.kv_heads):
                g, j = divmod(h, gk)
                uk[h, :, : rk[g]] = ups_k[g].weight[j * hd : (j + 1) * hd]
                koff.append(ko[g])
                kr.append(rk[g])
            # each group's value up-projection per KV head, transposed: [G, r_g, hd]
            uv = [u.weight.detach().view(gk, hd, -1).transpose(1, 2).contiguous() for u in self.v_proj.ups]
        vb = None
        if self.v_proj.ups[0].bias is not None:
            vb = torch.cat([u.bias.detach() for u in self.v_proj.ups]).view(1, self.kv_heads, 1, hd)
        pack = {
            "uk": uk,
            "koff": torch.tensor(koff, dtype=torch.int32, device=w.device),
            "kr": torch.tensor(kr, dtype=torch.int32, device=w.device),
            "rk_max": rk_max,
            "kv_heads": self.kv_heads,
            "align": latent_align(*koff, *kr),
            "v_offsets": self.v_proj.offsets(),
            "v_ranks": rv,
            "uv": uv,
            "v_bias": vb,
        }
        self.__dict__["_pack"], self.__dict__["_pack_key"] = pack, key
        return pack

    def _kernel_forward(
        self, hidden_states, position_embeddings, cache, cache_position, position_ids
    ) -> torch.Tensor:
        from gac.kernels.latent_attention import latent_decode_attention

        b = hidden_states.shape[0]
        q = self._queries(hidden_states, position_embeddings)[:, :, 0]
        # a static cache's slot j holds position j: the new token's slot is its position
        # (transformers >= 5.2x passes cache_position to attention; older 5.x only position_ids)
        where = cache_position if cache_position is not None else position_ids[0]
        zk, zv = self.k_proj.latent(hidden_states), self.v_proj.latent(hidden_states)
        kw = {"cache_position": cache_position} if cache_position is not None else {}
        k4, v4 = cache.update(zk.unsqueeze(1), zv.unsqueeze(1), self.layer_idx, kw)
        pack = self.decode_pack()
        rot = self._rotary
        outs = latent_decode_attention(
            q.contiguous(),
            k4[:, 0],
            v4[:, 0],
            pack,
            where[-1:] + 1,
            rot.inv_freq.float(),
            self.scaling,
            float(getattr(rot, "attention_scaling", 1.0)),
        )  # per group [B, H_g, r_g]
        if self.folded:
            flat = torch.cat([o.reshape(b, -1) for o in outs], dim=1)
            return self.o_proj(flat).unsqueeze(1)
        # per-head latent outputs through their KV head's value up-projection, then o_proj
        n_rep = self.num_key_value_groups
        v = torch.cat(
            [
                torch.matmul(o.view(b, self.group_kv, n_rep, -1), u)
                for o, u in zip(outs, pack["uv"], strict=True)
            ],
            dim=1,
        )  # [B, KVH, n_rep, hd]
        if pack["v_bias"] is not None:
            v = v + pack["v_bias"]
        return self.o_proj(v.reshape(b, 1, -1))

    # ----------------------------------------------------------------- forward
    def _attend(self, q, k, v, mask, **kwargs) -> torch.Tensor:
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

        impl = getattr(self.config, "_attn_implementation", "sdpa") or "sdpa"
        if impl not in ("eager", "sdpa"):
            impl = "sdpa"  # latent values are narrower than head_dim: flash kernels need equal dims
        if impl == "eager":
            from transformers.models.llama.modeling_llama import eager_attention_forward as fn
        else:
            fn = ALL_ATTENTION_FUNCTIONS[impl]
        kwargs = {k_: v_ for k_, v_ in kwargs.items() if k_ in ("is_causal", "output_attentions")}
        out, _ = fn(
            self,
            q,
            k,
            v,
            mask,
            dropout=0.0 if not self.training else self.attention_dropout,
            scaling=self.scaling,
            **kwargs,
        )
        return out  # [B, S, H, Dv]

    def _queries(self, hidden_states, position_embeddings) -> torch.Tensor:
        b, s, _ = hidden_states.shape
        q = self.q_proj(hidden_states).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        if position_embeddings is not None:
            cos, sin = position_embeddings
            q = apply_rope(q, cos.to(q.dtype), sin.to(q.dtype))
        return q

    @staticmethod
    def _positions(hidden_states, position_ids, cache_position) -> torch.Tensor:
        b, s, _ = hidden_states.shape
        if position_ids is None:
            position_ids = (
                cache_position.unsqueeze(0)
                if cache_position is not None
                else torch.arange(s, device=hidden_states.device).unsqueeze(0)
            )
        return position_ids.expand(b, s)

    def _attention_inputs(self, hidden_states, position_embeddings, cache, position_ids, cache_position):
        """Roped queries, roped keys rebuilt from every cached latent, and the value latents."""
        q = self._queries(hidden_states, position_embeddings)
        pos = self._positions(hidden_states, position_ids, cache_position)
        zk, zv = self.k_proj.latent(hidden_states), self.v_proj.latent(hidden_states)
        zk_all, zv_all, kpos = self._cached(zk, zv, pos, cache, cache_position)
        return q, self._keys(zk_all, kpos), zv_all

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
        attention_mask: torch.Tensor | None = None,
        past_key_values: Any = None,
        position_ids: torch.Tensor | None = None,
        cache_position: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, None]:
        if self._kernel_ok(hidden_states, past_key_values, cache_position, position_ids):
            out = self._kernel_forward(
                hidden_states, position_embeddings, past_key_values, cache_position, position_ids
            )
            return out, None
        if not self.folded:
            return self.reference_forward(
                hidden_states,
                position_embeddings,
                attention_mask,
                past_key_values,
                position_ids,
                cache_position,
                **kwargs,
            )
        b, s, _ = hidden_states.shape
        q, k, zv_all = self._attention_inputs(
            hidden_states, position_embeddings, past_key_values, position_ids, cache_position
        )
        outs = []
        for g, (off, r) in enumerate(zip(self.v_proj.offsets(), self.v_proj.ranks, strict=True)):
            kv = slice(g * self.group_kv, (g + 1) * self.group_kv)
            vg = zv_all[:, None, :, off : off + r].expand(b, self.group_kv, zv_all.shape[1], r)
            og = self._attend(q[:, self.group_heads(g)], k[:, kv], vg, attention_mask, **kwargs)
            outs.append(og.reshape(b, s, -1))
        return self.o_proj(torch.cat(outs, dim=-1)), None

    def reference_forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
        attention_mask: torch.Tensor | None = None,
        past_key_values: Any = None,
        position_ids: torch.Tensor | None = None,
        cache_position: torch.Tensor | None = None,
        o_proj: nn.Linear | None = None,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, None]:
        """Reconstruct full K and V from the latents and attend as the dense model does.

        ``o_proj`` is the unfolded output projection (required when the module is folded).
        """
        o = o_proj if o_proj is not None else self.o_proj
        if self.folded and o_proj is None:
            raise GacError("reference_forward of a folded LatentAttention needs the original o_proj")
        b, s, _ = hidden_states.shape
        q, k, zv_all = self._attention_inputs(
            hidden_states, position_embeddings, past_key_values, position_ids, cache_position
        )
        t = zv_all.shape[1]
        v = self.v_proj.reconstruct(zv_all).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        out = self._attend(q, k, v, attention_mask, **kwargs)
        return o(out.reshape(b, s, -1)), None

    # ------------------------------------------------------------- persistence
    def gac_spec(self) -> dict[str, Any]:
        """What :meth:`skeleton` needs to rebuild this module before loading weights."""
        return {
            "ranks_k": self.k_proj.ranks,
            "ranks_v": self.v_proj.ranks,
            "heads": self.heads,
            "kv_heads": self.kv_heads,
            "head_dim": self.head_dim,
            "hidden": self.k_proj.in_features,
            "bias_k": self.k_proj.ups[0].bias is not None,
            "bias_v": self.v_proj.ups[0].bias is not None,
            "bias_o": self.o_proj.bias is not None,
            "folded": self.folded,
        }

    @classmethod
    def skeleton(cls, spec: dict[str, Any], original: nn.Module, model: nn.Module) -> LatentAttention:
        """An empty module of ``spec``'s shapes (on ``original``'s device, usually meta) to load into."""
        rotary = model_rotary(model)
        w = original.q_proj.weight
        dev, dt = w.device, w.dtype
        hd, kvh = int(spec["head_dim"]), int(spec["kv_heads"])
        n_groups = len(spec["ranks_k"])
        group_out = hd * kvh // n_groups
        k = LatentProjection(spec["hidden"], spec["ranks_k"], group_out, spec["bias_k"], dev, dt)
        v = LatentProjection(spec["hidden"], spec["ranks_v"], group_out, spec["bias_v"], dev, dt)
        heads = int(spec["heads"])
        if spec["folded"]:
            per_head = [spec["ranks_v"][(h // (heads // kvh)) // (kvh // n_groups)] for h in range(heads)]
            o = nn.Linear(sum(per_head), spec["hidden"], bias=spec["bias_o"], device=dev, dtype=dt)
        else:
            o = original.o_proj
        m = cls(
            original.q_proj,
            k,
            v,
            o,
            heads,
            kvh,
            hd,
            original.layer_idx,
            original.config,
            original.scaling,
            rotary,
            fold_values=False,
        )
        m.folded = bool(spec["folded"])
        return m


def model_rotary(model: nn.Module) -> nn.Module | None:
    """The model's rotary embedding module (found by the family adapter), or None."""
    from gac.models.adapters import get_adapter

    try:
        return model.get_submodule(get_adapter(model).rotary_fqn)
    except (AttributeError, GacError):
        pass
    found = [m for _, m in model.named_modules() if hasattr(m, "inv_freq")]
    return found[0] if found else None


def latent_modules(model: nn.Module) -> list[tuple[str, LatentAttention]]:
    """Every :class:`LatentAttention` in ``model`` with its name."""
    return [(n, m) for n, m in model.named_modules() if isinstance(m, LatentAttention)]


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
        from gac.models.adapters import get_adapter

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


def _latent_cache_base() -> type:
    from transformers import DynamicCache

    return DynamicCache


class LatentCache(_latent_cache_base()):  # type: ignore[misc]
    """A :class:`transformers.DynamicCache` for latent-attention models, with its size in bytes.

    Any ``transformers`` cache holds latents when the model's attention is
    :class:`LatentAttention` (its layers allocate from the first update's shapes); this one adds
    :meth:`nbytes` so callers can report what the latent cache costs. Pass it to ``generate``::

        model.generate(ids, past_key_values=LatentCache(), max_new_tokens=32)
    """

    def nbytes(self) -> int:
        """Bytes held by the cached keys and values (latents) of every layer."""
        total = 0
        for layer in self.layers:
            for t in (getattr(layer, "keys", None), getattr(layer, "values", None)):
                if isinstance(t, torch.Tensor):
                    total += t.numel() * t.element_size()
        return total


@torch.no_grad()
def pad_latent_rank_(attn: LatentAttention, kind: str, group: int, r_new: int) -> None:
    """Zero-pad group ``group``'s ``kind`` (``"k"``/``"v"``) latent rank to ``r_new``, exactly.

    The new latent dims have zero down-projection rows (they cache zeros) and zero up-projection
    columns (and, for folded values, zero ``o_proj`` columns), so every output is unchanged.
    """
    proj = attn.k_proj if kind == "k" else attn.v_proj
    r, off = proj.ranks[group], proj.offsets()[group]
    if r_new < r:
        raise GacError(f"cannot pad latent rank {r} down to {r_new}")
    if r_new == r:
        return
    extra = r_new - r
    w = proj.down.weight
    rows = torch.zeros(extra, w.shape[1], device=w.device, dtype=w.dtype)
    new_down = nn.Linear(w.shape[1], w.shape[0] + extra, bias=False, device=w.device, dtype=w.dtype)
    new_down.weight.copy_(torch.cat([w[: off + r], rows, w[off + r :]]))
    proj.down = new_down
    up = proj.ups[group]
    new_up = nn.Linear(r_new, up.out_features, bias=up.bias is not None, device=w.device, dtype=w.dtype)
    new_up.weight.zero_()
    new_up.weight[:, :r].copy_(up.weight)
    if up.bias is not None:
        new_up.bias.copy_(up.bias)
    proj.ups[group] = new_up
    if kind == "v" and attn.folded:
        o = attn.o_proj
        cols, at = [], 0
        ranks_before = [proj.ranks[g] if g != group else r for g in range(len(proj.ranks))]
        for h in range(attn.heads):
            g = (h // attn.num_key_value_groups) // attn.group_kv
            width = ranks_before[g]
            cols.append(o.weight[:, at : at + width])
            if g == group:
                cols.append(torch.zeros(o.weight.shape[0], extra, device=w.device, dtype=w.dtype))
            at += width
        new_o = nn.Linear(
            sum(c.shape[1] for c in cols),
            o.out_features,
            bias=o.bias is not None,
            device=w.device,
            dtype=w.dtype,
        )
        new_o.weight.copy_(torch.cat(cols, dim=1))
        if o.bias is not None:
            new_o.bias.copy_(o.bias)
        attn.o_proj = new_o
    attn.__dict__.pop("_pack_key", None)
