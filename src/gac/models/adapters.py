"""Structural adapters: where the dims of any decoder-only LM live, found from its modules.

Every part of gac that needs to find a projection, a norm or a head count asks the model's
:class:`FamilyAdapter` (``get_adapter(model)``) instead of guessing module names.  The adapter is
*discovered*, not looked up in a list of admitted families: the decoder layers are the model's
longest ``ModuleList`` of identical blocks, the embeddings come from ``get_input_embeddings`` /
``get_output_embeddings``, the attention and MLP of a layer are its children that hold linear
projections, and the projections are named by role from a small table of the names
``transformers`` uses (:data:`ROLE_NAMES`).  Dims are read from the modules themselves (not only
the config), so they stay right after pruning or factorization: ``intermediate(i)`` may differ per
layer, and a projection may be an ``nn.Linear`` or a :class:`gac.nn.FactorizedLinear`.

Layouts found this way (each tested on a tiny model built in code): separate q/k/v/o (Llama,
Mistral, Qwen2 with q/k/v biases, Qwen3 with per-head q/k norms, OLMo-2 with full-width q/k norms
and post-norms, Granite with its multipliers), fused qkv and gate_up (Phi-3), and other names with
LayerNorm and a parallel residual (GPT-NeoX: ``query_key_value``, ``dense_h_to_4h``...).  Where a
family really differs, :data:`EXCEPTIONS` says how (today: GPT-NeoX interleaves q/k/v per head).

Example::

    ad = get_adapter(model)
    for i in range(ad.num_layers):
        for role, fqn in ad.projections(i).items():   # role in ROLES (+ "qkv", "gate_up" when fused)
            mod = model.get_submodule(fqn)
            print(i, role, in_features(mod), out_features(mod))

A model whose structure cannot be understood gets one :class:`GacError` line naming the part that
was not found.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torch import nn

from gac.errors import GacError
from gac.nn import FactorizedLinear
from gac.nn.latent import LatentProjection

#: projection roles of one decoder layer, in forward order (unfused layout)
ROLES: tuple[str, ...] = ("q", "k", "v", "o", "gate", "up", "down")
ATTN_ROLES: tuple[str, ...] = ("q", "k", "v", "o")
MLP_ROLES: tuple[str, ...] = ("gate", "up", "down")
#: fused roles: ``qkv`` holds q, k and v; ``gate_up`` holds gate then up
FUSED_ROLES: tuple[str, ...] = ("qkv", "gate_up")
ALL_ROLES: tuple[str, ...] = ("q", "k", "v", "qkv", "o", "gate", "up", "gate_up", "down")

#: child names that play each role, as transformers' models spell them
ROLE_NAMES: dict[str, tuple[str, ...]] = {
    "q": ("q_proj", "query", "wq"),
    "k": ("k_proj", "key", "wk"),
    "v": ("v_proj", "value", "wv"),
    "qkv": ("qkv_proj", "query_key_value", "Wqkv", "W_pack", "c_attn"),
    "o": ("o_proj", "dense", "out_proj", "wo", "c_proj"),
    "gate": ("gate_proj", "w1"),
    "up": ("up_proj", "w3", "fc1", "fc_in", "dense_h_to_4h", "c_fc"),
    "gate_up": ("gate_up_proj",),
    "down": ("down_proj", "w2", "fc2", "fc_out", "dense_4h_to_h", "c_proj"),
}
#: where a family really differs from what discovery assumes (keyed by ``config.model_type``)
EXCEPTIONS: dict[str, dict[str, Any]] = {
    "gpt_neox": {"qkv_layout": "interleaved"},  # query_key_value holds [q_h, k_h, v_h] per head
}
ATTN_NAMES = ("self_attn", "attention", "attn", "self_attention")
MLP_NAMES = ("mlp", "feed_forward", "ffn", "block_sparse_moe")
_NO_ROTARY = "<no rotary embedding>"


def out_features(mod: nn.Module) -> int:
    """Output width of an ``nn.Linear`` or ``FactorizedLinear``."""
    return int(mod.out_features)


def in_features(mod: nn.Module) -> int:
    """Input width of an ``nn.Linear`` or ``FactorizedLinear``."""
    return int(mod.in_features)


def _is_linear(mod: nn.Module) -> bool:
    return isinstance(mod, nn.Linear | FactorizedLinear | LatentProjection)


def is_norm(mod: nn.Module) -> bool:
    """A normalization module (RMSNorm or LayerNorm of any family)."""
    return isinstance(mod, nn.LayerNorm) or type(mod).__name__.endswith("Norm")


def is_rms_norm(mod: nn.Module) -> bool:
    """An RMSNorm (no mean subtraction, no bias): exactly paddable with zeros."""
    return is_norm(mod) and not isinstance(mod, nn.LayerNorm) and getattr(mod, "bias", None) is None


def _fqn_of(model: nn.Module, target: nn.Module | None) -> str | None:
    if target is None:
        return None
    for name, mod in model.named_modules():
        if mod is target:
            return name
    return None


@dataclass
class FamilyAdapter:
    """The layout of one decoder-only causal LM, discovered from its modules.

    Attributes:
        model: the ``*ForCausalLM`` module.
    """

    model: nn.Module
    family: str = "?"
    layers_fqn: str = "model.layers"
    embed_fqn: str = "model.embed_tokens"
    final_norm_fqn: str = "model.norm"
    rotary_fqn: str = "model.rotary_emb"
    lm_head_fqn: str = "lm_head"
    attn_name: str = "self_attn"
    mlp_name: str = "mlp"
    #: role -> path of the projection inside a layer (e.g. ``self_attn.q_proj``)
    _attr: dict[str, str] = field(default_factory=dict)
    #: how a fused qkv is laid out: ``blocked`` ([q | k | v], Phi-3) or ``interleaved`` (per head)
    qkv_layout: str = "blocked"

    @property
    def config(self):
        return self.model.config

    @property
    def layers(self) -> list[nn.Module]:
        """The decoder layers, in order."""
        return list(self.model.get_submodule(self.layers_fqn))

    @property
    def num_layers(self) -> int:
        return len(self.model.get_submodule(self.layers_fqn))

    def layer_fqn(self, i: int) -> str:
        return f"{self.layers_fqn}.{i}"

    def attention_fqn(self, i: int) -> str:
        return f"{self.layer_fqn(i)}.{self.attn_name}"

    def mlp_fqn(self, i: int) -> str:
        return f"{self.layer_fqn(i)}.{self.mlp_name}"

    @property
    def roles(self) -> tuple[str, ...]:
        """The roles present in this layout, in forward order."""
        return tuple(r for r in ALL_ROLES if r in self._attr)

    @property
    def fused_qkv(self) -> bool:
        return "qkv" in self._attr

    @property
    def fused_gate_up(self) -> bool:
        return "gate_up" in self._attr

    @property
    def gated(self) -> bool:
        """True when the MLP multiplies an activated gate by an up projection."""
        return "gate" in self._attr or "gate_up" in self._attr

    def projection(self, i: int, role: str) -> str:
        """Fully qualified name of projection ``role`` of layer ``i``."""
        if role not in self._attr:
            raise GacError(
                f"this {self.family} layout has no {role!r} projection; its roles: {', '.join(self.roles)}"
            )
        return f"{self.layer_fqn(i)}.{self._attr[role]}"

    def projections(self, i: int) -> dict[str, str]:
        """``role -> fqn`` for every projection of layer ``i``."""
        return {r: self.projection(i, r) for r in self.roles}

    def all_projections(self) -> list[tuple[int, str, str]]:
        """``(layer, role, fqn)`` for every projection of the model."""
        return [(i, r, f) for i in range(self.num_layers) for r, f in self.projections(i).items()]

    def layer_norm_fqns(self, i: int) -> list[str]:
        """Norms over the hidden size in layer ``i`` (input, post-attention, post-feed-forward...)."""
        layer = self.model.get_submodule(self.layer_fqn(i))
        out = []
        for name, mod in layer.named_modules():
            if not name or name.split(".")[0] in (self.attn_name, self.mlp_name) or not is_norm(mod):
                continue
            out.append(f"{self.layer_fqn(i)}.{name}")
        return out

    def hidden_norm_fqns(self) -> list[str]:
        """Every norm over the hidden size (all layers, then the final norm)."""
        out = [f for i in range(self.num_layers) for f in self.layer_norm_fqns(i)]
        return [*out, self.final_norm_fqn] if self.final_norm_fqn else out

    def qk_norm_fqns(self, i: int) -> list[str]:
        """Norms on q and k inside the attention of layer ``i`` (per head or full width; may be empty)."""
        attn = self.model.get_submodule(self.attention_fqn(i))
        return [f"{self.attention_fqn(i)}.{n}" for n, m in attn.named_modules() if n and is_norm(m)]

    @property
    def has_qk_norm(self) -> bool:
        return self.num_layers > 0 and bool(self.qk_norm_fqns(0))

    @property
    def has_qkv_bias(self) -> bool:
        if self.num_layers == 0:
            return False
        role = "qkv" if self.fused_qkv else "q"
        return getattr(self._mod(self.projection(0, role)), "bias", None) is not None

    # ------------------------------------------------------------------ dims
    def _mod(self, fqn: str) -> nn.Module:
        return self.model.get_submodule(fqn)

    @property
    def hidden(self) -> int:
        """Width of the residual stream (the embedding dim)."""
        return int(self._mod(self.embed_fqn).weight.shape[1])

    @property
    def vocab(self) -> int:
        return int(self._mod(self.embed_fqn).weight.shape[0])

    @property
    def heads(self) -> int:
        return int(self.config.num_attention_heads)

    @property
    def kv_heads(self) -> int:
        return int(getattr(self.config, "num_key_value_heads", None) or self.heads)

    @property
    def head_dim(self) -> int:
        """Per-head width (read from the attention module, which is what the kernels see)."""
        if self.num_layers == 0:
            return int(getattr(self.config, "head_dim", None) or self.hidden // self.heads)
        attn = self._mod(self.attention_fqn(0))
        hd = getattr(attn, "head_dim", None) or getattr(attn, "head_size", None)
        if hd:
            return int(hd)
        if self.fused_qkv:
            return out_features(self._mod(self.projection(0, "qkv"))) // (self.heads + 2 * self.kv_heads)
        return out_features(self._mod(self.projection(0, "q"))) // self.heads

    def intermediate(self, i: int) -> int:
        """MLP width of layer ``i`` (may differ per layer after pruning)."""
        if self.fused_gate_up:
            return out_features(self._mod(self.projection(i, "gate_up"))) // 2
        return out_features(self._mod(self.projection(i, "gate" if "gate" in self._attr else "up")))

    @property
    def tied_embeddings(self) -> bool:
        """True when ``lm_head`` shares its weight with the embedding."""
        head = self._mod(self.lm_head_fqn)
        emb = self._mod(self.embed_fqn)
        return getattr(head, "weight", None) is emb.weight

    @property
    def parallel_residual(self) -> bool:
        """True when attention and MLP read the same input (GPT-NeoX, Phi-1/2)."""
        return bool(getattr(self.config, "use_parallel_residual", False))

    def summary(self) -> dict[str, object]:
        """The headline dims, JSON-ready."""
        return {
            "family": self.family,
            "layers": self.num_layers,
            "hidden": self.hidden,
            "heads": self.heads,
            "kv_heads": self.kv_heads,
            "head_dim": self.head_dim,
            "intermediate": [self.intermediate(i) for i in range(self.num_layers)],
            "vocab": self.vocab,
            "tied_embeddings": self.tied_embeddings,
            "roles": list(self.roles),
        }


#: model types whose whole pipeline (analyze, exact repair, compression, save/load) the test suite
#: runs on tiny models; any other decoder-only model is discovered the same way
SUPPORTED: tuple[str, ...] = ("llama", "mistral", "qwen2", "qwen3", "phi3", "olmo2", "gpt_neox", "granite")


def find_layers(model: nn.Module) -> str:
    """The decoder layers: the longest outermost ``nn.ModuleList`` of identical blocks holding linear
    projections. A list of bare projections (PaLU's per-group up-projections) is not a list of blocks,
    and a list nested in another candidate's block is not the model's layers, however long."""
    cands: list[tuple[int, str]] = []
    no_linear: tuple[int, str, set[str]] | None = None
    for name, mod in model.named_modules():
        if isinstance(mod, nn.ModuleList) and len({type(m) for m in mod}) <= 1:
            n = len(mod)
            if n and _is_linear(mod[0]):
                continue
            if n and not any(_is_linear(m) for m in mod[0].modules()):
                if no_linear is None or n > no_linear[0]:
                    kinds = {type(m).__name__ for m in mod[0].modules() if not list(m.children())}
                    no_linear = (n, name, kinds)
                continue
            if n == 0 and not name.endswith(("layers", ".h", "blocks")):
                continue
            cands.append((n, name))
    outer = [c for c in cands if not any(c[1].startswith(o[1] + ".") for o in cands if o is not c)]
    best = max(outer, key=lambda c: c[0]) if outer else None
    if best is None and no_linear is not None:
        n, name, kinds = no_linear
        raise GacError(
            f"{type(model).__name__}: the blocks of {name} hold no nn.Linear projections "
            f"(they hold {', '.join(sorted(kinds))}); gac finds projections as nn.Linear"
        )
    if best is None:
        raise GacError(
            f"{type(model).__name__}: no decoder layers found (no ModuleList of identical blocks holding "
            f"linear projections)"
        )
    return best[1]


def find_child(layer: nn.Module, names: tuple[str, ...], word: str) -> str | None:
    kids = dict(layer.named_children())
    for n in names:
        if n in kids:
            return n
    for n, m in kids.items():
        if word in type(m).__name__.lower():
            return n
    return None


def _roles_in(parent: nn.Module, roles: tuple[str, ...]) -> dict[str, str]:
    kids = {n: m for n, m in parent.named_children() if _is_linear(m)}
    out: dict[str, str] = {}
    for r in roles:
        for n in ROLE_NAMES[r]:
            if n in kids and n not in out.values():
                out[r] = n
                break
    return out


def _describe(parent: nn.Module) -> str:
    kids = [f"{n} ({type(m).__name__})" for n, m in parent.named_children()]
    return ", ".join(kids) or "nothing"


def get_adapter(model: nn.Module) -> FamilyAdapter:
    """The structural adapter for ``model`` (any ``transformers`` decoder-only ``*ForCausalLM``).

    Raises:
        GacError: one line naming the part of the structure that was not found.
    """
    cfg = getattr(model, "config", None)
    mt = getattr(cfg, "model_type", None) or type(model).__name__
    arch = type(model).__name__
    if cfg is None or getattr(cfg, "num_attention_heads", None) is None:
        raise GacError(f"{arch}: no config with num_attention_heads (not a transformers decoder-only LM)")
    get_in = getattr(model, "get_input_embeddings", None)
    get_out = getattr(model, "get_output_embeddings", None)
    embed = _fqn_of(model, get_in() if get_in else None)
    head = _fqn_of(model, get_out() if get_out else None)
    if embed is None:
        raise GacError(f"{arch}: no input embedding found (get_input_embeddings)")
    if head is None:
        raise GacError(
            f"{arch} ({mt}) has no language-model head (get_output_embeddings): load it with AutoModelForCausalLM"
        )
    layers_fqn = find_layers(model)
    layers = model.get_submodule(layers_fqn)
    ad = FamilyAdapter(
        model,
        family=str(mt),
        layers_fqn=layers_fqn,
        embed_fqn=embed,
        lm_head_fqn=head,
        **EXCEPTIONS.get(mt, {}),
    )
    inside = layers_fqn + "."
    norms = [n for n, m in model.named_modules() if is_norm(m) and not n.startswith(inside)]
    ad.final_norm_fqn = norms[-1] if norms else ""
    rot = [n for n, m in model.named_modules() if hasattr(m, "inv_freq") and not n.startswith(inside)]
    ad.rotary_fqn = rot[0] if rot else _NO_ROTARY
    if len(layers) == 0:
        ad._attr = {r: f"{ad.attn_name if r in ATTN_ROLES else ad.mlp_name}.{r}_proj" for r in ROLES}
        return ad
    layer0 = layers[0]
    attn = find_child(layer0, ATTN_NAMES, "attention")
    if attn is None:
        raise GacError(f"{arch}: no attention found in {layers_fqn}.0 (it holds {_describe(layer0)})")
    mlp = find_child(layer0, MLP_NAMES, "mlp")
    if mlp is None:
        raise GacError(f"{arch}: no MLP found in {layers_fqn}.0 (it holds {_describe(layer0)})")
    ad.attn_name, ad.mlp_name = attn, mlp
    a = _roles_in(getattr(layer0, attn), ("q", "k", "v", "qkv", "o"))
    if not ({"q", "k", "v"} <= a.keys() or "qkv" in a) or "o" not in a:
        raise GacError(
            f"{arch}: attention projections not found in {layers_fqn}.0.{attn} (need q/k/v or a fused qkv, and o "
            f"as nn.Linear; it holds {_describe(getattr(layer0, attn))})"
        )
    if "qkv" in a:
        a = {r: n for r, n in a.items() if r in ("qkv", "o")}
    m = _roles_in(getattr(layer0, mlp), ("gate", "up", "gate_up", "down"))
    if "down" not in m or not ("up" in m or "gate_up" in m):
        raise GacError(
            f"{arch}: MLP projections not found in {layers_fqn}.0.{mlp} (need gate/up/down, a fused gate_up, "
            f"or fc1/fc2 as nn.Linear; it holds {_describe(getattr(layer0, mlp))})"
        )
    if "gate_up" in m:
        m = {r: n for r, n in m.items() if r in ("gate_up", "down")}
    ad._attr = {**{r: f"{attn}.{n}" for r, n in a.items()}, **{r: f"{mlp}.{n}" for r, n in m.items()}}
    for i in range(1, len(layers)):
        for r, f in ad.projections(i).items():
            try:
                model.get_submodule(f)
            except AttributeError:
                raise GacError(f"{arch}: layer {i} lacks the {r} projection that layer 0 has ({f})") from None
    return ad


def model_rotary(model: nn.Module) -> nn.Module | None:
    """The model's rotary embedding module (found by the family adapter), or None."""
    try:
        return model.get_submodule(get_adapter(model).rotary_fqn)
    except (AttributeError, GacError):
        pass
    found = [m for _, m in model.named_modules() if hasattr(m, "inv_freq")]
    return found[0] if found else None
