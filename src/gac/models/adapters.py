"""Per-family adapters: where the dims of a decoder-only LM live, in one place.

Every part of gac that needs to find a projection, a norm or a head count asks the model's
:class:`FamilyAdapter` (``get_adapter(model)``) instead of guessing module names.  Dims are read
from the modules themselves (not only the config), so they stay right after pruning or
factorization: ``intermediate(i)`` may differ per layer, and a projection may be an
``nn.Linear`` or a :class:`gac.surgery.factorized.FactorizedLinear`.

Example::

    ad = get_adapter(model)
    for i in range(ad.num_layers):
        for role, fqn in ad.projections(i).items():   # role in ROLES
            mod = model.get_submodule(fqn)
            print(i, role, in_features(mod), out_features(mod))

Supported families (``SUPPORTED``): Llama, Mistral, Qwen2 (biases on q/k/v), Qwen3 (RMSNorm on
q and k over head_dim); grouped-query attention in all of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from torch import nn

from gac.errors import GacError

#: projection roles of one decoder layer, in forward order
ROLES: tuple[str, ...] = ("q", "k", "v", "o", "gate", "up", "down")
ATTN_ROLES: tuple[str, ...] = ("q", "k", "v", "o")
MLP_ROLES: tuple[str, ...] = ("gate", "up", "down")


def out_features(mod: nn.Module) -> int:
    """Output width of an ``nn.Linear`` or ``FactorizedLinear``."""
    return int(mod.out_features)


def in_features(mod: nn.Module) -> int:
    """Input width of an ``nn.Linear`` or ``FactorizedLinear``."""
    return int(mod.in_features)


@dataclass
class FamilyAdapter:
    """The layout of one model of a supported family.

    Attributes:
        model: the ``*ForCausalLM`` module.
    """

    model: nn.Module

    family: ClassVar[str] = "?"
    model_types: ClassVar[tuple[str, ...]] = ()
    #: attribute names of the projections inside ``self_attn`` / ``mlp``
    _attr: ClassVar[dict[str, str]] = {
        "q": "self_attn.q_proj",
        "k": "self_attn.k_proj",
        "v": "self_attn.v_proj",
        "o": "self_attn.o_proj",
        "gate": "mlp.gate_proj",
        "up": "mlp.up_proj",
        "down": "mlp.down_proj",
    }
    #: True when q and k pass through an RMSNorm over head_dim (Qwen3)
    has_qk_norm: ClassVar[bool] = False
    #: True when q/k/v carry biases by design (Qwen2)
    has_qkv_bias: ClassVar[bool] = False

    # ---------------------------------------------------------------- layout
    layers_fqn: ClassVar[str] = "model.layers"
    embed_fqn: ClassVar[str] = "model.embed_tokens"
    final_norm_fqn: ClassVar[str] = "model.norm"
    rotary_fqn: ClassVar[str] = "model.rotary_emb"
    lm_head_fqn: ClassVar[str] = "lm_head"

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
        return f"{self.layer_fqn(i)}.self_attn"

    def mlp_fqn(self, i: int) -> str:
        return f"{self.layer_fqn(i)}.mlp"

    def projection(self, i: int, role: str) -> str:
        """Fully qualified name of projection ``role`` (one of :data:`ROLES`) of layer ``i``."""
        if role not in self._attr:
            raise GacError(f"unknown projection role {role!r}; roles: {', '.join(ROLES)}")
        return f"{self.layer_fqn(i)}.{self._attr[role]}"

    def projections(self, i: int) -> dict[str, str]:
        """``role -> fqn`` for every projection of layer ``i``."""
        return {r: self.projection(i, r) for r in ROLES}

    def all_projections(self) -> list[tuple[int, str, str]]:
        """``(layer, role, fqn)`` for every projection of the model."""
        return [(i, r, f) for i in range(self.num_layers) for r, f in self.projections(i).items()]

    def layer_norm_fqns(self, i: int) -> list[str]:
        """RMSNorms over the hidden size in layer ``i`` (input and post-attention)."""
        return [f"{self.layer_fqn(i)}.input_layernorm", f"{self.layer_fqn(i)}.post_attention_layernorm"]

    def hidden_norm_fqns(self) -> list[str]:
        """Every RMSNorm over the hidden size (all layers, then the final norm)."""
        out = [f for i in range(self.num_layers) for f in self.layer_norm_fqns(i)]
        return [*out, self.final_norm_fqn]

    def qk_norm_fqns(self, i: int) -> list[str]:
        """RMSNorms over head_dim on q and k in layer ``i`` (empty unless the family has them)."""
        if not self.has_qk_norm:
            return []
        a = self.attention_fqn(i)
        return [f"{a}.q_norm", f"{a}.k_norm"]

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
        return int(
            getattr(attn, "head_dim", None) or out_features(self._mod(self.projection(0, "q"))) // self.heads
        )

    def intermediate(self, i: int) -> int:
        """MLP width of layer ``i`` (may differ per layer after pruning)."""
        return out_features(self._mod(self.projection(i, "gate")))

    @property
    def tied_embeddings(self) -> bool:
        """True when ``lm_head`` shares its weight with the embedding."""
        head = self._mod(self.lm_head_fqn)
        emb = self._mod(self.embed_fqn)
        return getattr(head, "weight", None) is emb.weight

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
        }


class LlamaAdapter(FamilyAdapter):
    family = "llama"
    model_types = ("llama",)


class MistralAdapter(FamilyAdapter):
    family = "mistral"
    model_types = ("mistral",)


class Qwen2Adapter(FamilyAdapter):
    family = "qwen2"
    model_types = ("qwen2",)
    has_qkv_bias = True


class Qwen3Adapter(FamilyAdapter):
    family = "qwen3"
    model_types = ("qwen3",)
    has_qk_norm = True


_ADAPTERS: tuple[type[FamilyAdapter], ...] = (LlamaAdapter, MistralAdapter, Qwen2Adapter, Qwen3Adapter)
#: family names gac supports, for messages and docs
SUPPORTED: tuple[str, ...] = tuple(a.family for a in _ADAPTERS)


def get_adapter(model: nn.Module) -> FamilyAdapter:
    """The adapter for ``model`` (a ``*ForCausalLM`` of a supported family).

    Raises:
        GacError: the architecture is not one of :data:`SUPPORTED`.
    """
    cfg = getattr(model, "config", None)
    mt = getattr(cfg, "model_type", None)
    for cls in _ADAPTERS:
        if mt in cls.model_types:
            ad = cls(model)
            try:
                model.get_submodule(ad.layers_fqn)
                model.get_submodule(ad.embed_fqn)
            except AttributeError:
                raise GacError(
                    f"{type(model).__name__} is a {mt} model without a causal-LM head layout "
                    f"({ad.layers_fqn}); load it with AutoModelForCausalLM"
                ) from None
            return ad
    arch = ", ".join(getattr(cfg, "architectures", None) or []) or type(model).__name__
    raise GacError(
        f"unsupported architecture {arch} (model_type {mt!r}); gac supports the families: "
        f"{', '.join(SUPPORTED)}"
    )
