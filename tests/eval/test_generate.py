"""``gac.generate``: the static-cache decode loop equals transformers' greedy ``generate``."""

from __future__ import annotations

import copy

import pytest
import torch

from gac.api import CompressConfig, compress_
from gac.errors import GacError
from gac.eval.generate import generate
from gac.testing import char_tokenizer, tiny_model


def _reference(model, tok, prompt, n):
    ids = tok(prompt, return_tensors="pt")["input_ids"]
    out = model.generate(ids, max_new_tokens=n, do_sample=False, min_new_tokens=n)
    return out[0, ids.shape[1] :].tolist()


@pytest.mark.parametrize("compressor", [None, "svd", "palu"])
def test_generate_equals_greedy_generate(compressor):
    tok = char_tokenizer()
    m = tiny_model("llama", hidden=96, layers=2, heads=4, kv_heads=2, head_dim=24, vocab=128)
    if compressor:
        g = torch.Generator().manual_seed(1)
        batches = [torch.randint(3, 98, (2, 32), generator=g) for _ in range(4)]
        opts = {"group_size": 1} if compressor == "palu" else {}
        compress_(
            m,
            CompressConfig(compressor=compressor, param_ratio=0.6, align="gac", options=opts),
            calib_batches=batches,
        )
    prompt = "It was the best of times"
    got = generate(m, tok, prompt, max_new_tokens=12, stop_at_eos=False)
    assert got.token_ids == _reference(m, tok, prompt, 12)
    assert got.new_tokens == 12 and got.prompt_tokens == len(prompt)
    assert got.ttft_s > 0 and got.tokens_per_s > 0 and not got.compiled and not got.graphs
    assert got.first_prefill_s >= 0 and got.setup_s >= 0 and got.decode_setup_s == 0.0
    # the cache of one token, all layers: 2 layers x (K + V) x 2 KV heads x 24 x 4 bytes when dense
    kv = got.kv_bytes_per_token
    assert kv["dense"] == 2 * 2 * 2 * 24 * 4
    assert (kv["cache"] < kv["dense"]) == (compressor == "palu")
    assert got.paths["latent_attention"] == (2 if compressor == "palu" else 0)
    assert set(got.paths["kernels"]) == {"gemv", "fused_lowrank", "branches"}


def test_generate_passes_the_cache_under_the_installed_transformers_name(recwarn):
    """No deprecation warning for ``past_key_values`` (transformers >= 5.24 calls it ``cache``)."""
    import inspect
    import logging

    tok = char_tokenizer()
    m = tiny_model("llama", hidden=96, layers=1, heads=4, kv_heads=2, head_dim=24, vocab=128)
    from gac.compat import cache_arg

    renamed = "cache" in inspect.signature(m.forward).parameters
    assert list(cache_arg(m, None)) == (["cache"] if renamed else ["past_key_values"])
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record)

    h = Keep()
    logging.getLogger("transformers").addHandler(h)
    try:
        generate(m, tok, "Hello", max_new_tokens=3, stop_at_eos=False)
    finally:
        logging.getLogger("transformers").removeHandler(h)
    said = [str(w.message) for w in recwarn] + [r.getMessage() for r in records]
    assert not [w for w in said if "past_key_values" in w], said


def test_compile_on_cpu_falls_back_with_a_notice(capsys):
    tok = char_tokenizer()
    m = tiny_model("llama", hidden=96, layers=1, heads=4, kv_heads=2, head_dim=24, vocab=128)
    got = generate(
        copy.deepcopy(m), tok, "Hello", max_new_tokens=3, compile=True, graphs=True, stop_at_eos=False
    )
    assert not got.compiled and not got.graphs
    cap = capsys.readouterr()
    assert "need CUDA" in cap.err + cap.out


def test_bad_input():
    tok = char_tokenizer()
    m = tiny_model("llama", hidden=96, layers=1, heads=4, kv_heads=2, head_dim=24, vocab=128)
    with pytest.raises(GacError, match="max_new_tokens must be at least 1"):
        generate(m, tok, "Hello", max_new_tokens=0)
    with pytest.raises(GacError, match="empty"):
        generate(m, tok, "", max_new_tokens=2)
    with pytest.raises(GacError, match="tokenizer"):
        generate(m, None, "Hello")


@pytest.mark.slow
def test_gac_generate_cli_on_the_embedded_model_with_every_kernel_flag():
    """`gac generate smollm2 ... --json` with the fast-path flags off equals the API's greedy tokens."""
    import json

    from typer.testing import CliRunner

    from gac.cli import app
    from gac.models import load_model

    prompt = "The Encyclopaedia Britannica is"
    flags = [
        "--no-fused-lowrank",
        "--no-branches",
        "--no-combo-kernels",
        "--no-gemv",
        "--no-gqa-decode",
        "--no-compile",
        "--no-graphs",
    ]
    r = CliRunner().invoke(app, ["generate", "smollm2", "--prompt", prompt, "-n", "4", "--json", *flags])
    assert r.exit_code == 0, r.output
    got = json.loads(r.stdout[r.stdout.index("{") :])
    lm = load_model("smollm2")
    want = generate(lm.model, lm.tokenizer, prompt, max_new_tokens=4, stop_at_eos=False)
    assert got["model"] == "smollm2" and got["new_tokens"] == 4
    assert got["token_ids"] == want.token_ids


@pytest.mark.gpu
@pytest.mark.parametrize("combo_kernels", [True, False])
def test_fast_path_on_gpu_generates_the_eager_greedy_tokens(combo_kernels):
    """On CUDA the default path (compiled step, CUDA graph, decode kernels) gives transformers' greedy tokens."""
    tok = char_tokenizer()
    torch.manual_seed(0)
    m = tiny_model("llama", hidden=96, layers=2, heads=4, kv_heads=2, head_dim=24, vocab=128).to("cuda")
    prompt = "It was the best of times"
    want = _reference(m, _CudaTok(tok), prompt, 12)
    got = generate(m, tok, prompt, max_new_tokens=12, stop_at_eos=False, combo_kernels=combo_kernels)
    assert got.compiled and got.graphs
    assert got.token_ids == want


@pytest.mark.gpu
@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])  # plain, biased q/k/v, per-head q/k norm
def test_fast_path_on_gpu_serves_each_family_exactly(family):
    """Fused projections (with their biases), decode kernels, compiled step and graph give the eager tokens."""
    tok = char_tokenizer()
    torch.manual_seed(0)
    m = tiny_model(family, hidden=96, layers=2, heads=4, kv_heads=2, head_dim=24, vocab=128).to("cuda")
    prompt = "It was the best of times"
    want = _reference(m, _CudaTok(tok), prompt, 12)
    got = generate(m, tok, prompt, max_new_tokens=12, stop_at_eos=False)
    assert got.compiled and got.graphs
    assert got.token_ids == want


class _CudaTok:
    """A tokenizer whose ``input_ids`` are on the GPU (for ``_reference``)."""

    def __init__(self, tok):
        self.tok = tok

    def __call__(self, text, return_tensors="pt"):
        return {"input_ids": self.tok(text, return_tensors=return_tensors)["input_ids"].to("cuda")}
