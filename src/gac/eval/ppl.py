"""Perplexity by the standard protocol.

The text is tokenized once the way the model's tokenizer encodes a document by default
(:func:`gac.data.tokenize`: a leading BOS where the tokenizer adds one, as lm-evaluation-harness's
``HFLM.tok_encode`` does) and cut into non-overlapping windows of ``seq_len`` tokens. Each window is
scored on its own:
the first token of a window is context only, every later token is predicted, so a full window
contributes ``seq_len - 1`` predictions; with a BOS tokenizer the first window starts with BOS and
every text token in it is predicted. The tokens after the last full window are scored in one more
window of ``seq_len`` tokens that ends with them, its start taken from before them as context
(lm-eval's last rolling window does the same), and reported as ``last_window_tokens``; nothing is
dropped silently. The perplexity is ``exp(total NLL / total predicted tokens)``. With
``max_windows`` only the first windows are scored and the result says so
(``truncated: True``). The convention used is recorded as ``tokens`` (``bos``, the ids added).

lm-eval's rolling loglikelihood (``loglikelihood_rolling``) also scores each window's first token
(from one token of context, and the document's first from its prefix token); docs/eval.md gives
the difference, which is of order one token per window.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from gac.data import (
    TextPart,
    check_disjoint,
    check_seq_len,
    check_text,
    load_part,
    nll_from_logits,
    parse_text_source,
    special_tokens,
    tokenize,
)
from gac.errors import GacError
from gac.utils import track


def _device(model: nn.Module) -> torch.device:
    try:
        return next(model.parameters()).device
    except StopIteration:
        return torch.device("cpu")


@torch.no_grad()
def window_nll(model: nn.Module, batch: torch.Tensor, score_last: int | None = None) -> tuple[float, int]:
    """Summed next-token NLL over a ``[b, t]`` batch of windows, and the number of predictions.

    Logits are upcast to float32 before the log-softmax. ``score_last`` scores only the last
    ``score_last`` tokens of each window (the rest is context).
    """
    logits = model(input_ids=batch.to(_device(model)), use_cache=False).logits
    return nll_from_logits(logits, batch, score_last)


def perplexity_of_ids(
    model: nn.Module,
    ids: torch.Tensor,
    seq_len: int = 2048,
    batch_size: int = 1,
    max_windows: int | None = None,
    description: str = "perplexity",
) -> dict[str, Any]:
    """Perplexity of a 1-D token-id tensor (see the module docstring for the protocol).

    Raises:
        GacError: fewer than two tokens, bad arguments, or a non-finite loss.
    """
    if seq_len < 2:
        raise GacError(f"seq_len must be at least 2, got {seq_len}")
    if batch_size < 1:
        raise GacError(f"batch_size must be positive, got {batch_size}")
    if max_windows is not None and max_windows < 1:
        raise GacError(f"max_windows must be positive, got {max_windows}")
    ids = ids.reshape(-1)
    n = ids.numel()
    if n < 2:
        raise GacError(f"text too short for perplexity: {n} token(s)")
    n_full = n // seq_len
    rest = n - n_full * seq_len
    windows: list[torch.Tensor] = [ids[: n_full * seq_len].view(n_full, seq_len)] if n_full else []
    # the tokens after the last full window: scored in one more window of seq_len tokens whose
    # start is taken from before them (as lm-eval's last rolling window), or alone in a short text
    last, score_last = None, None
    if rest and n_full:
        last, score_last = ids[n - seq_len :], rest
    elif rest >= 2:
        last = ids
    total_windows = n_full + (1 if last is not None else 0)
    truncated = False
    if max_windows is not None and max_windows < total_windows:
        truncated = True
        if max_windows <= n_full:
            windows = [ids[: max_windows * seq_len].view(max_windows, seq_len)]
            last = None
    batches: list[tuple[torch.Tensor, int | None]] = []
    for w in windows:
        batches.extend((b, None) for b in w.split(batch_size))
    if last is not None:
        batches.append((last.view(1, -1), score_last))
    nll, count = _accumulate(model, batches, description)
    if not math.isfinite(nll):
        raise GacError(f"perplexity is not finite (summed NLL {nll}); the model produces NaN/inf logits")
    scored_windows = sum(b.shape[0] for b, _ in batches)
    last_tokens = 0 if last is None else (score_last or last.numel())
    return {
        "ppl": math.exp(nll / count),
        "nll": nll / count,
        "seq_len": seq_len,
        "n_tokens": n,
        "n_windows": scored_windows,
        "n_predicted": count,
        "last_window_tokens": int(last_tokens),
        "dropped_tokens": int(rest) if (rest == 1 and not n_full) else 0,
        "truncated": truncated,
    }


def _accumulate(
    model: nn.Module, batches: Iterable[tuple[torch.Tensor, int | None]], description: str
) -> tuple[float, int]:
    was_training = model.training
    model.eval()
    nll, count = 0.0, 0
    try:
        for b, score_last in track(list(batches), description):
            s, c = window_nll(model, b, score_last)
            nll += s
            count += c
    finally:
        model.train(was_training)
    return nll, count


def perplexity(
    model: nn.Module,
    tokenizer: Any,
    text: str,
    seq_len: int = 2048,
    batch_size: int = 1,
    max_windows: int | None = None,
) -> dict[str, Any]:
    """Perplexity of ``model`` on ``text`` by the standard protocol.

    Args:
        model: a causal LM (``model(input_ids=...).logits``).
        tokenizer: its tokenizer.
        text: the evaluation text (concatenated documents).
        seq_len: window length.
        batch_size: full windows per forward pass.
        max_windows: score only the first ``max_windows`` windows (reported as ``truncated``).

    Returns:
        ``ppl``, ``nll`` (mean per predicted token), ``seq_len``, ``n_tokens``, ``n_windows``,
        ``n_predicted``, ``last_window_tokens`` (tokens scored after the last full window, 0 if none),
        ``dropped_tokens`` (a one-token text's token, which cannot be predicted), ``truncated`` and
        ``tokens`` (the tokenizer's convention: ``bos``, the ids it adds; :func:`gac.data.special_tokens`).

    Raises:
        GacError: not text (mostly non-printable), shorter than one window, a window longer than
            the model's context, or a NaN/inf loss.
    """
    check_seq_len(model, seq_len)
    check_text(text, "the evaluation text")
    ids = tokenize(tokenizer, text)
    if seq_len >= 2 and ids.numel() < seq_len:
        raise GacError(
            f"the evaluation text is too short for one window: {ids.numel()} tokens < seq_len {seq_len} "
            "(give more text or a smaller --seq-len)"
        )
    res = perplexity_of_ids(model, ids, seq_len, batch_size, max_windows)
    return {**res, "tokens": special_tokens(tokenizer)}


def saved_calibration(model_dir: str | Path) -> dict[str, Any] | None:
    """The calibration record of a gac-saved model directory (None when it was not calibrated).

    Newer saves record the calibration text's provenance (``text``); older ones only its source,
    whose ``train`` part is then located again.
    """
    cfg_path = Path(model_dir) / "gac_config.json"
    if not cfg_path.is_file():
        return None
    try:
        cfg = json.loads(cfg_path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    calib = cfg.get("calibration")
    if isinstance(calib, dict):
        return calib if calib.get("used") else None
    source = (cfg.get("compress_config") or {}).get("calib")
    return {"used": True, "source": source} if isinstance(source, str) else None


def check_calibration_overlap(
    calibration: dict[str, Any] | None, evaluation: Any, allow_overlap: bool = False
) -> dict[str, Any]:
    """Refuse evaluating on text the model was calibrated on, unless ``allow_overlap``.

    Args:
        calibration: a compression report's calibration record (``source`` and ``text``, the
            :meth:`gac.data.TextPart.describe` of its part), or None for a model not calibrated.
        evaluation: the :class:`gac.data.TextPart` scored.
        allow_overlap: record the overlap instead of refusing it.

    Returns:
        The ``split`` record of the result JSON (:func:`gac.data.check_disjoint`).

    Raises:
        GacError: one line, when calibration and evaluation text overlap without ``allow_overlap``.
    """
    if not calibration or calibration.get("source") in (None, "batches"):
        return {"calibration": None, "evaluation": evaluation.describe(), "overlap": False}
    text = calibration.get("text")
    if isinstance(text, dict) and isinstance(text.get("chars"), list):
        start, end = (int(c) for c in text["chars"])
        part = TextPart("", text.get("source", calibration["source"]), text.get("part", "train"),
                        str(text.get("origin")), start, end)  # fmt: skip
    else:  # saved before parts were recorded: a text file then calibrated on the whole file
        src = calibration["source"]
        if src.startswith("text:") and parse_text_source(src)[1] is None:
            src += "@all"
        try:
            part = load_part(src, "train")
        except GacError as e:
            raise GacError(f"cannot check that evaluation and calibration text are disjoint: {e}") from None
    return check_disjoint(part, evaluation, allow_overlap)
