"""Greedy generation on gac's fast path: a static KV cache, a compiled decode step, CUDA graphs.

:func:`generate` works for dense and gac models alike (factorized, pruned, PaLU's latent cache):

1. **prefill** runs the prompt through the model into a :class:`transformers.StaticCache` sized
   ``prompt + max_new_tokens`` (eager: one prompt, one shape); its wall time up to the first
   generated token is the *time to first token*;
2. **decode** runs one-token steps. On CUDA the step is ``torch.compile``'d and captured as a CUDA
   graph once (the cache advances its own position inside the graph, as in
   :class:`gac.eval.infer.DecodeStep`); that setup is timed separately as ``setup_s`` and never
   counted in the latency. On CPU the same static-cache loop runs eagerly, with a one-line notice.

The output equals ``model.generate(..., do_sample=False)`` token for token (tested on CPU).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn

from gac.errors import GacError
from gac.runtime.fastpath import FastPath


@dataclass
class Generation:
    """What :func:`generate` produced and how fast.

    Attributes:
        text: the decoded new tokens.
        prompt_tokens / new_tokens: token counts.
        ttft_s: prompt in, first new token out (prefill + its argmax).
        decode_s: the remaining ``new_tokens - 1`` steps.
        tokens_per_s: decode throughput, ``(new_tokens - 1) / decode_s``.
        setup_s: compile and CUDA-graph capture (outside every latency).
        compiled / graphs: which parts of the fast path ran.
        device: where it ran.
    """

    text: str
    token_ids: list[int]
    prompt_tokens: int
    new_tokens: int
    ttft_s: float
    decode_s: float
    tokens_per_s: float
    setup_s: float
    compiled: bool
    graphs: bool
    device: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


@torch.no_grad()
def generate(
    model: nn.Module,
    tokenizer: Any,
    prompt: str,
    max_new_tokens: int = 32,
    *,
    stop_at_eos: bool = True,
    fast: FastPath | None = None,
    **switches: Any,
) -> Generation:
    """Greedy-decode ``max_new_tokens`` after ``prompt`` on the fast path (see the module docstring).

    Args:
        model: a causal LM (dense or gac-compressed), on its device.
        tokenizer: its tokenizer.
        prompt: the text to continue.
        max_new_tokens: tokens to generate (fewer when ``stop_at_eos`` and EOS comes first).
        stop_at_eos: stop after the tokenizer's EOS token.
        fast: the fast-path switches (:class:`gac.runtime.FastPath`; default: the default path).
            generate reads those ``gac generate`` exposes: ``compile`` and ``graphs`` (default: on
            CUDA), ``gqa_decode`` (``gac_sdpa`` decode attention on the KV heads of a grouped-query
            model, exact; :mod:`gac.kernels.attention`), and on CUDA ``gemv``
            (:func:`gac.kernels.gemv.use_triton_gemv_`), ``fused_lowrank``
            (:func:`gac.kernels.lowrank_fused.use_fused_lowrank_`), ``branches``
            (:func:`gac.kernels.branches.use_branches_`), each in place where measured faster, and
            ``combo_kernels`` (:func:`gac.eval.infer.compile_step`).
        **switches: a switch by name (``gemv=False``), over ``fast``.

    Raises:
        GacError: an empty prompt, a non-positive token count, or no tokenizer.
    """
    from transformers import StaticCache

    from gac.utils import console

    fast = FastPath.of(fast, **switches)
    if tokenizer is None:
        raise GacError("generate needs the model's tokenizer")
    if max_new_tokens < 1:
        raise GacError(f"max_new_tokens must be positive, got {max_new_tokens}")
    dev = next(model.parameters()).device
    on_cuda = dev.type == "cuda"
    want_compile = on_cuda if fast.compile is None else fast.compile
    want_graphs = on_cuda if fast.graphs is None else fast.graphs
    if (want_compile or want_graphs) and not on_cuda:
        console.print(
            f"notice: torch.compile and CUDA graphs need CUDA; generating eagerly on {dev.type}",
            markup=False,
        )
        want_compile = want_graphs = False
    from gac.eval.infer import compile_step, use_decode_kernels_

    use_decode_kernels_(model, fast.gqa_decode, fast.gemv, fast.fused_lowrank, fast.branches)
    ids = tokenizer(prompt, return_tensors="pt")["input_ids"].to(dev)
    if ids.numel() == 0:
        raise GacError("the prompt is empty after tokenization")
    n_prompt = ids.shape[1]
    eos = getattr(tokenizer, "eos_token_id", None) if stop_at_eos else None
    was_training = model.training
    model.eval()
    cache = StaticCache(config=model.config, max_cache_len=n_prompt + max_new_tokens)
    try:
        _sync(dev)
        t0 = time.perf_counter()
        out = model(input_ids=ids, past_key_values=cache, use_cache=True)
        token = out.logits[:, -1].argmax(-1, keepdim=True)
        tokens = [int(token)]
        _sync(dev)
        ttft = time.perf_counter() - t0
        setup = 0.0
        step_ids = token.clone()  # the step's static input

        def eager() -> torch.Tensor:
            return model(input_ids=step_ids, past_key_values=cache, use_cache=True).logits

        step = eager
        remaining = max_new_tokens - 1
        if remaining > 0 and (eos is None or tokens[-1] != eos) and (want_compile or want_graphs):
            t1 = time.perf_counter()
            forward = (
                compile_step(model.forward, combo_kernels=fast.combo_kernels)
                if want_compile
                else model.forward
            )

            def compiled() -> torch.Tensor:
                return forward(input_ids=step_ids, past_key_values=cache, use_cache=True).logits

            step = compiled
            if want_graphs:
                pos = _positions(cache)
                # warm-up (compiles) on a side stream, then capture; the cache is rewound after each
                s = torch.cuda.Stream(dev)
                s.wait_stream(torch.cuda.current_stream(dev))
                with torch.cuda.stream(s):
                    for _ in range(2):
                        compiled()
                        _rewind(cache, pos)
                torch.cuda.current_stream(dev).wait_stream(s)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    static_out = compiled()
                _rewind(cache, pos)

                def replay() -> torch.Tensor:
                    graph.replay()
                    return static_out

                step = replay
            _sync(dev)
            setup = time.perf_counter() - t1
        _sync(dev)
        t2 = time.perf_counter()
        for _ in range(remaining):
            if eos is not None and tokens[-1] == eos:
                break
            step_ids.copy_(token)
            logits = step()
            token = logits[:, -1].argmax(-1, keepdim=True)
            tokens.append(int(token))
        _sync(dev)
        decode_s = time.perf_counter() - t2
    finally:
        model.train(was_training)
    n_dec = len(tokens) - 1
    return Generation(
        text=tokenizer.decode(tokens, skip_special_tokens=True),
        token_ids=tokens,
        prompt_tokens=n_prompt,
        new_tokens=len(tokens),
        ttft_s=ttft,
        decode_s=decode_s,
        tokens_per_s=n_dec / decode_s if n_dec and decode_s > 0 else 0.0,
        setup_s=setup,
        compiled=bool(want_compile),
        graphs=bool(want_graphs),
        device=str(dev),
    )


def _positions(cache: Any) -> list[int]:
    """Each static layer's fill level (transformers 5.x keeps it in ``cumulative_length``)."""
    return [int(layer.cumulative_length) for layer in cache.layers if hasattr(layer, "cumulative_length")]


def _rewind(cache: Any, pos: list[int]) -> None:
    layers = [layer for layer in cache.layers if hasattr(layer, "cumulative_length")]
    for layer, p in zip(layers, pos, strict=True):
        layer.cumulative_length.fill_(p)
