"""Attention over a low-rank KV cache (PaLU's latent cache).

PaLU (Chang et al., EMNLP 2024) factorizes ``k_proj`` and ``v_proj`` per *group* of KV heads:
one shared down-projection ``hidden -> Σ r_g`` and, per group ``g``, an up-projection
``r_g -> G·head_dim`` (G KV heads per group). The cache then stores the ``Σ r_g`` latents of each
token instead of its ``2·kv_heads·head_dim`` keys and values. Keys and values may be grouped
apart (``G_k`` and ``G_v`` KV heads per group): keys are rebuilt at every decode step, values never.

:class:`LatentAttention` is the attention module of such a model:

* **Keys** are reconstructed from the cached latents at attention time (``U z + b``: a key bias,
  Qwen2's layout, is the up-projection's), RMS-normalized per head where the family has a ``k_norm``
  (Qwen3, Gemma-3: the latent stays linear, only the rebuild gains the norm), and RoPE is applied
  *after* that, at each cached token's own position (PaLU's order: RoPE does not commute with the
  low-rank projection).
* **Values** stay latent in the cache. Softmax rows sum to one, so
  ``Σ_t p_t·(U z_t + b) = U·(Σ_t p_t z_t) + b``: on the decode path (CUDA, static cache, one new
  token) attention runs over the value latents and each query head's latent output goes through
  its KV head's up-projection before ``o_proj``; with ``fold_values`` the up-projections are folded
  into ``o_proj`` once and every path attends over the latents. Unfolded prefill (and every case
  the decode kernel cannot serve) rebuilds K and V from the latents and attends on the KV heads.
* The cache is any :class:`transformers.Cache` (``DynamicCache``, ``StaticCache``,
  :class:`LatentCache`): the module hands it latents shaped ``[batch, 1, tokens, Σ r]``, which
  the layers allocate from the first update. A dynamic cache also records each cached token's
  position (left-padded batches keep their own RoPE positions); a static cache's slot ``j`` holds
  position ``j``.
* **No silent fallback.** Every eager call with a cache records the path single-token steps take
  (:func:`latent_attention_paths`: kernel or reference, with the reasons) and warns once per reason
  the kernel cannot serve (not on CUDA, a dynamic cache, a head_dim the kernel does not take...).

:meth:`LatentAttention.reference_forward` is the reconstruct-and-attend path: K and V of the
filled slots only (a static cache is cut to its filled length in eager mode), cos/sin built once per
position where the batch shares them, and SDPA on the KV heads (each KV head's query heads folded
into its query rows, no ``repeat_kv`` copy). Every other path must reproduce it.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import torch
from torch import nn

from gac.compat import attention_cache
from gac.errors import GacError


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """``[-x2, x1]`` for ``x = [x1, x2]`` along the last dim (the Llama RoPE convention)."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE on ``x [B, H, T, D]`` with ``cos, sin [B, T, D]``."""
    return x * cos.unsqueeze(1) + rotate_half(x) * sin.unsqueeze(1)


#: :func:`one_gemm`'s bound on ``rows · Σ r_g · group_out``, the multiply-adds of one group-width GEMM over every
#: latent column: the block-diagonal GEMM runs ``len(ranks) - 1`` times them on zeros, and saves as many launches.
#: On an H200, compiled, in CUDA graphs (``benchmarks/results/h200/palu-default/call43/latent_prefill.json``), one GEMM
#: took 0.54-0.87x the per-group time up to 5.4e8 (Llama-3-8B's keys in four groups of 2 KV heads, 128-4096 rows) and
#: 1.17x at 2.1e9; 0.85-0.86x up to 1.3e8 and 1.03x at 5.4e8 in two groups of 4. The break-even lies at 0.5-1.1e9
#: across the five shapes timed; this bound picked the faster way at 22 of their 25 points, losing 0.2-0.9 us at two
#: and 13 us at the third (Qwen2.5-7B's biased keys at 16384 rows, whose per-group GEMMs each copy their bias in)
ONE_GEMM_MAX_MACS = 1 << 29


def one_gemm(rows: int, ranks: list[int], group_out: int) -> bool:
    """Whether ``rows`` latent rows of groups of ``ranks`` rebuild in one GEMM against the block-diagonal of the
    up-projections instead of one GEMM a group.

    The block-diagonal GEMM does ``len(ranks)`` times the multiply-adds, the added ones on zeros, in one launch
    instead of ``len(ranks)`` (and no concatenation). At few rows (a short prompt) each launch costs more than
    its work, so one launch wins; at many, the wasted work does. The bound is the work of a GEMM that
    takes about as long as a launch: :data:`ONE_GEMM_MAX_MACS`.

    >>> one_gemm(128, [128] * 4, 256), one_gemm(16384, [128] * 4, 256), one_gemm(128, [256], 512)
    (True, False, False)
    """
    return len(ranks) > 1 and rows * sum(ranks) * group_out <= ONE_GEMM_MAX_MACS


def _not_plain(m: nn.Module) -> str | None:
    """Why calling ``m`` is more than its weight's GEMM (None: it is not): an ``nn.Linear`` (or a subclass) with no
    forward of its own on the instance and no hooks (accelerate's offloading wraps the forward and loads the weight
    in its hook; a LoRA layer is not an ``nn.Linear``), whose weight is in memory (not on the meta device)."""
    if not isinstance(m, nn.Linear):
        return f"an up-projection is a {type(m).__name__}, not a linear layer"
    if "forward" in m.__dict__ or getattr(m, "_hf_hook", None) is not None:
        return "an up-projection's forward is wrapped (accelerate's hooks: offloaded or dispatched weights)"
    if m._forward_hooks or m._forward_pre_hooks:
        return "an up-projection has forward hooks"
    if m.weight.device.type == "meta":
        return "an up-projection's weight is on the meta device"
    return None


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

    def one_gemm(self, rows: int) -> bool:
        """Whether :meth:`reconstruct` of ``rows`` latent rows runs as one GEMM (:func:`one_gemm`): only where every
        up-projection is a plain linear layer (:func:`_not_plain`), since the one GEMM reads their weights without
        calling them. Where the rule holds but a layer is not plain, that is warned once and recorded
        (:func:`latent_attention_paths`' ``prompt_rebuild_per_group``)."""
        if not one_gemm(rows, self.ranks, self.group_out):
            return False
        why = next((w for w in map(_not_plain, self.ups) if w is not None), None)
        if why is not None and not torch.compiler.is_compiling():
            self.__dict__["_one_gemm_refused"] = why
            _warn_once(why, "{}: a prompt's latent rebuild takes one GEMM a group, not one in all (slower)")
        return why is None

    def reconstruct(self, z: torch.Tensor) -> torch.Tensor:
        """``cat_g(up_g(z[..., slice_g]))``: one GEMM a group, or, for few rows (:meth:`one_gemm`), one GEMM
        against the block-diagonal of the up-projections (exact: the blocks off the diagonal are zeros)."""
        if self.one_gemm(z.numel() // max(z.shape[-1], 1)):
            w = torch.block_diag(*(u.weight for u in self.ups))
            b = torch.cat([u.bias for u in self.ups]) if self.ups[0].bias is not None else None
            return nn.functional.linear(z, w, b)
        parts = z.split(self.ranks, dim=-1)
        return torch.cat([up(p) for up, p in zip(self.ups, parts, strict=True)], dim=-1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.reconstruct(self.latent(x))

    @property
    def weight(self) -> torch.Tensor:
        """The dense equivalent ``[out, in]`` (computed; for inspection)."""
        down = self.down if hasattr(self.down, "weight") else self.down.to_original()  # a fused slice
        return torch.cat(
            [u.weight @ d for u, d in zip(self.ups, down.weight.split(self.ranks, 0), strict=True)]
        )


def raw_key_groups(proj: LatentProjection) -> list[bool]:
    """Per group of ``proj``: whether it is kept at full width with the identity as its up-projection, so its
    latents are the projection's outputs themselves (PaLU stores a full-rank key group so: exact, and the decode
    kernel reads such keys as cached instead of rebuilding them).

    >>> lp = LatentProjection(8, [4, 2], 4)
    >>> _ = lp.ups[0].weight.data.copy_(torch.eye(4))
    >>> raw_key_groups(lp)
    [True, False]
    """
    out = []
    for u in proj.ups:
        w = u.weight
        out.append(
            w.shape[0] == w.shape[1]
            and bool(torch.equal(w.detach(), torch.eye(w.shape[0], device=w.device, dtype=w.dtype)))
        )
    return out


log = logging.getLogger(__name__)

#: SDPA takes ``enable_gqa`` (torch >= 2.5)
SDPA_GQA = tuple(int(x) for x in torch.__version__.split(".")[:2]) >= (2, 5)

#: reasons already warned about (once per process; see :meth:`LatentAttention._note_path`)
_WARNED: set[str] = set()
#: the reason recorded, not warned, when the kernel was switched off on purpose
SWITCHED_OFF = "kernel switched off (use_kernel=False)"
SPEC_VERSION = 2


def _warn_once(
    reason: str, effect: str = "decode takes the reference path: {} (the Triton kernel cannot serve it)"
) -> None:
    """Warn ``effect`` (with ``reason`` in it) once per process and reason."""
    if reason in _WARNED:
        return
    _WARNED.add(reason)
    log.warning("latent attention: %s", effect.format(reason))


#: rows of :func:`rope_table`: the offsets 0..128, so every token tile up to 128 finds its in-tile offsets
#: and its tile step (row ``BLOCK_T``) in it; a larger tile evaluates them in the kernel
ROPE_ROWS = 129


def rope_table(inv_freq: torch.Tensor) -> torch.Tensor:
    """``[2, ROPE_ROWS, HD/2]`` fp32: cos and sin of ``o · inv_freq`` for the offsets ``o = 0..ROPE_ROWS-1``.

    Computed in float64 once (the decode pack keeps it, ``pack["rope"]``). With it the decode kernel
    (:mod:`gac.kernels.latent_attention`, which reads the row count off the table) reads each
    tile's in-tile cos/sin and the tile step instead of evaluating a sine and cosine per element: only the
    split's start angle is evaluated, and each later tile's start is the previous one rotated by the step.
    Without it (``pack`` has no ``"rope"``) the kernel evaluates the same values itself.

    >>> rope_table(torch.tensor([1.0, 0.5])).shape
    torch.Size([2, 129, 2])
    """
    ang = torch.arange(ROPE_ROWS, device=inv_freq.device, dtype=torch.float64)[:, None] * inv_freq.double()
    return torch.stack([ang.cos(), ang.sin()]).float().contiguous()


def _version(t: torch.Tensor) -> int | None:
    """``t``'s in-place version counter; None for an inference tensor (made under ``torch.inference_mode``),
    which keeps none."""
    try:
        return t._version
    except RuntimeError:
        return None


def _static_rope(rotary: nn.Module) -> bool:
    """Whether ``rotary``'s ``inv_freq`` stays as built (not a RoPE that rescales it with the length)."""
    kind = str(getattr(rotary, "rope_type", "default"))
    return "dynamic" not in kind and kind != "longrope"


def _norm_weight_eps(norm: nn.Module, dim: int) -> tuple[torch.Tensor, float]:
    """An RMSNorm's effective scale ``[dim]`` (fp32) and epsilon: ``norm(x) = x·rsqrt(mean x² + eps)·w``.

    The scale is read by probing the module with a row of ones (so ``w`` and Gemma's ``1 + w`` both
    come out right), in fp32.
    """
    eps = float(getattr(norm, "variance_epsilon", getattr(norm, "eps", 1e-6)))
    params = {n: p.detach().float() for n, p in norm.named_parameters()}
    dev = next(iter(params.values())).device if params else "cpu"
    with torch.no_grad():
        y = torch.func.functional_call(norm, params, (torch.ones(1, dim, device=dev),))
    return (y.reshape(dim).float() * math.sqrt(1.0 + eps)).contiguous(), eps


class LatentAttention(nn.Module):
    """Self-attention with a PaLU latent KV cache (see the module docstring).

    Args:
        q_proj, o_proj: the original query and output projections (``o_proj`` is folded with the
            value up-projections unless ``fold_values`` is False).
        k_proj, v_proj: :class:`LatentProjection` s with one up-projection per key (value) group;
            the numbers of key and value groups may differ, each must divide ``kv_heads``.
        heads, kv_heads, head_dim: the attention geometry.
        layer_idx: the layer's index in the cache.
        config: the model config (attention implementation, dropout).
        scaling: the softmax scale.
        rotary: the model's rotary embedding module (called for the cached tokens' positions).
        q_norm, k_norm: per-head RMSNorms of queries and keys before RoPE (Qwen3, Gemma-3), or None:
            the latents stay linear and each rebuilt key row is normalized before RoPE.
    """

    #: its attention is its own (the latent kernel or its reference), never transformers' attention interface:
    #: the dense decode attention ``gac_sdpa`` would take is not this layer's
    #: (:func:`gac.kernels.attention.model_decode_modes`)
    attention_interface = False

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
        q_norm: nn.Module | None = None,
        k_norm: nn.Module | None = None,
    ) -> None:
        super().__init__()
        if heads % kv_heads:
            raise GacError(f"{heads} query heads do not split over {kv_heads} KV heads")
        for what, proj in (("key", k_proj), ("value", v_proj)):
            if kv_heads % len(proj.ranks):
                raise GacError(f"{len(proj.ranks)} {what} latent groups do not divide {kv_heads} KV heads")
        self.q_proj, self.k_proj, self.v_proj = q_proj, k_proj, v_proj
        self.q_norm, self.k_norm = q_norm, k_norm
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.num_key_value_groups = heads // kv_heads
        #: KV heads per key group and per value group
        self.group_kv_k = kv_heads // len(k_proj.ranks)
        self.group_kv_v = kv_heads // len(v_proj.ranks)
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
    def n_groups(self) -> tuple[int, int]:
        """``(key groups, value groups)``."""
        return len(self.k_proj.ranks), len(self.v_proj.ranks)

    def group_heads(self, g: int) -> slice:
        """Query heads attending value group ``g``'s KV heads."""
        q_per_group = self.group_kv_v * self.num_key_value_groups
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
            g, j = divmod(kvh, self.group_kv_v)
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
    def _filled(
        self, cache: Any, cache_position: torch.Tensor | None, t: int, dev: torch.device
    ) -> int | None:
        """Filled slots of a static cache (slot ``j`` holds position ``j``), or None where the length
        must stay static (under ``torch.compile`` or CUDA-graph capture: the full cache under its mask)."""
        if torch.compiler.is_compiling() or (dev.type == "cuda" and torch.cuda.is_current_stream_capturing()):
            return None
        if cache_position is not None:
            return min(t, int(cache_position.max()) + 1)
        n = cache.get_seq_length(self.layer_idx)
        return min(t, int(n)) if n is not None and int(n) > 0 else None

    def _cached(
        self,
        zk: torch.Tensor,
        zv: torch.Tensor,
        positions: torch.Tensor,
        cache: Any,
        cache_position: torch.Tensor | None,
        mask: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Latents ``[B, T, ·]`` of every cached token after appending this step's, their positions
        (``[1, T]`` where every row shares them, else ``[B, T]``) and the mask cut to ``T``.

        A static cache is cut to its filled slots (eagerly; see :meth:`_filled`).
        """
        b = zk.shape[0]
        if cache is None:
            return zk, zv, positions, mask
        static = bool(getattr(cache, "is_compileable", False))
        prev = 0 if static else int(cache.get_seq_length(self.layer_idx))
        kwargs = {"cache_position": cache_position} if cache_position is not None else {}
        k4, v4 = cache.update(zk.unsqueeze(1), zv.unsqueeze(1), self.layer_idx, kwargs)
        zk_all, zv_all = k4[:, 0], v4[:, 0]
        t = zk_all.shape[1]
        if static:  # slot j holds position j: shared by every row
            n = self._filled(cache, cache_position, t, zk.device)
            if n is not None and n < t:
                zk_all, zv_all = zk_all[:, :n], zv_all[:, :n]
                if mask is not None and mask.shape[-1] == t:
                    mask = mask[..., :n]
                t = n
            return zk_all, zv_all, torch.arange(t, device=zk.device).unsqueeze(0), mask
        positions = positions.expand(b, positions.shape[1])
        store = cache.__dict__.setdefault("_gac_key_positions", {})
        old = store.get(self.layer_idx)
        old = old[:, :prev] if old is not None and prev else positions[:, :0]
        pos = torch.cat([old.to(positions.device), positions], dim=1)
        store[self.layer_idx] = pos
        if pos.shape[1] != t:
            raise GacError(
                f"latent cache of layer {self.layer_idx} holds {t} tokens but {pos.shape[1]} positions"
            )
        if b > 1 and not torch.compiler.is_compiling() and bool((pos == pos[:1]).all()):
            pos = pos[:1]  # no left padding: one RoPE table for the batch
        return zk_all, zv_all, pos, mask

    def _keys(
        self, zk_all: torch.Tensor, pos: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None = None
    ) -> torch.Tensor:
        """Full keys ``[B, kv_heads, T, hd]`` from the latents: (bias,) per-head norm, RoPE at ``pos``.

        ``pos`` is ``[1, T]`` (cos/sin built once, shared by the batch) or ``[B, T]``. ``rope``: the cos/sin of
        ``pos`` where the caller has them (the queries' own, when the keys are this call's tokens alone).
        """
        b, t, _ = zk_all.shape
        k = self.k_proj.reconstruct(zk_all).view(b, t, self.kv_heads, self.head_dim)
        if self.k_norm is not None:
            k = self.k_norm(k)
        k = k.transpose(1, 2)
        if self._rotary is None:
            return k
        cos, sin = rope if rope is not None else self._rotary(k, pos)
        return apply_rope(k, cos.to(k.dtype), sin.to(k.dtype))

    def key_group_shape(self, g: int) -> dict[str, int]:
        """``{"key_group", "query_rows", "width"}`` of key group ``g``: KV heads a group, the query heads they serve
        (the decode kernel's launch row) and the group's key width; what the profile's key rank tile is read for
        (:meth:`gac.hardware.profile.Profile.key_rank_modulus`)."""
        gk = int(self.group_kv_k)
        return {
            "key_group": gk,
            "query_rows": gk * int(self.num_key_value_groups),
            "width": int(self.k_proj.ups[g].out_features),
        }

    # ------------------------------------------------------ fused decode kernel
    #: use the Triton decode kernel (CUDA, static cache, one new token) where it applies
    use_kernel: bool = True

    def decode_refusals(
        self, hidden_states: torch.Tensor, cache: Any, cache_position: Any, position_ids: Any
    ) -> list[str]:
        """Why the decode kernel cannot serve single-token steps against ``cache`` (empty: it can)."""
        # one of gac.nn's allowed upward edges (tests/test_architecture.py, NN_KERNEL_EDGE): the
        # decode kernel's file, imported when a step runs; it imports only gac.alignment and Triton
        from gac.kernels import latent_attention as kl

        out = []
        if not self.use_kernel:
            out.append(SWITCHED_OFF)
        if not hidden_states.is_cuda:
            out.append("not on CUDA")
        if cache is None or not getattr(cache, "is_compileable", False):
            out.append(f"dynamic cache ({type(cache).__name__})")
        if cache_position is None and position_ids is None:
            out.append("no cache_position or position_ids")
        if self._rotary is None or not hasattr(self._rotary, "inv_freq"):
            out.append("no rotary inv_freq")
        if not kl.HAVE_TRITON:
            out.append("Triton not installed")
        hd, n_rep, gk = self.head_dim, self.num_key_value_groups, self.group_kv_k
        if not kl.kernel_supported(hd, n_rep, gk):
            why = []
            if hd < 32 or hd & (hd - 1):
                why.append(f"head_dim {hd} not a power of two >= 32")
            if n_rep * gk > kl.MAX_GROUP_HEADS:
                why.append(f"{n_rep * gk} query heads per key group (more than {kl.MAX_GROUP_HEADS})")
            if kl.HAVE_TRITON:
                out += why or [f"head_dim {hd} with {n_rep} query heads per KV head (kernel_supported)"]
        # what the kernel of this build takes (``FEATURES`` in gac.kernels.latent_attention)
        feats = getattr(kl, "FEATURES", frozenset())
        if self.k_proj.ups[0].bias is not None and "k_bias" not in feats:
            out.append("key bias (this build's decode kernel takes none)")
        if self.k_norm is not None and "k_norm" not in feats:
            out.append("per-head key norm (this build's decode kernel takes none)")
        return out

    def _note_path(self, reasons: list[str]) -> None:
        """Record the decode path (read by :func:`latent_attention_paths`) and warn once per reason."""
        self.__dict__["_decode_path"] = ("reference" if reasons else "kernel", tuple(reasons))
        for r in reasons:
            if r != SWITCHED_OFF:
                _warn_once(r)

    def _kernel_ok(
        self, hidden_states: torch.Tensor, cache: Any, cache_position: Any, position_ids: Any
    ) -> bool:
        return hidden_states.shape[1] == 1 and not self.decode_refusals(
            hidden_states, cache, cache_position, position_ids
        )

    def decode_pack(self) -> dict[str, Any]:
        """Packed key up-projections, latent offsets/ranks and value up-projections for the decode kernel.

        Keys: ``uk [KVH, hd, rk_max]`` (each KV head's rows of its key group's up-projection),
        ``koff``/``kr`` (its group's latent offset and rank), ``k_bias [KVH, hd]`` or None (added
        before the norm and RoPE), ``k_norm [hd]`` (fp32, the effective RMSNorm scale) or None with
        ``k_norm_eps``; ``uv`` (per value group ``[G_v, r_g, hd]``), ``v_offsets``/``v_ranks``,
        ``v_bias [1, KVH, 1, hd]`` or None. Key and value groups may differ in size. ``k_raw``: every key
        group is cached raw (:func:`raw_key_groups`); ``koff`` is then each KV head's own column, ``kr`` its
        ``hd``, and ``uk`` unused. Cached until the weights move (device, dtype or storage change).

        Under ``torch.compile`` the cached pack is returned while the weights keep its device and dtype:
        a storage check (``data_ptr``) breaks Dynamo's graph, and on CUDA each break sent the rest of the
        layer's step to eager (8 breaks and 12 compiled frames for a 3-layer model, 18-22 frames on the
        8-layer grid shapes: ``benchmarks/results/h100/palu-trace/breaks.log``). Every eager call with a
        cache the kernel can serve packs (the infer sweep's first decode step, ``gac generate``'s first
        prefill); a compiled step with no pack yet builds it outside the graph (a graph break).
        """
        ups_k = self.k_proj.ups
        w = ups_k[0].weight
        if torch.compiler.is_compiling():
            key = self.__dict__.get("_pack_key")
            if key is not None and key[0] == w.device and key[1] == w.dtype:
                return self.__dict__["_pack"]
            return torch.compiler.disable(self._build_pack)()
        return self._build_pack()

    def _build_pack(self) -> dict[str, Any]:
        """:meth:`decode_pack`, checked against the weights' storage (eager)."""
        ups_k = self.k_proj.ups
        tensors = [u.weight for u in ups_k] + [u.bias for u in ups_k if u.bias is not None]
        if self.k_norm is not None:
            tensors += list(self.k_norm.parameters())
        inv = getattr(self._rotary, "inv_freq", None)
        rope_key = None if inv is None else (inv.data_ptr(), _version(inv))
        key = (ups_k[0].weight.device, ups_k[0].weight.dtype, tuple(t.data_ptr() for t in tensors), rope_key)
        if self.__dict__.get("_pack_key") == key:
            return self.__dict__["_pack"]
        from gac.kernels.latent_attention import (  # the allowed edge (decode_refusals)
            latent_align,
            per_kv_head,
        )

        hd, gk, gv = self.head_dim, self.group_kv_k, self.group_kv_v
        rk, rv = self.k_proj.ranks, self.v_proj.ranks
        w = ups_k[0].weight
        # every key group cached raw (full width, identity up-projection): the kernel reads each KV head's keys
        # at its own column (koff) and rebuilds nothing; a layer with some raw groups rebuilds them all (warned)
        raw_groups = raw_key_groups(self.k_proj)
        raw = all(raw_groups)
        if any(raw_groups) and not raw:
            _warn_once(
                "a layer's key groups are only partly at full width",
                "{}: the decode kernel rebuilds its raw keys through their identity up-projection "
                "(slower; recorded as raw_keys_rebuilt)",
            )
        rk_max = 32 if raw else -(-max(rk) // 32) * 32
        uk = torch.zeros(self.kv_heads, hd, rk_max, device=w.device, dtype=w.dtype)
        koff, kr = [], []
        ko = self.k_proj.offsets()
        with torch.no_grad():
            for h in range(self.kv_heads):
                g, j = divmod(h, gk)
                if raw:
                    koff.append(ko[g] + j * hd)
                    kr.append(hd)
                    continue
                uk[h, :, : rk[g]] = ups_k[g].weight[j * hd : (j + 1) * hd]
                koff.append(ko[g])
                kr.append(rk[g])
            # each value group's up-projection per KV head, transposed: [G_v, r_g, hd]
            uv = [u.weight.detach().view(gv, hd, -1).transpose(1, 2) for u in self.v_proj.ups]
            # value groups of one rank: one tensor over every KV head (one batched GEMM a step; the groups'
            # entries are views of it)
            uv_all = torch.cat(uv).contiguous() if len(set(rv)) == 1 else None
            uv = list(uv_all.split(gv)) if uv_all is not None else [u.contiguous() for u in uv]
        kb = vb = None
        if ups_k[0].bias is not None:
            kb = torch.cat([u.bias.detach() for u in ups_k]).view(self.kv_heads, hd).contiguous()
        if self.v_proj.ups[0].bias is not None:
            vb = torch.cat([u.bias.detach() for u in self.v_proj.ups]).view(1, self.kv_heads, 1, hd)
        kn, eps = (None, 0.0) if self.k_norm is None else _norm_weight_eps(self.k_norm, hd)
        pack = {
            "uk": uk,
            "koff": torch.tensor(koff, dtype=torch.int32, device=w.device),
            "kr": torch.tensor(kr, dtype=torch.int32, device=w.device),
            "rk_max": rk_max,
            "kv_heads": self.kv_heads,
            "k_group_kv": gk,
            "k_group": gk,  # the kernel's name for it (KV heads per key group)
            "k_raw": raw,
            "k_raw_rebuilt": any(raw_groups) and not raw,
            "align": latent_align(*koff, *kr),
            "k_bias": kb,
            "k_norm": None if kn is None else kn.to(w.device),
            "k_norm_eps": eps,
            "v_offsets": self.v_proj.offsets(),
            "v_ranks": rv,
            "v_group_kv": gv,
            "uv": uv,
            "uv_all": uv_all,
            "v_bias": vb,
            # the rotary cos/sin of the kernel's in-tile offsets; not for a RoPE whose frequencies change
            # with the length (dynamic, longrope): under torch.compile the pack is not rebuilt when they do
            "rope": rope_table(inv.to(w.device)) if inv is not None and _static_rope(self._rotary) else None,
        }
        if pack["rope"] is None and inv is not None:
            _warn_once(
                f"rotary type {getattr(self._rotary, 'rope_type', '?')!r} rescales its frequencies with the length",
                "{}: the decode kernel evaluates RoPE's sine and cosine in its loop (slower; recorded as rope_in_loop)",
            )
        per_kv_head(pack, w.device)  # the kernel's per-KV-head value tables, kept in the pack now (eager)
        self.__dict__["_pack"], self.__dict__["_pack_key"] = pack, key
        return pack

    def _kernel_forward(
        self, hidden_states, position_embeddings, cache, cache_position, position_ids
    ) -> torch.Tensor:
        from gac.kernels.latent_attention import latent_decode_attention  # the allowed edge (decode_refusals)

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
        one_up = pack["uv_all"] is not None and not self.folded
        outs = latent_decode_attention(
            q.contiguous(),
            k4[:, 0],
            v4[:, 0],
            pack,
            where[-1:] + 1,
            rot.inv_freq.float(),
            self.scaling,
            float(getattr(rot, "attention_scaling", 1.0)),
            whole=one_up,
        )  # per value group [B, H_g, r_g]; whole: [B, H, >= r]
        if self.folded:
            flat = torch.cat([o.reshape(b, -1) for o in outs], dim=1)
            return self.o_proj(flat).unsqueeze(1)
        # per-head latent outputs through their KV head's value up-projection, then o_proj
        # (an einsum, a GEMM batched over KV heads: a broadcast matmul would copy the up-projections
        # once per sequence); value groups of one rank take one GEMM over every KV head
        n_rep = self.num_key_value_groups
        if one_up:
            r = pack["v_ranks"][0]
            v = torch.einsum("bgnr,grd->bgnd", outs[..., :r].view(b, self.kv_heads, n_rep, r), pack["uv_all"])
        else:
            v = torch.cat(
                [
                    torch.einsum("bgnr,grd->bgnd", o.view(b, self.group_kv_v, n_rep, -1), u)
                    for o, u in zip(outs, pack["uv"], strict=True)
                ],
                dim=1,
            )  # [B, KVH, n_rep, hd]
        if pack["v_bias"] is not None:
            v = v + pack["v_bias"]
        return self.o_proj(v.reshape(b, 1, -1))

    # ----------------------------------------------------------------- forward
    def _attend(self, q, k, v, mask) -> torch.Tensor:
        """Softmax attention of ``q [B, H, S, D]`` on the KV heads of ``k [B, KVH, T, D]``,
        ``v [B, KVH, T, Dv]``, without a ``repeat_kv`` copy: each KV head's ``n_rep`` query heads
        become ``n_rep·S`` query rows of one SDPA head (the mask repeats over them). A whole prompt with no mask
        (``S == T``) attends causally with SDPA's grouped heads instead (``enable_gqa``: no mask built, and the
        flash kernel may take it). Returns ``[B, S, H, Dv]``."""
        b, h, s, d = q.shape
        kvh, t = k.shape[1], k.shape[2]
        rep = h // kvh
        dropout = self.attention_dropout if self.training else 0.0
        if mask is None and s == t and s > 1 and SDPA_GQA:  # a whole causal prompt: no mask to build
            out = torch.nn.functional.scaled_dot_product_attention(
                q, k, v, dropout_p=dropout, scale=self.scaling, is_causal=True, enable_gqa=rep > 1
            )
            return out.transpose(1, 2)
        qg = q.reshape(b, kvh, rep * s, d)
        if mask is None and s > 1:
            mask = torch.ones(s, t, dtype=torch.bool, device=q.device).tril(t - s)[None, None]
        if mask is not None:
            if mask.dim() == 2:
                mask = mask[None, None]
            mb, mh = mask.shape[0], mask.shape[1]
            if mh == 1:
                mask = mask[:, :, None].expand(mb, 1, rep, s, t).reshape(mb, 1, rep * s, t)
            else:  # a per-head mask
                mask = mask.reshape(mb, kvh, rep * s, t)
        out = torch.nn.functional.scaled_dot_product_attention(
            qg,
            k,
            v,
            attn_mask=mask,
            dropout_p=dropout,
            scale=self.scaling,
        )
        return out.view(b, kvh, rep, s, -1).reshape(b, h, s, -1).transpose(1, 2)

    def _queries(self, hidden_states, position_embeddings) -> torch.Tensor:
        b, s, _ = hidden_states.shape
        q = self.q_proj(hidden_states).view(b, s, self.heads, self.head_dim)
        if self.q_norm is not None:
            q = self.q_norm(q)
        q = q.transpose(1, 2)
        if position_embeddings is not None:
            cos, sin = position_embeddings
            q = apply_rope(q, cos.to(q.dtype), sin.to(q.dtype))
        return q

    @staticmethod
    def _positions(hidden_states, position_ids, cache_position) -> torch.Tensor:
        """Positions of the new tokens, ``[1, S]`` (shared) or ``[B, S]``."""
        s = hidden_states.shape[1]
        if position_ids is None:
            position_ids = (
                cache_position.unsqueeze(0)
                if cache_position is not None
                else torch.arange(s, device=hidden_states.device).unsqueeze(0)
            )
        return position_ids

    def _attention_inputs(
        self, hidden_states, position_embeddings, cache, position_ids, cache_position, mask
    ):
        """Roped queries, roped keys rebuilt from every (filled) cached latent, the value latents and
        the mask cut to them."""
        q = self._queries(hidden_states, position_embeddings)
        pos = self._positions(hidden_states, position_ids, cache_position)
        zk, zv = self.k_proj.latent(hidden_states), self.v_proj.latent(hidden_states)
        zk_all, zv_all, kpos, mask = self._cached(zk, zv, pos, cache, cache_position, mask)
        # no cache: the keys are the queries' tokens, at their positions, so they take the queries' cos/sin
        own = position_embeddings if kpos is pos and self._rotary is not None else None
        return q, self._keys(zk_all, kpos, own), zv_all, mask

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
        attention_mask: torch.Tensor | None = None,
        past_key_values: Any = None,
        position_ids: torch.Tensor | None = None,
        cache_position: torch.Tensor | None = None,
        cache: Any = None,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, None]:
        # transformers >= 5.24 hands the cache over as ``cache``; older 5.x as ``past_key_values``
        past_key_values = attention_cache(cache, past_key_values)
        if past_key_values is not None:
            # the path single-token steps against this cache take, recorded (and any reason the
            # kernel cannot serve them warned once) on every eager call with a cache, prefill too
            reasons = self.decode_refusals(hidden_states, past_key_values, cache_position, position_ids)
            if not torch.compiler.is_compiling():
                self._note_path(reasons)
                if not reasons and hidden_states.shape[1] > 1:  # a prefill packs for the compiled steps
                    self.decode_pack()  # after it (single-token steps pack in _kernel_forward)
            if not reasons and hidden_states.shape[1] == 1:
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
        q, k, zv_all, mask = self._attention_inputs(
            hidden_states, position_embeddings, past_key_values, position_ids, cache_position, attention_mask
        )
        outs = []
        gv = self.group_kv_v
        for g, (off, r) in enumerate(zip(self.v_proj.offsets(), self.v_proj.ranks, strict=True)):
            kv = slice(g * gv, (g + 1) * gv)
            vg = zv_all[:, None, :, off : off + r].expand(b, gv, zv_all.shape[1], r)
            og = self._attend(q[:, self.group_heads(g)], k[:, kv], vg, mask)
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
        """Reconstruct K and V of the filled cache from the latents and attend on the KV heads.

        Grouped (no ``repeat_kv`` copy), over the filled slots only, RoPE tables built once per
        position. ``o_proj`` is the unfolded output projection (required when the module is folded).
        """
        o = o_proj if o_proj is not None else self.o_proj
        if self.folded and o_proj is None:
            raise GacError("reference_forward of a folded LatentAttention needs the original o_proj")
        b, s, _ = hidden_states.shape
        q, k, zv_all, mask = self._attention_inputs(
            hidden_states, position_embeddings, past_key_values, position_ids, cache_position, attention_mask
        )
        t = zv_all.shape[1]
        v = self.v_proj.reconstruct(zv_all).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        out = self._attend(q, k, v, mask)
        return o(out.reshape(b, s, -1)), None

    # ------------------------------------------------------------- persistence
    def gac_spec(self) -> dict[str, Any]:
        """What :meth:`skeleton` needs to rebuild this module before loading weights.

        Version 2 (key and value group counts may differ; ``q_norm``/``k_norm``); a version-1 spec
        (no ``version``: equal group counts, no norms) loads the same way.
        """
        return {
            "version": SPEC_VERSION,
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
            "q_norm": self.q_norm is not None,
            "k_norm": self.k_norm is not None,
        }

    @classmethod
    def skeleton(cls, spec: dict[str, Any], original: nn.Module, rotary: nn.Module | None) -> LatentAttention:
        """An empty module of ``spec``'s shapes (on ``original``'s device, usually meta) to load into.

        ``rotary`` is the model's rotary embedding module (the loader finds it:
        :func:`gac.models.adapters.model_rotary`), shared with the model as in :meth:`__init__`.
        """
        version = int(spec.get("version", 1))
        if version > SPEC_VERSION:
            raise GacError(
                f"latent attention spec version {version} is newer than this gac reads ({SPEC_VERSION}); "
                "upgrade gac"
            )
        w = original.q_proj.weight
        dev, dt = w.device, w.dtype
        hd, kvh = int(spec["head_dim"]), int(spec["kv_heads"])
        rk, rv = list(spec["ranks_k"]), list(spec["ranks_v"])
        k = LatentProjection(spec["hidden"], rk, hd * kvh // len(rk), spec["bias_k"], dev, dt)
        v = LatentProjection(spec["hidden"], rv, hd * kvh // len(rv), spec["bias_v"], dev, dt)
        heads = int(spec["heads"])
        if spec["folded"]:
            per_head = [rv[(h // (heads // kvh)) // (kvh // len(rv))] for h in range(heads)]
            o = nn.Linear(sum(per_head), spec["hidden"], bias=spec["bias_o"], device=dev, dtype=dt)
        else:
            o = original.o_proj
        norms = {}
        for name in ("q_norm", "k_norm"):
            if spec.get(name):
                norm = getattr(original, name, None)
                if norm is None:
                    raise GacError(
                        f"the saved latent attention has a {name}; the architecture's attention has none"
                    )
                norms[name] = norm
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
            **norms,
        )
        m.folded = bool(spec["folded"])
        return m


def latent_modules(model: nn.Module) -> list[tuple[str, LatentAttention]]:
    """Every :class:`LatentAttention` in ``model`` with its name."""
    return [(n, m) for n, m in model.named_modules() if isinstance(m, LatentAttention)]


def latent_attention_paths(model: nn.Module) -> dict[str, Any] | None:
    """Which decode path each latent-attention layer took, or None for a model without one.

    Returns:
        ``{"kernel": layers, "reference": layers, "unrecorded": layers, "reasons": [...]}``: the path
        recorded on each layer's last eager call with a cache (see :meth:`LatentAttention.forward`)
        and every reason the kernel could not serve a layer; ``"shrunk_launches"`` where a kernel
        launch of this model's layers (their key group, key rank and value rank) needed more shared
        memory than the GPU has and ran smaller (:func:`gac.kernels.latent_attention.shrunk_launches`;
        another model's launches in the same process are not this model's); ``"rope_in_loop"``: layers
        whose decode pack has no rotary table (a RoPE that rescales with the length), so the kernel
        evaluates RoPE's sine and cosine in its loop; ``"raw_keys"``: layers whose keys are cached raw (every
        key group at full width, :func:`raw_key_groups`), which the kernel reads without a rebuild;
        ``"raw_keys_rebuilt"``: layers with only some key groups at full width, whose raw keys the kernel
        rebuilds through the identity (warned once); ``"value_pointer_loads"``: why launches on a GPU with the
        tensor-memory accelerator read value latents through registers instead of a tensor descriptor
        (:func:`gac.kernels.latent_attention.value_descriptor`, warned once; this process's launches);
        ``"latent_kernels"``: which decode kernels this process's launches took (``gluon``, the Hopper kernel of
        :mod:`gac.kernels.latent_gluon`; ``triton``), and ``"gluon_refused"`` why launches took the Triton one;
        ``"prompt_rebuild_per_group"``: why a prompt of few rows rebuilt its latents one GEMM a group, not in one
        (:meth:`LatentProjection.one_gemm`: up-projections behind hooks, as accelerate's offloading puts them).
    """
    from gac.kernels.latent_attention import (  # the allowed edge (decode_refusals)
        gluon_refusals,
        kernels_ran,
        key_group,
        shrunk_launches,
        value_pointer_reasons,
    )

    mods = [m for _, m in latent_modules(model)]
    if not mods:
        return None
    out: dict[str, Any] = {"kernel": 0, "reference": 0, "unrecorded": 0, "reasons": []}
    for m in mods:
        path, reasons = m.__dict__.get("_decode_path", ("unrecorded", ()))
        out[path] += 1
        out["reasons"] += [r for r in reasons if r not in out["reasons"]]
    packs = [p for p in (m.__dict__.get("_pack") for m in mods) if p is not None]
    shapes = {(key_group(p), int(p["rk_max"]), int(max(p["v_ranks"]))) for p in packs}
    shrunk = [r for r in shrunk_launches() if (r["key_group"], r["rk_max"], r["rv_max"]) in shapes]
    if shrunk:
        out["shrunk_launches"] = shrunk
    no_tma = value_pointer_reasons()
    if no_tma:
        out["value_pointer_loads"] = no_tma
    in_loop = sum(1 for p in packs if p["rope"] is None)
    if in_loop:
        out["rope_in_loop"] = in_loop
    for key, name in (("k_raw", "raw_keys"), ("k_raw_rebuilt", "raw_keys_rebuilt")):
        n = sum(1 for p in packs if p.get(key))
        if n:
            out[name] = n
    per_group = sorted(
        {
            w
            for m in mods
            for p in (m.k_proj, m.v_proj)
            if (w := p.__dict__.get("_one_gemm_refused")) is not None
        }
    )
    if per_group:
        out["prompt_rebuild_per_group"] = per_group
    if out["kernel"]:
        out["latent_kernels"] = kernels_ran()
        refused = gluon_refusals()
        if refused:
            out["gluon_refused"] = refused
    return out


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
