"""`gac eval ppl` next to lm-eval's own rolling-loglikelihood perplexity on the same text (offline).

lm-eval runs as users run it: ``HFLM`` loads the model directory, a local task scores the text
file as one document (``datasets``' ``text`` builder), and its ``byte_perplexity`` gives the summed
log-likelihood (:func:`gac.eval.lm_eval_bridge.lm_eval_perplexity`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

pytest.importorskip("lm_eval")

from gac.cli import main  # noqa: E402
from gac.data import tokenize  # noqa: E402
from gac.eval.lm_eval_bridge import lm_eval_perplexity  # noqa: E402

EXCERPT = Path(__file__).resolve().parents[1] / "data" / "britannica_excerpt.txt"
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")


@pytest.fixture(scope="module")
def bos_model_dir(tmp_path_factory) -> Path:
    """A tiny Llama trained briefly on prose, every window starting with BOS, and its BOS tokenizer.

    A few dozen steps make it a language model of sorts (per-character loss ~2.5 nats, down from
    ~5.5), so that which tokens are scored with which context shows in its perplexity; saved for
    HFLM to load.
    """
    import torch
    from transformers import AutoModelForCausalLM

    from gac.testing import char_tokenizer, tiny_config

    torch.manual_seed(0)
    tok = char_tokenizer(bos=True)
    model = AutoModelForCausalLM.from_config(tiny_config("llama"))
    ids = tokenize(tok, EXCERPT.read_text())[1:]
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(60):
        starts = torch.randint(0, ids.numel() - 128, (4,)).tolist()
        batch = torch.stack([torch.cat([torch.tensor([tok.bos_token_id]), ids[i : i + 127]]) for i in starts])
        loss = model(input_ids=batch, labels=batch).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 3.2
    d = tmp_path_factory.mktemp("bos_model")
    model.eval().save_pretrained(d)
    tok.save_pretrained(d)
    return d


def test_tiny_bos_model_agrees_with_lm_eval(tmp_path, bos_model_dir):
    from transformers import AutoTokenizer

    text = EXCERPT.read_text()
    out = tmp_path / "ppl.json"
    args = ["eval", "ppl", str(bos_model_dir), "--dataset", f"text:{EXCERPT}@all", "--seq-len", "256"]
    assert main([*args, "--out", str(out), "--device", "cpu"]) == 0
    ours = json.loads(out.read_text())
    ref = lm_eval_perplexity(str(bos_model_dir), None, text, seq_len=256)
    # the same token stream as lm-eval's HFLM.tok_encode: BOS first, every character after it
    tok = AutoTokenizer.from_pretrained(bos_model_dir)
    ids = tokenize(tok, text)
    assert ids[0].item() == tok.bos_token_id and ids.numel() == ref["n_tokens"] == ours["n_tokens"]
    assert ours["tokens"]["bos"] and ours["tokens"]["prefix_ids"] == [tok.bos_token_id]
    assert ours["split"]["evaluation"]["part"] == "all" and not ours["split"]["overlap"]
    assert ours["ppl"] == pytest.approx(ref["ppl"], rel=5e-3)


def test_tiny_bos_model_short_windows(bos_model_dir):
    """Short windows: more window starts, where lm-eval scores one more token (docs/eval.md)."""
    from gac.eval.ppl import perplexity
    from gac.models import load_model

    lm = load_model(str(bos_model_dir))
    text = EXCERPT.read_text()
    ours = perplexity(lm.model, lm.tokenizer, text, seq_len=128)
    ref = lm_eval_perplexity(lm.model, lm.tokenizer, text, seq_len=128)
    assert ours["tokens"]["bos"] and ours["n_tokens"] == ref["n_tokens"]
    assert ours["ppl"] == pytest.approx(ref["ppl"], rel=5e-3)


@pytest.mark.slow
def test_smollm2_agrees_with_lm_eval(tmp_path):
    """SmolLM2 (no BOS added) on the first ~2k tokens of the Britannica test half, 512-token windows."""
    import math

    from gac.data import load_text, special_tokens
    from gac.eval.ppl import perplexity
    from gac.models import load_model

    lm = load_model("smollm2")
    assert not special_tokens(lm.tokenizer)["bos"]  # SmolLM2's tokenizer adds no BOS
    full = load_text("britannica", "test")
    text = full[: full.index("\n\n", 8000)]
    ours = perplexity(lm.model, lm.tokenizer, text, seq_len=512)
    ref = lm_eval_perplexity(lm.model, lm.tokenizer, text, seq_len=512, batch_size=4)
    print(
        f"SmolLM2, {ours['n_tokens']} tokens, 512-token windows: gac {ours['ppl']:.4f}, lm-eval {ref['ppl']:.4f}"
    )
    assert ours["n_tokens"] == ref["n_tokens"] and math.isfinite(ref["ppl"])
    assert ours["ppl"] == pytest.approx(ref["ppl"], rel=5e-3)
