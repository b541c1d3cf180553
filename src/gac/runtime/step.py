"""The compiled step of the default path, shared by the inference sweep (:mod:`gac.eval.infer`) and
``gac generate`` (:mod:`gac.eval.generate`).

Small functions, each one move of the fast path, and a step that is compiled by rebinding it
(``forward = compile_step(model.forward, dynamic=False)``) rather than by wrapping the model:

* :func:`resolve_fast_path`: whether to compile and capture on a device (both need CUDA);
* :func:`use_decode_kernels_`: the decode kernels switched into a model, in place;
* :func:`compile_step`: ``torch.compile`` with the default path's Inductor options;
* :func:`capture_graph`: a step captured once as a CUDA graph and replayed;
* :class:`DecodeStep`: one batched decode step against a static KV cache, captured or not;
* :func:`compiled_frames` and :func:`sync`: what the timing around a step needs.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from gac.compat import with_cache
from gac.errors import GacError
from gac.runtime.fastpath import FastPath
from gac.utils import console

log = logging.getLogger(__name__)
#: (kernel, reason) pairs already warned about, once per process
_WARNED: set[tuple[str, str]] = set()


def note_unserved(kernel: str, info: dict[str, Any]) -> None:
    """Warn once per process where a decode kernel asked for on CUDA switched nothing, naming why
    (``info["reason"]``, from :meth:`gac.runtime.dispatch.Dispatch.use_`); the reason is also in
    ``info``, which the infer JSON and ``gac generate --json`` record."""
    reason = info.get("reason")
    if not reason or (kernel, reason) in _WARNED:
        return
    _WARNED.add((kernel, reason))
    log.warning("decode kernels: %s does not run: %s (the existing path serves every site)", kernel, reason)


def sync(device: torch.device) -> None:
    """Wait for ``device``'s queued work (a no-op off CUDA)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def compiled_frames() -> int:
    """Frames Dynamo has compiled so far in this process (recompiles included)."""
    try:
        from torch._dynamo.utils import counters

        return int(counters["stats"]["unique_graphs"])
    except Exception:  # noqa: BLE001 - a missing counter only loses the recompile check
        return 0


def resolve_fast_path(cfg: FastPath, dev: torch.device) -> tuple[bool, bool]:
    """(graphs, compile) for ``dev``: on where CUDA is; a CPU request of either falls back with a notice."""
    graphs = cfg.graphs if cfg.graphs is not None else dev.type == "cuda"
    if graphs and dev.type != "cuda":
        console.print(
            f"notice: --graphs needs CUDA; timing uncaptured steps on {dev.type} (labelled graphs=false)",
            soft_wrap=True,
            markup=False,
        )
        graphs = False
    compile_ = cfg.compile if cfg.compile is not None else dev.type == "cuda"
    if compile_ and dev.type != "cuda":
        console.print(
            f"notice: --compile needs CUDA; timing the eager model on {dev.type} (labelled compiled=false)",
            soft_wrap=True,  # one line, never wrapped
            markup=False,
        )
        compile_ = False
    return graphs, compile_


def use_decode_kernels_(
    model: nn.Module, gqa_decode: bool = True, gemv: bool = True, fused_lowrank: bool = True,
    branches: bool = True,
) -> dict[str, dict[str, Any]]:  # fmt: skip
    """Switch ``model``, in place, to the decode kernels of the default path (the sweep's and
    :func:`gac.eval.generate.generate`'s): decode attention on the KV heads
    (:func:`gac.kernels.attention.use_gqa_decode_`), then on CUDA the Triton GEMV
    (:func:`gac.runtime.gemv.use_triton_gemv_`) and the one-launch low-rank kernel
    (:func:`gac.runtime.lowrank_fused.use_fused_lowrank_`) where measured faster, and the parallel
    second stages of fused groups (:func:`gac.runtime.branches.use_branches_`) where measured faster.

    Returns ``{"gemv": info, "fused_lowrank": info, "branches": info}``: what each switched, with its setup time
    (first-use measurement included), or the reason it did not run.
    """
    from gac.kernels.attention import use_gqa_decode_
    from gac.runtime.branches import use_branches_
    from gac.runtime.gemv import use_triton_gemv_
    from gac.runtime.lowrank_fused import use_fused_lowrank_

    on_cuda = next(model.parameters()).device.type == "cuda"
    if gqa_decode:
        use_gqa_decode_(model)
    out: dict[str, dict[str, Any]] = {}
    for key, wanted, switch in (
        ("gemv", gemv, use_triton_gemv_),
        ("fused_lowrank", fused_lowrank, use_fused_lowrank_),
        ("branches", branches, use_branches_),
    ):
        if not (wanted and on_cuda):
            out[key] = {"modules": 0, "reason": "off" if not wanted else "not on CUDA"}
            continue
        t0 = time.perf_counter()
        out[key] = switch(model)
        out[key]["setup_s"] = time.perf_counter() - t0
        note_unserved(key, out[key])
    return out


def compile_step(
    forward: Callable[..., Any],
    mode: str | None = None,
    combo_kernels: bool = True,
    dynamic: bool | None = None,
) -> Callable[..., Any]:
    """``torch.compile(forward)`` as the default path compiles its prefill and decode steps.

    With ``combo_kernels``, Inductor may launch kernels of one graph that do not depend on each other
    as one (horizontal fusion; which ones it combined in the steps below was not traced).  Same-machine A/B on an H200, compiled steps in CUDA graphs, 8 layers of
    the Llama-3-8B shape: dense and SVD-LLM steps 0.8–2.2% shorter at decode B1/B16 and prefill
    B1×128 (``benchmarks/results/h200/inductor-knobs/``).  ``mode`` is ``torch.compile``'s, its
    options merged with these.
    """
    import torch._inductor

    options = dict(torch._inductor.list_mode_options(mode, dynamic)) if mode else {}
    if combo_kernels:
        options["combo_kernels"] = True
    return torch.compile(forward, dynamic=dynamic, options=options or None)


#: one warm-up stream per device, not a new one per capture: cuBLAS keeps a workspace per (handle, stream)
#: for the life of the process. On an H100 a tiny model's sweep left 236 MB allocated beyond its 1 MB of
#: weights after its captured points, which the capacity search counts as held, and a second sweep in
#: the same process held 1.03 GiB (benchmarks/results/h100/palu-default/run4/gpu-tests); with this one
#: stream a second sweep held 101 MB (run5/gpu-tests)
_WARM_STREAMS: dict[torch.device, torch.cuda.Stream] = {}


def _warm_stream(dev: torch.device) -> torch.cuda.Stream:
    dev = torch.device(dev.type, dev.index if dev.index is not None else torch.cuda.current_device())
    if dev not in _WARM_STREAMS:
        _WARM_STREAMS[dev] = torch.cuda.Stream(dev)
    return _WARM_STREAMS[dev]


def capture_graph(
    fn: Callable[[], Any], dev: torch.device, reset: Callable[[], None] | None = None
) -> tuple[Callable[[], Any], Callable[[], None]]:
    """Warm ``fn`` up on a side stream, capture it as a CUDA graph; return (replay, release).

    ``reset`` (a step that writes into a KV cache: rewind the cache) runs after each warm-up call
    and after the capture, so that the first replay starts where the first warm-up did.
    """
    reset = reset or (lambda: None)
    s = _warm_stream(dev)
    s.wait_stream(torch.cuda.current_stream(dev))
    with torch.cuda.stream(s):
        for _ in range(2):
            fn()
            reset()
    torch.cuda.current_stream(dev).wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    reset()
    box = {"graph": graph, "out": out}

    def replay() -> Any:
        box["graph"].replay()
        return box["out"]

    def release() -> None:
        box.clear()

    return replay, release


class DecodeStep:
    """One batched decode step against a static KV cache, replayable as a CUDA graph.

    Args:
        model: a Hugging Face causal LM.
        batch: sequences decoded together.
        kv: slots of the static cache (the attended length).
        graphs: capture the step as a CUDA graph (CUDA only).
        forward: what runs the step (a :func:`compile_step` of ``model.forward``); default the model.
    """

    def __init__(
        self, model: nn.Module, batch: int, kv: int, graphs: bool, forward: Callable[..., Any] | None = None
    ) -> None:
        from transformers import StaticCache

        self.model = model
        self.forward = forward if forward is not None else model
        self.dev = next(model.parameters()).device
        if graphs and self.dev.type != "cuda":
            raise GacError("CUDA graphs were asked for, but the model is on CPU; drop --graphs or use a GPU")
        self.batch, self.kv, self.graphs = batch, kv, graphs
        self.cache = StaticCache(config=model.config, max_cache_len=kv)
        g = torch.Generator(device="cpu").manual_seed(batch * 7919 + kv)
        self.ids = torch.randint(0, int(model.config.vocab_size), (batch, 1), generator=g).to(self.dev)
        # the first call allocates the cache (lazy in transformers): eager, so that the compiled
        # step sees the allocated cache only and compiles once per shape
        self.model(**with_cache(self.model, self.cache, input_ids=self.ids, use_cache=True))
        for layer in self.cache.layers:  # random, not zero, keys and values
            layer.keys.normal_(0, 1)
            layer.values.normal_(0, 1)
        self._replay: Callable[[], Any] | None = None
        self._release: Callable[[], None] = lambda: None
        if graphs:
            self._replay, self._release = capture_graph(self._eager, self.dev, lambda: self.set_position(0))
        self.set_position(0)

    @property
    def kv_bytes(self) -> int:
        return sum(
            layer.keys.numel() * layer.keys.element_size()
            + layer.values.numel() * layer.values.element_size()
            for layer in self.cache.layers
        )

    def set_position(self, pos: int) -> None:
        for layer in self.cache.layers:
            layer.cumulative_length.fill_(pos)

    def _eager(self) -> Any:
        return self.forward(**with_cache(self.model, self.cache, input_ids=self.ids, use_cache=True)).logits

    def __call__(self) -> Any:
        if self._replay is not None:
            return self._replay()
        return self._eager()

    def close(self) -> None:
        self._release()
        self._replay = None
        self.cache = None
