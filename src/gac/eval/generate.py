"""Greedy generation on gac's fast path: a static KV cache, a compiled step, CUDA graphs.

:func:`generate` works for dense and gac models alike (factorized, pruned, PaLU's latent cache):

1. **prefill** runs the prompt through the model into a :class:`transformers.StaticCache` sized
   ``prompt + max_new_tokens``. The first prefill pays one-time costs (on CUDA: compiling the
   step for the prompt's shape and capturing it as a CUDA graph; everywhere: first-use
   allocations); it is timed apart (``first_prefill_s``). The cache is then rewound and the prompt
   run again, warm: the *time to first token* ``ttft_s`` is the median of these steady prefills,
   prompt in, first token out, which is what a served request sees;
2. **decode** runs one-token steps. On CUDA the step is ``torch.compile``'d and captured as a CUDA
   graph once (the cache advances its own position inside the graph, as in
   :class:`gac.runtime.step.DecodeStep`); that setup is timed separately (``decode_setup_s``) and
   never counted in ``tokens_per_s``. On CPU the same static-cache loop runs eagerly, with a
   one-line notice.

The output equals ``model.generate(..., do_sample=False)`` token for token (tested on CPU).
:attr:`Generation.paths` records which attention implementation and decode kernels ran, and
:attr:`Generation.kv_bytes_per_token` what one token costs in the cache.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn

from gac.compat import cache_arg
from gac.errors import GacError
from gac.runtime.fastpath import FastPath
from gac.runtime.step import capture_graph, compile_step, sync, use_decode_kernels_


@dataclass
class Generation:
    """What :func:`generate` produced and how fast.

    Attributes:
        text: the decoded new tokens.
        prompt_tokens / new_tokens: token counts.
        ttft_s: steady time to first token: prompt in, first new token out (a warm prefill and
            its argmax; median of ``prefill_reps``), one-time costs excluded.
        first_prefill_s: the first prefill, one-time costs (compile, capture, first use) included.
        decode_s: the remaining ``new_tokens - 1`` steps.
        tokens_per_s: steady decode throughput, ``(new_tokens - 1) / decode_s``.
        setup_s: every one-time cost outside the latencies: ``first_prefill_s - ttft_s`` plus
            ``decode_setup_s`` (compiling and capturing the decode step).
        decode_setup_s: compiling and capturing the decode step.
        compiled / graphs: which parts of the fast path ran.
        device: where it ran.
        kv_bytes_per_token: cache bytes one token costs, all layers (``cache``), and for the
            dense original (``dense``); :func:`gac.models.inventory.kv_bytes_per_token`.
        paths: which attention implementation ran (``attention``; ``latent_attention`` counts
            PaLU's latent modules) and what each decode kernel switch did (``kernels``).
    """

    text: str
    token_ids: list[int]
    prompt_tokens: int
    new_tokens: int
    ttft_s: float
    first_prefill_s: float
    decode_s: float
    tokens_per_s: float
    setup_s: float
    decode_setup_s: float
    compiled: bool
    graphs: bool
    device: str
    kv_bytes_per_token: dict[str, int]
    paths: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@torch.no_grad()
def generate(
    model: nn.Module,
    tokenizer: Any,
    prompt: str,
    max_new_tokens: int = 32,
    *,
    stop_at_eos: bool = True,
    prefill_reps: int = 3,
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
            (:func:`gac.runtime.gemv.use_triton_gemv_`), ``fused_lowrank``
            (:func:`gac.runtime.lowrank_fused.use_fused_lowrank_`), ``branches``
            (:func:`gac.runtime.branches.use_branches_`), each in place where measured faster, and
            ``combo_kernels`` (:func:`gac.runtime.step.compile_step`).
        **switches: a switch by name (``gemv=False``), over ``fast``.
        prefill_reps: steady prefills of the prompt timed for ``ttft_s`` (their median).

    Raises:
        GacError: an empty prompt, a non-positive token count, or no tokenizer.
    """
    from transformers import StaticCache

    from gac.models.inventory import kv_bytes_per_token

    fast = FastPath.of(fast, **switches)
    dev = next(model.parameters()).device
    ids = _prompt_ids(tokenizer, prompt, max_new_tokens, prefill_reps).to(dev)
    want_compile, want_graphs = _fast_path_here(fast, dev)
    paths = _use_paths_(model, fast)
    n_prompt = ids.shape[1]
    eos = getattr(tokenizer, "eos_token_id", None) if stop_at_eos else None
    was_training = model.training
    model.eval()
    cache = StaticCache(config=model.config, max_cache_len=n_prompt + max_new_tokens)
    ckw = cache_arg(model, cache)
    forward = model.forward
    if want_compile:
        forward = compile_step(model.forward, combo_kernels=fast.combo_kernels, dynamic=False)
    try:
        # the first prefill allocates the cache (lazily, in transformers) and pays the one-time costs
        sync(dev)
        t0 = time.perf_counter()
        model(input_ids=ids, use_cache=True, logits_to_keep=1, **ckw)

        def prefill_eager() -> torch.Tensor:
            return forward(input_ids=ids, use_cache=True, logits_to_keep=1, **ckw).logits

        token, warm, ttft = _steady_prefills(
            prefill_eager, cache, dev, want_compile, want_graphs, prefill_reps
        )
        first_prefill = warm - t0
        tokens = [int(token)]
        step_ids = token.clone()  # the step's static input

        def step_eager() -> torch.Tensor:
            return forward(input_ids=step_ids, use_cache=True, **ckw).logits

        step, decode_setup = step_eager, 0.0
        if max_new_tokens > 1 and (eos is None or tokens[-1] != eos) and (want_compile or want_graphs):
            step, decode_setup = _decode_step(step_eager, cache, dev, want_graphs)
        decode_s = _decode(step, step_ids, token, tokens, max_new_tokens - 1, eos, dev)
    finally:
        model.train(was_training)
    n_dec = len(tokens) - 1
    return Generation(
        text=tokenizer.decode(tokens, skip_special_tokens=True),
        token_ids=tokens,
        prompt_tokens=n_prompt,
        new_tokens=len(tokens),
        ttft_s=ttft,
        first_prefill_s=first_prefill,
        decode_s=decode_s,
        tokens_per_s=n_dec / decode_s if n_dec and decode_s > 0 else 0.0,
        setup_s=max(0.0, first_prefill - ttft) + decode_setup,
        decode_setup_s=decode_setup,
        compiled=bool(want_compile),
        graphs=bool(want_graphs),
        device=str(dev),
        kv_bytes_per_token=kv_bytes_per_token(model),
        paths=paths,
    )


def _prompt_ids(tokenizer: Any, prompt: str, max_new_tokens: int, prefill_reps: int) -> torch.Tensor:
    """The prompt's token ids, after checking every argument."""
    if tokenizer is None:
        raise GacError("generate needs the model's tokenizer")
    if not prompt:
        raise GacError("the prompt is empty; give text to continue")
    if max_new_tokens < 1:
        raise GacError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
    if prefill_reps < 1:
        raise GacError(f"prefill_reps must be at least 1, got {prefill_reps}")
    ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
    if ids.numel() == 0:
        raise GacError("the prompt is empty after tokenization; give text to continue")
    return ids


def _use_paths_(model: nn.Module, fast: FastPath) -> dict[str, Any]:
    """Switch the decode kernels in (in place, where measured faster); record the paths that run."""
    from gac.nn.latent import latent_modules

    kernels = use_decode_kernels_(model, fast.gqa_decode, fast.gemv, fast.fused_lowrank, fast.branches)
    return {
        "attention": str(getattr(model.config, "_attn_implementation", None)),
        "latent_attention": len(latent_modules(model)),
        "kernels": kernels,
    }


def _fast_path_here(fast: FastPath, dev: torch.device) -> tuple[bool, bool]:
    """Whether to compile the steps and capture CUDA graphs on ``dev`` (both need CUDA: a notice
    when asked for elsewhere)."""
    from gac.utils import console

    on_cuda = dev.type == "cuda"
    want_compile = on_cuda if fast.compile is None else fast.compile
    want_graphs = on_cuda if fast.graphs is None else fast.graphs
    if (want_compile or want_graphs) and not on_cuda:
        console.print(
            f"notice: torch.compile and CUDA graphs need CUDA; generating eagerly on {dev.type}",
            markup=False,
        )
        return False, False
    return want_compile, want_graphs


def _steady_prefills(
    prefill_eager: Any, cache: Any, dev: torch.device, want_compile: bool, want_graphs: bool, reps: int
) -> tuple[torch.Tensor, float, float]:
    """After the first prefill: compile or capture the prefill, then time ``reps`` steady prefills
    of the same prompt (the time to first token). Returns the first token, when the one-time costs
    ended (``time.perf_counter``) and the median steady prefill in seconds."""
    pos0 = [0] * len(_positions(cache))
    prefill = prefill_eager
    if want_graphs:
        _rewind(cache, pos0)
        prefill = _capture_rewinding(prefill_eager, dev, cache, pos0)
    elif want_compile:
        _rewind(cache, pos0)
        prefill()  # compiles for the prompt's shape
    sync(dev)
    first = time.perf_counter()
    times = []
    for _ in range(reps):
        _rewind(cache, pos0)
        sync(dev)
        t1 = time.perf_counter()
        token = prefill()[:, -1].argmax(-1, keepdim=True)
        int(token)
        times.append(time.perf_counter() - t1)
    return token, first, sorted(times)[len(times) // 2]


def _decode_step(step_eager: Any, cache: Any, dev: torch.device, want_graphs: bool) -> tuple[Any, float]:
    """The decode step compiled (for the one-token shape) or captured; and the seconds that took."""
    t1 = time.perf_counter()
    step = step_eager
    if want_graphs:
        step = _capture_rewinding(step_eager, dev, cache, _positions(cache))
    else:
        pos = _positions(cache)
        step_eager()  # compiles for the one-token shape
        _rewind(cache, pos)
    sync(dev)
    return step, time.perf_counter() - t1


def _decode(
    step: Any,
    step_ids: torch.Tensor,
    token: torch.Tensor,
    tokens: list[int],
    remaining: int,
    eos: int | None,
    dev: torch.device,
) -> float:
    """Greedy one-token steps appended to ``tokens`` (until ``remaining`` or EOS); their seconds."""
    sync(dev)
    t2 = time.perf_counter()
    for _ in range(remaining):
        if eos is not None and tokens[-1] == eos:
            break
        step_ids.copy_(token)
        logits = step()
        token = logits[:, -1].argmax(-1, keepdim=True)
        tokens.append(int(token))
    sync(dev)
    return time.perf_counter() - t2


def _capture_rewinding(fn: Any, dev: torch.device, cache: Any, pos: list[int]) -> Any:
    """Capture ``fn`` (a step that writes into ``cache``) as a CUDA graph
    (:func:`gac.runtime.step.capture_graph`), rewinding the cache to ``pos`` after every call; return the replay."""
    return capture_graph(fn, dev, lambda: _rewind(cache, pos))[0]


def _positions(cache: Any) -> list[int]:
    """Each static layer's fill level (transformers 5.x keeps it in ``cumulative_length``)."""
    return [int(layer.cumulative_length) for layer in cache.layers if hasattr(layer, "cumulative_length")]


def _rewind(cache: Any, pos: list[int]) -> None:
    layers = [layer for layer in cache.layers if hasattr(layer, "cumulative_length")]
    for layer, p in zip(layers, pos, strict=True):
        layer.cumulative_length.fill_(p)
