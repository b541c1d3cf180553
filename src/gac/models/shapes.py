"""Real model *shapes* with random weights: ``shape:NAME[:LAYERS[:SCALE]]``.

Speed depends on a model's dims, not on its weights, and real weights do not travel to every GPU
machine, so speed experiments (``gac run`` plans, benchmarks) build a model from the published
configuration of a real checkpoint with random weights:

* ``NAME``: a key of :data:`SHAPES` (``llama3-8b``, ``mistral-7b``, ``qwen2.5-7b``);
* ``LAYERS``: keep only this many decoder layers (default: all) — per-layer shapes are the model's;
* ``SCALE``: divide every width (hidden, MLP, heads, vocab) by this (default 1; CPU smoke tests).

The tokenizer is :func:`gac.testing.char_tokenizer` (printable ASCII): calibration text is real
English, encoded character by character, since the real tokenizer does not travel either.
Quality numbers from such a model mean nothing and are never reported; allocations computed on it
are labelled as coming from random weights.
"""

from __future__ import annotations

import re
from typing import Any

from gac.errors import GacError

#: name -> (transformers model_type, config fields of the published checkpoint)
SHAPES: dict[str, tuple[str, dict[str, Any]]] = {
    "llama3-8b": (  # meta-llama/Meta-Llama-3-8B config.json
        "llama",
        dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
             num_key_value_heads=8, vocab_size=128256, max_position_embeddings=8192,
             rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=False),
    ),
    "mistral-7b": (  # mistralai/Mistral-7B-v0.1 config.json
        "mistral",
        dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
             num_key_value_heads=8, vocab_size=32000, max_position_embeddings=32768,
             rope_theta=10000.0, rms_norm_eps=1e-5, sliding_window=None, tie_word_embeddings=False),
    ),
    "qwen2.5-7b": (  # Qwen/Qwen2.5-7B config.json
        "qwen2",
        dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
             num_key_value_heads=4, vocab_size=152064, max_position_embeddings=32768,
             rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=False),
    ),
}  # fmt: skip

SHAPE_SPEC = re.compile(r"^shape:([a-z0-9.-]+)(?::(\d+))?(?::(\d+))?$")
_WIDTHS = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "vocab_size")


def parse_shape_spec(spec: str) -> tuple[str, int | None, int] | None:
    """``(name, layers, scale)`` for a ``shape:`` spec, None for any other spec; bad ones raise."""
    if not spec.startswith("shape:"):
        return None
    m = SHAPE_SPEC.match(spec)
    if not m or m.group(1) not in SHAPES:
        raise GacError(
            f"unknown model shape {spec!r}: use shape:NAME[:LAYERS[:SCALE]] with NAME one of "
            f"{', '.join(SHAPES)}"
        )
    name, layers, scale = m.group(1), m.group(2), m.group(3)
    full = SHAPES[name][1]["num_hidden_layers"]
    n = None if layers is None else int(layers)
    if n is not None and not 1 <= n <= full:
        raise GacError(f"{spec}: LAYERS must be in [1, {full}], got {n}")
    s = 1 if scale is None else int(scale)
    if s < 1 or any(SHAPES[name][1][k] % s for k in _WIDTHS[2:4]):
        raise GacError(f"{spec}: SCALE must be >= 1 and divide the head counts of {name}")
    return name, n, s


def shape_config(spec: str) -> Any:
    """The transformers config of a ``shape:`` spec."""
    from transformers import AutoConfig

    parsed = parse_shape_spec(spec)
    if parsed is None:
        raise GacError(f"{spec!r} is not a shape:NAME spec")
    name, layers, scale = parsed
    model_type, fields = SHAPES[name]
    kw = dict(fields)
    if layers is not None:
        kw["num_hidden_layers"] = layers
    for k in _WIDTHS:
        kw[k] = kw[k] // scale
    return AutoConfig.for_model(model_type, **kw)


def shape_model(spec: str, dtype: Any = None, device: Any = None, seed: int = 0) -> tuple[Any, Any]:
    """A random-weight model of ``spec``'s shape (on ``device``) and the character tokenizer.

    The weights are drawn from ``seed`` (the global RNG is left alone) by transformers' own
    initialisation, on the first GPU when one is present and the model fits in half its free
    memory (drawing 8B parameters on the CPU takes minutes), else on the CPU; then the model moves
    to ``device``. So within one machine every process and every placement sees the same weights
    (a model split over GPUs is compared with the same model on one GPU); ``config.gac_init_device``
    says where they were drawn.
    """
    import torch
    from transformers import AutoModelForCausalLM

    from gac.testing import char_tokenizer

    cfg = shape_config(spec)
    dt = dtype or torch.float32
    if str(device) == "meta":  # shapes only (latency models, profile refinement): no weights drawn
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(cfg, dtype=dt).eval()
        model.config.gac_shape, model.config.gac_init_device = spec, "meta"
        return model, char_tokenizer()
    init = "cpu"
    if torch.cuda.is_available():
        free, _ = torch.cuda.mem_get_info(0)
        with torch.device("meta"):
            n = sum(p.numel() for p in AutoModelForCausalLM.from_config(cfg).parameters())
        if n * torch.tensor([], dtype=dt).element_size() < free / 2:
            init = "cuda:0"
    with torch.random.fork_rng(devices=[0] if init != "cpu" else []):
        torch.manual_seed(seed)
        with torch.device(init):
            model = AutoModelForCausalLM.from_config(cfg, dtype=dt).eval()
    if device is not None:
        model.to(device)
    model.config.gac_shape = spec
    model.config.gac_init_device = init
    return model, char_tokenizer()
