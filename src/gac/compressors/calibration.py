"""Calibration: forward hooks that accumulate per-linear-input statistics, never activations.

For every hooked ``nn.Linear`` the hook adds, in float64:

* ``abs_sum``: the sum over tokens of ``|x|`` per input channel (ASVD's ``mean |X|``);
* ``gram``: ``XᵀX`` over tokens (SVD-LLM's whitening Gram matrix), when asked for;
* ``n_tokens``: the number of tokens seen.

The statistics are kept on the layer's device; each batch's activations are released as soon
as the hook returns.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from gac.errors import GacError
from gac.utils import track


@dataclass
class LinearStats:
    """Accumulated statistics of one linear layer's input."""

    n_tokens: int
    abs_sum: torch.Tensor
    gram: torch.Tensor | None = None

    @property
    def abs_mean(self) -> torch.Tensor:
        """Mean ``|x|`` per input channel (float64)."""
        return self.abs_sum / max(self.n_tokens, 1)


@dataclass(frozen=True)
class CalibrationConfig:
    """How much calibration text to use.

    Attributes:
        source: a :func:`gac.data.load_part` source (its ``train`` part is used).
        n_samples: number of windows (N).
        seq_len: tokens per window (L).
        batch_size: windows per forward pass.
        seed: ``0`` takes the first ``n_samples`` windows of the text; another value takes
            ``n_samples`` of all its non-overlapping windows at random (seeded), so two seeds give
            two calibration sets for measuring the spread of a result.
    """

    source: str = "britannica"
    n_samples: int = 256
    seq_len: int = 2048
    batch_size: int = 1
    seed: int = 0

    @classmethod
    def default(
        cls, device: torch.device | str | None = None, source: str = "britannica"
    ) -> CalibrationConfig:
        """256 x 2048 on a GPU (the papers' setting), 32 x 256 on CPU."""
        dev = torch.device(device) if device is not None else None
        if dev is not None and dev.type == "cuda":
            return cls(source=source, n_samples=256, seq_len=2048, batch_size=4)
        return cls(source=source, n_samples=32, seq_len=256, batch_size=4)


def calibration_batches(tokenizer, config: CalibrationConfig) -> list[torch.Tensor]:
    """Token-id batches ``[batch, seq_len]`` from the ``train`` part of ``config.source``.

    Raises:
        GacError: when the text is too short for ``n_samples x seq_len`` tokens.
    """
    return calibration_data(tokenizer, config)[0]


def calibration_data(tokenizer, config: CalibrationConfig):
    """``(batches, part)``: :func:`calibration_batches` and the :class:`gac.data.TextPart` they come from.

    The windows are cut from the tokens of the ``train`` part as the model's tokenizer encodes it
    (:func:`gac.data.tokenize`: a leading BOS where the tokenizer adds one).

    Raises:
        GacError: when the text is too short for ``n_samples x seq_len`` tokens.
    """
    from gac.data import check_split_windows, load_part, token_windows

    if config.batch_size < 1:
        raise GacError(f"calibration batch size must be positive, got {config.batch_size}")
    part = load_part(config.source, "train")
    check_split_windows(tokenizer, config.source, config.seq_len)
    what = f"calibration text ({config.source}, {part.part} part)"
    if config.seed == 0:
        windows = token_windows(tokenizer, part.text, config.seq_len, config.n_samples, what=what)
    else:
        every = token_windows(tokenizer, part.text, config.seq_len, what=what)
        if every.shape[0] < config.n_samples:
            raise GacError(
                f"calibration text holds {every.shape[0]} window(s) of {config.seq_len} tokens, "
                f"{config.n_samples} needed; use fewer samples or a shorter length"
            )
        gen = torch.Generator().manual_seed(int(config.seed))
        pick = torch.randperm(every.shape[0], generator=gen)[: config.n_samples].sort().values
        windows = every[pick]
    return list(windows.split(config.batch_size)), part


def model_device(model: nn.Module) -> torch.device:
    """The device of the model's first parameter."""
    try:
        return next(model.parameters()).device
    except StopIteration:
        return torch.device("cpu")


def linear_stats_hook(stats: dict[str, LinearStats], name: str, in_features: int, gram: bool):
    """A forward hook adding one batch's ``|x|`` sums (and ``XᵀX``) of a linear's input to ``stats[name]``."""

    def hook(module: nn.Module, args: tuple, _out) -> None:
        x = args[0].detach().reshape(-1, in_features)
        st = stats.get(name)
        if st is None:
            st = LinearStats(0, torch.zeros(in_features, dtype=torch.float64, device=x.device))
            if gram:
                st.gram = torch.zeros(in_features, in_features, dtype=torch.float64, device=x.device)
            stats[name] = st
        xd = x.to(torch.float64)
        st.abs_sum += xd.abs().sum(0)
        if gram:
            st.gram.addmm_(xd.T, xd)
        st.n_tokens += x.shape[0]

    return hook


@torch.no_grad()
def collect_stats(
    model: nn.Module,
    modules: dict[str, nn.Module],
    batches: Iterable[torch.Tensor],
    gram: bool = False,
    description: str = "calibration",
) -> dict[str, LinearStats]:
    """Run ``batches`` through ``model`` and accumulate the input statistics of ``modules``.

    Args:
        model: a causal LM taking ``input_ids``.
        modules: name -> linear module to hook.
        batches: token-id tensors ``[batch, seq]``.
        gram: also accumulate the Gram matrix ``XᵀX`` (``in x in`` float64 per module).
        description: the progress bar's label.

    Returns:
        name -> :class:`LinearStats`.
    """
    stats: dict[str, LinearStats] = {}
    handles = [
        mod.register_forward_hook(linear_stats_hook(stats, name, mod.weight.shape[1], gram))
        for name, mod in modules.items()
    ]
    dev = model_device(model)
    was_training = model.training
    model.eval()
    try:
        batches = list(batches) if not isinstance(batches, Sequence) else batches
        if not batches:
            raise GacError("no calibration batches given")
        n_tok = sum(int(b.numel()) for b in batches)
        for b in track(batches, f"{description}: {len(batches)} batches, {n_tok:,} tokens"):
            model(input_ids=b.to(dev), use_cache=False)
    finally:
        for h in handles:
            h.remove()
        model.train(was_training)
    missing = [n for n in modules if n not in stats]
    if missing:
        raise GacError(f"calibration never reached {len(missing)} layer(s), e.g. {missing[0]}")
    return stats


class _Stop(Exception):
    """Raised by the first decoder layer's stand-in once it has seen its inputs."""


@dataclass
class SequentialInfo:
    """What a layer-by-layer pass kept on the execution device at most (parameters only).

    Attributes:
        exec_device: where each layer ran.
        peak_param_bytes: the largest parameter footprint moved there at once (one decoder layer
            plus the embedding and rotary modules).
        model_param_bytes: the whole model's parameters, for comparison.
        layers: decoder layers run.
    """

    exec_device: str
    peak_param_bytes: int
    model_param_bytes: int
    layers: int


def _param_bytes(mod: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in mod.parameters())


def _to(x, dev):
    if isinstance(x, torch.Tensor):
        return x.to(dev)
    if isinstance(x, tuple):
        return tuple(_to(v, dev) for v in x)
    if isinstance(x, list):
        return [_to(v, dev) for v in x]
    if isinstance(x, dict):
        return {k: _to(v, dev) for k, v in x.items()}
    return x


@torch.no_grad()
def collect_stats_sequential(
    model: nn.Module,
    modules: dict[str, nn.Module],
    batches: Iterable[torch.Tensor],
    exec_device: torch.device | str,
    gram: bool = False,
    description: str = "calibration",
) -> tuple[dict[str, LinearStats], SequentialInfo]:
    """:func:`collect_stats`, one decoder layer at a time on ``exec_device`` (llm-compressor's sequential idea).

    The model stays where it is (e.g. CPU). The embedding and rotary modules move to
    ``exec_device``; the first decoder layer's inputs (and its keyword arguments: masks, position
    embeddings) are captured per batch; then each layer in turn moves to ``exec_device``, runs every
    cached batch with the statistics hooks of its own linears, hands its outputs to the next layer
    and moves back. Activations between layers are kept on the model's device; statistics move there
    after each layer. Peak execution-device memory is one layer plus one batch's activations, whatever
    the depth. The statistics equal :func:`collect_stats`' (same hooks, same order).

    Raises:
        GacError: no decoder layers found, or no calibration batches.
    """
    from gac.models.adapters import get_adapter

    exec_device = torch.device(exec_device)
    ad = get_adapter(model)
    layers = model.get_submodule(ad.layers_fqn)
    home = model_device(model)
    batches = list(batches)
    if not batches:
        raise GacError("no calibration batches given")
    moved: list[tuple[nn.Module, torch.device]] = []
    for fqn in (ad.embed_fqn, ad.rotary_fqn):
        try:
            mod = model.get_submodule(fqn)
        except AttributeError:
            continue
        dev = next((t.device for t in list(mod.parameters()) + list(mod.buffers())), home)
        moved.append((mod, dev))
        mod.to(exec_device)
    base_bytes = sum(_param_bytes(m) for m, _ in moved)
    peak = base_bytes
    captured: list[tuple[torch.Tensor, dict]] = []
    first = layers[0]

    class Catcher(nn.Module):
        def __init__(self, inner: nn.Module) -> None:
            super().__init__()
            self.inner = inner
            for attr in ("attention_type", "layer_idx"):
                if hasattr(inner, attr):
                    setattr(self, attr, getattr(inner, attr))

        def forward(self, hidden_states, *args, **kwargs):
            if args:
                raise GacError("layer-by-layer calibration needs keyword arguments after hidden_states")
            captured.append((hidden_states.to(home), _to(kwargs, home)))
            raise _Stop

    stats: dict[str, LinearStats] = {}
    was_training = model.training
    model.eval()
    layers[0] = Catcher(first)
    try:
        n_tok = sum(int(b.numel()) for b in batches)
        for b in track(batches, f"{description}: {len(batches)} batches, {n_tok:,} tokens (layer inputs)"):
            with contextlib.suppress(_Stop):
                model(input_ids=b.to(exec_device), use_cache=False)
    finally:
        layers[0] = first
    if len(captured) != len(batches):
        raise GacError("layer-by-layer calibration: the first decoder layer did not see every batch")
    try:
        for i in track(range(len(layers)), f"{description}: layer by layer on {exec_device}"):
            layer = layers[i]
            dev = next(layer.parameters()).device
            layer.to(exec_device)
            peak = max(peak, base_bytes + _param_bytes(layer))
            inside = {id(m) for m in layer.modules()}
            mine = {n: m for n, m in modules.items() if id(m) in inside}
            part = _hooked_run(layer, mine, captured, exec_device, home, gram)
            for n, st in part.items():
                stats[n] = st
            layer.to(dev)
    finally:
        for mod, dev in moved:
            mod.to(dev)
        model.train(was_training)
    missing = [n for n in modules if n not in stats]
    if missing:
        raise GacError(f"calibration never reached {len(missing)} layer(s), e.g. {missing[0]}")
    return stats, SequentialInfo(str(exec_device), peak, _param_bytes(model), len(layers))


def _hooked_run(
    layer: nn.Module,
    modules: dict[str, nn.Module],
    captured: list[tuple[torch.Tensor, dict]],
    exec_device: torch.device,
    home: torch.device,
    gram: bool,
) -> dict[str, LinearStats]:
    """Run every cached batch through ``layer`` with the statistics hooks; replace the cache by its outputs."""
    stats: dict[str, LinearStats] = {}
    handles = [
        mod.register_forward_hook(linear_stats_hook(stats, name, mod.weight.shape[1], gram))
        for name, mod in modules.items()
    ]
    try:
        for j, (h, kw) in enumerate(captured):
            out = layer(h.to(exec_device), **_to(kw, exec_device))
            out = out[0] if isinstance(out, tuple) else out
            captured[j] = (out.to(home), kw)
    finally:
        for hd in handles:
            hd.remove()
    for st in stats.values():
        st.abs_sum = st.abs_sum.to(home)
        if st.gram is not None:
            st.gram = st.gram.to(home)
    return stats
