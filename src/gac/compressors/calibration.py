"""Calibration: forward hooks that accumulate per-linear-input statistics, never activations.

For every hooked ``nn.Linear`` the hook adds, in float64:

* ``abs_sum``: the sum over tokens of ``|x|`` per input channel (ASVD's ``mean |X|``);
* ``gram``: ``XᵀX`` over tokens (SVD-LLM's whitening Gram matrix), when asked for;
* ``n_tokens``: the number of tokens seen.

The statistics are kept on the layer's device; each batch's activations are released as soon
as the hook returns.
"""

from __future__ import annotations

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
        source: a :func:`gac.data.load_text` source (its ``train`` split is used).
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
    """Token-id batches ``[batch, seq_len]`` from the ``train`` split of ``config.source``.

    Raises:
        GacError: when the text is too short for ``n_samples x seq_len`` tokens.
    """
    from gac.data import load_text, token_windows

    if config.batch_size < 1:
        raise GacError(f"calibration batch size must be positive, got {config.batch_size}")
    text = load_text(config.source, "train")
    if config.seed == 0:
        windows = token_windows(tokenizer, text, config.seq_len, config.n_samples)
    else:
        every = token_windows(tokenizer, text, config.seq_len)
        if every.shape[0] < config.n_samples:
            raise GacError(
                f"calibration text holds {every.shape[0]} window(s) of {config.seq_len} tokens, "
                f"{config.n_samples} needed; use fewer samples or a shorter length"
            )
        gen = torch.Generator().manual_seed(int(config.seed))
        pick = torch.randperm(every.shape[0], generator=gen)[: config.n_samples].sort().values
        windows = every[pick]
    return list(windows.split(config.batch_size))


def model_device(model: nn.Module) -> torch.device:
    """The device of the model's first parameter."""
    try:
        return next(model.parameters()).device
    except StopIteration:
        return torch.device("cpu")


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
    handles = []

    def make_hook(name: str, in_features: int):
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

    for name, mod in modules.items():
        in_features = mod.weight.shape[1]
        handles.append(mod.register_forward_hook(make_hook(name, in_features)))
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
