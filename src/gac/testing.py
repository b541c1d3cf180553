"""Tiny models built in code, with deliberately misaligned dims, for tests and examples."""

from __future__ import annotations

import torch
from transformers import (
    AutoModelForCausalLM,
    GPTNeoXConfig,
    GraniteConfig,
    LlamaConfig,
    MistralConfig,
    Olmo2Config,
    Phi3Config,
    PretrainedConfig,
    Qwen2Config,
    Qwen3Config,
)

from gac.alignment import vector_align
from gac.nn import FactorizedLinear, replace_module

FAMILIES = ("llama", "mistral", "qwen2", "qwen3")
#: families with other layouts, found by structural discovery (:mod:`gac.models.adapters`)
OTHER_FAMILIES = ("phi3", "olmo2", "gpt_neox", "granite")


def tiny_config(
    family: str = "llama",
    hidden: int = 120,
    intermediate: int = 200,
    heads: int = 5,
    kv_heads: int = 1,
    head_dim: int | None = None,
    layers: int = 2,
    vocab: int = 250,
) -> PretrainedConfig:
    """A small config whose dims are misaligned on purpose (hidden 120, intermediate 200, 5 heads of 24)."""
    common = dict(
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        num_hidden_layers=layers,
        vocab_size=vocab,
        max_position_embeddings=512,
        tie_word_embeddings=False,
    )
    if head_dim is not None:
        common["head_dim"] = head_dim
    if family == "llama":
        return LlamaConfig(**common)
    if family == "mistral":
        return MistralConfig(**common, sliding_window=None)
    if family == "qwen2":
        return Qwen2Config(**common)  # q/k/v carry biases
    if family == "qwen3":
        return Qwen3Config(**common)  # q/k RMSNorm over head_dim
    if family == "phi3":
        return Phi3Config(**common, pad_token_id=0)  # fused qkv_proj and gate_up_proj
    if family == "olmo2":
        return Olmo2Config(**common, pad_token_id=0)  # post-norms only; q/k RMSNorm over all heads
    if family == "granite":  # Llama layout with multipliers (attention scale is not 1/sqrt(d))
        return GraniteConfig(
            **common,
            attention_multiplier=0.09,
            embedding_multiplier=2.0,
            residual_multiplier=0.5,
            logits_scaling=4.0,
        )
    if family == "gpt_neox":  # query_key_value per head, LayerNorm, parallel residual, 25% rotary
        common.pop("num_key_value_heads")
        return GPTNeoXConfig(**common, bos_token_id=0, eos_token_id=0)
    raise ValueError(f"unknown family {family!r}; known: {FAMILIES + OTHER_FAMILIES}")


def tiny_model(
    family: str = "llama", seed: int = 0, dtype: torch.dtype = torch.float32, **kw
) -> torch.nn.Module:
    """A randomly initialised tiny causal LM of ``family`` (eval mode, float32 by default).

    Weights are drawn with a larger std than the HF default so that logits are not flat.
    """
    torch.manual_seed(seed)
    cfg = tiny_config(family, **kw)
    cfg.initializer_range = 0.1
    model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.05)
            elif "norm" in name:
                p.uniform_(0.8, 1.2)
    return model.eval()


def char_tokenizer(bos: bool = False):
    """A character-level fast tokenizer (printable ASCII, 98 ids) that fits the tiny models' vocab.

    Args:
        bos: prepend ``<s>`` (id 1) to every encoded text by default, as Llama/Gemma tokenizers do
            (a post-processor; ``add_special_tokens=False`` leaves it out).
    """
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for c in range(32, 127):
        vocab[chr(c)] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    if bos:
        tok.post_processor = processors.TemplateProcessing(
            single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)]
        )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>", pad_token="</s>"
    )


def factorize_at_odd_ranks(
    model: torch.nn.Module, ranks: tuple[int, ...] = (7, 37, 13, 29), keep: tuple[str, ...] = ("v_proj",)
) -> torch.nn.Module:
    """Factorize every decoder-layer projection of ``model`` in place at random factors of odd rank.

    Projection ``i`` (in module order) gets rank ``ranks[i % len(ranks)]``; those whose name ends with
    one of ``keep`` stay dense (a dense member in a fused group).  Factors are drawn on the model's
    device and dtype, scaled to keep activations of order one.  For tests and diagnostics of
    misaligned slices and kernels.
    """
    names = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and "layers" in n]
    for i, n in enumerate(names):
        lin = model.get_submodule(n)
        if n.endswith(keep):
            continue
        r = ranks[i % len(ranks)]
        dev, dt = lin.weight.device, lin.weight.dtype
        u = torch.randn(lin.out_features, r, device=dev) * r**-0.5
        v = torch.randn(r, lin.in_features, device=dev) * lin.in_features**-0.5
        replace_module(model, n, FactorizedLinear.from_factors(u.to(dt), v.to(dt), lin.bias))
    return model


def assert_compiled_grads_match(
    module: torch.nn.Module, x: torch.Tensor, want: torch.Tensor, undo, atol: float = 1e-5
) -> None:
    """``torch.compile(fullgraph=True)`` of ``module`` with autograd on, against the eager module.

    The compiled output must equal ``want``; its gradients (of the input and of every parameter
    that gets one) must equal those of the eager ``module`` after ``undo(module)`` has put its
    original path back.  For kernels registered as custom ops: Inductor traces a module whose
    parameters require grad through the op's autograd formula.
    """
    with torch.enable_grad():
        f = torch.compile(module, fullgraph=True)
        xg = x.clone().requires_grad_(True)
        out = f(xg)
        assert torch.allclose(out, want, atol=atol)
        out.sum().backward()
        grads = {n: p.grad.clone() for n, p in module.named_parameters() if p.grad is not None}
        gx = xg.grad.clone()
        module.zero_grad()
        with torch.no_grad():
            undo(module)
        xr = x.clone().requires_grad_(True)
        module(xr).sum().backward()
        assert grads and torch.allclose(gx, xr.grad, atol=atol)
        params = dict(module.named_parameters())
        assert all(torch.allclose(g, params[n].grad, atol=atol) for n, g in grads.items())


def latent_decode_inputs(
    batch: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    tokens: int,
    key_group: int,
    value_group: int,
    key_ranks: list[int],
    value_ranks: list[int],
    bias: bool = False,
    norm: bool = False,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    theta: float = 10000.0,
    seed: int = 0,
    rope: bool = True,
    raw: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict, torch.Tensor]:
    """Random inputs of :func:`gac.kernels.latent_attention.latent_decode_attention`.

    One key rank per key group (``kv_heads // key_group`` of them) and one value rank per value
    group; each KV head's up-projection is zero past its group's rank, as the module packs it; with
    ``rope`` the pack carries the rotary table (:func:`gac.nn.latent.rope_table`), as the
    module's does. With ``raw`` the key groups are cached raw, as the module packs a layer whose key groups
    are all kept at full width (``key_ranks`` must each be ``key_group · head_dim``): ``koff`` is each KV
    head's own column, ``k_raw`` set, ``uk`` unused. Returns ``(q, zk, zv, pack, inv_freq)``.
    """
    g = torch.Generator().manual_seed(seed)
    nk, nv = kv_heads // key_group, kv_heads // value_group
    if len(key_ranks) != nk or len(value_ranks) != nv:
        raise ValueError(f"{nk} key ranks and {nv} value ranks expected")
    if raw and any(r != key_group * head_dim for r in key_ranks):
        raise ValueError(f"raw keys: every key rank must be {key_group * head_dim}")
    ko = [sum(key_ranks[:i]) for i in range(nk)]
    vo = [sum(value_ranks[:i]) for i in range(nv)]
    rk_max = 32 if raw else -(-max(key_ranks) // 32) * 32
    uk = torch.zeros(kv_heads, head_dim, rk_max)
    for k in range(kv_heads):
        r = key_ranks[k // key_group]
        if not raw:
            uk[k, :, :r] = torch.randn(head_dim, r, generator=g) / r**0.5
    if raw:  # each KV head's keys at their own column of the group's latents
        koff = [ko[k // key_group] + (k % key_group) * head_dim for k in range(kv_heads)]
        kr = [head_dim] * kv_heads
    else:
        koff = [ko[k // key_group] for k in range(kv_heads)]
        kr = [key_ranks[k // key_group] for k in range(kv_heads)]
    pack = {
        "uk": uk.to(device, dtype),
        "koff": torch.tensor(koff, dtype=torch.int32, device=device),
        "kr": torch.tensor(kr, dtype=torch.int32, device=device),
        "rk_max": rk_max,
        "kv_heads": kv_heads,
        "k_raw": raw,
        "align": vector_align(*koff, *kr),
        "v_offsets": vo,
        "v_ranks": list(value_ranks),
        "k_group": key_group,
        "k_bias": torch.randn(kv_heads, head_dim, generator=g).to(device, dtype) if bias else None,
        "k_norm": (torch.rand(head_dim, generator=g) + 0.5).to(device, dtype) if norm else None,
        "k_norm_eps": 1e-6,
    }
    q = torch.randn(batch, heads, head_dim, generator=g).to(device, dtype)
    zk = torch.randn(batch, tokens, sum(key_ranks), generator=g).to(device, dtype)
    zv = torch.randn(batch, tokens, sum(value_ranks), generator=g).to(device, dtype)
    inv = (1.0 / (theta ** (torch.arange(0, head_dim, 2).float() / head_dim))).to(device)
    if rope:
        from gac.nn.latent import rope_table

        pack["rope"] = rope_table(inv)
    return q, zk, zv, pack, inv
