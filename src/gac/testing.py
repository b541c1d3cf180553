"""Tiny models built in code, with deliberately misaligned dims, for tests and examples."""

from __future__ import annotations

import torch
from transformers import (
    AutoModelForCausalLM,
    LlamaConfig,
    MistralConfig,
    PretrainedConfig,
    Qwen2Config,
    Qwen3Config,
)

FAMILIES = ("llama", "mistral", "qwen2", "qwen3")


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
    raise ValueError(f"unknown family {family!r}; known: {FAMILIES}")


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


def char_tokenizer():
    """A character-level fast tokenizer (printable ASCII, 98 ids) that fits the tiny models' vocab."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for c in range(32, 127):
        vocab[chr(c)] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>", pad_token="</s>"
    )
