"""Perplexity protocol: non-overlapping windows, mean NLL over predicted tokens, nothing dropped.

The model's BOS convention and agreement with lm-eval: tests/eval/test_ppl_lm_eval.py."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from gac.errors import GacError
from gac.eval.ppl import perplexity, perplexity_of_ids
from gac.testing import tiny_model


def _manual(model, ids, seq_len):
    """Full windows score all but their first token; the rest is scored after the context before it."""
    nll, n = 0.0, 0
    for start in range(0, ids.numel(), seq_len):
        end = min(start + seq_len, ids.numel())
        w = ids[max(end - seq_len, 0) : end]  # the last window reaches back for its context
        with torch.no_grad():
            logits = model(w[None]).logits[0]
        first = w.numel() - (end - start)  # position of the first token this window scores
        for t in range(max(first - 1, 0), w.numel() - 1):
            nll -= F.log_softmax(logits[t].double(), -1)[w[t + 1]].item()
            n += 1
    return math.exp(nll / n), n


@pytest.mark.parametrize("batch_size", [1, 2])
def test_matches_manual_loop_including_partial_window(batch_size):
    model = tiny_model("llama")
    ids = torch.randint(0, 250, (3 * 32 + 17,), generator=torch.Generator().manual_seed(0))
    res = perplexity_of_ids(model, ids, seq_len=32, batch_size=batch_size)
    ppl, n = _manual(model, ids, 32)
    assert res["ppl"] == pytest.approx(ppl, rel=1e-6)
    assert res["n_predicted"] == n == 3 * 31 + 17
    assert res["n_windows"] == 4 and res["last_window_tokens"] == 17 and not res["truncated"]


def test_max_windows_is_reported_and_a_single_leftover_token_is_scored():
    model = tiny_model("llama")
    ids = torch.randint(0, 250, (3 * 16 + 1,), generator=torch.Generator().manual_seed(1))
    res = perplexity_of_ids(model, ids, seq_len=16, max_windows=2)
    assert res["truncated"] and res["n_windows"] == 2 and res["n_predicted"] == 30
    res = perplexity_of_ids(model, ids, seq_len=16)
    assert res["dropped_tokens"] == 0 and res["last_window_tokens"] == 1 and res["n_predicted"] == 46
    assert res["ppl"] == pytest.approx(_manual(model, ids, 16)[0], rel=1e-6)


def test_text_entry_point_and_errors():
    class Bytes:
        def __call__(self, text, add_special_tokens=True):
            return {"input_ids": [b % 250 for b in text.encode()]}

    model = tiny_model("llama")
    res = perplexity(model, Bytes(), "a real sentence of English prose, " * 3, seq_len=32)
    assert res["n_tokens"] == 102 and math.isfinite(res["ppl"])
    with pytest.raises(GacError, match="too short"):
        perplexity(model, Bytes(), "a", seq_len=32)
    with torch.no_grad():
        model.lm_head.weight[0, 0] = float("nan")
    with pytest.raises(GacError, match="not finite"):
        perplexity(model, Bytes(), "some words here", seq_len=8)
