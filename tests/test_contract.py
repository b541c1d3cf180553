"""The contract every registered compressor meets under every align strategy (table-driven).

For each (compressor, align) on tiny models built in code, whose projections are given a
decaying singular spectrum (as trained weights have):

* the budget is respected: ``none`` fits ``param_ratio``; ``gac``/``gac-latency`` never exceed the
  ``none`` total and ``gac`` leaves less than one cost unit unused;
* alignment is reached: 100% of compressed sites aligned under the profile (round, gac, gac-latency);
* the save/load round trip is exact (identical logits);
* at a high keep ratio the logits stay close to the original model's.
"""

from __future__ import annotations

import copy

import pytest
import torch

from gac import io
from gac.allocation import STRATEGIES
from gac.api import CompressConfig, apply_, plan
from gac.compressors.base import available_compressors
from gac.hardware.profile import OpRule, default_profile
from gac.nn import FactorizedLinear
from gac.nn.latent import LatentAttention
from gac.testing import tiny_model

# Real English prose (not random tokens), tokenized as bytes for the byte-vocab tiny models.
TEXT = (
    "It was the best of times, it was the worst of times, it was the age of wisdom, it was the age of "
    "foolishness, it was the epoch of belief, it was the epoch of incredulity, it was the season of Light, "
    "it was the season of Darkness, it was the spring of hope, it was the winter of despair, we had "
    "everything before us, we had nothing before us, we were all going direct to Heaven, we were all going "
    "direct the other way. In short, the period was so far like the present period, that some of its "
    "noisiest authorities insisted on its being received, for good or for evil, in the superlative degree "
    "of comparison only. There were a king with a large jaw and a queen with a plain face, on the throne of "
    "England; there were a king with a large jaw and a queen with a fair face, on the throne of France. In "
    "both countries it was clearer than crystal to the lords of the State preserves of loaves and fishes, "
    "that things in general were settled for ever."
)
SEQ = 64


def byte_batches(n: int = 8, seq: int = SEQ, batch: int = 4) -> list[torch.Tensor]:
    ids = torch.tensor(list(TEXT.encode("ascii")), dtype=torch.long)
    rows = ids[: n * seq].view(n, seq)
    return list(rows.split(batch))


def spectral_tiny_model(family: str = "llama", seed: int = 0) -> torch.nn.Module:
    """A tiny misaligned model whose projections have exponentially decaying spectra."""
    m = tiny_model(family, seed=seed, vocab=256)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for i, layer in enumerate(m.model.layers):
            for lin in [*layer.self_attn.children(), *layer.mlp.children()]:
                if not isinstance(lin, torch.nn.Linear):
                    continue
                out_f, in_f = lin.weight.shape
                k = min(out_f, in_f)
                q1, _ = torch.linalg.qr(torch.randn(out_f, k, generator=g))
                q2, _ = torch.linalg.qr(torch.randn(in_f, k, generator=g))
                tau = k / (10.0 + 4 * i)
                s = 1.5 * torch.exp(-torch.arange(k) / tau)
                lin.weight.copy_(q1 @ torch.diag(s) @ q2.T)
    return m.eval()


def _profile():
    # Not the hard-coded 8: the low-rank inner dim must be a multiple of 16 under this profile.
    p = default_profile()
    p.ops["lowrank_r"] = OpRule(modulus=16, prefer=16)
    p.id = "test-lowrank16"
    return p


COMPRESSORS = available_compressors()
CASES = [(c, a) for c in COMPRESSORS for a in STRATEGIES]
RATIO = 0.95  # a high keep ratio


@pytest.fixture(scope="module")
def plans():
    """One calibration per compressor, shared by all align strategies (as ``gac demo`` does)."""
    torch.manual_seed(0)
    base = spectral_tiny_model()
    ids = byte_batches()[0][:2]
    with torch.no_grad():
        ref = base(ids).logits
    out = {}
    opts = {"asvd": {"probe_ratios": [0.5, 0.7, 0.9]}}
    for name in COMPRESSORS:
        model = copy.deepcopy(base)
        cfg = CompressConfig(compressor=name, param_ratio=RATIO, align="none", options=opts.get(name, {}))
        out[name] = (model, plan(model, cfg, calib_batches=byte_batches(), profile=_profile()))
    return base, ids, ref, out


def test_every_builtin_compressor_is_in_the_table():
    assert {"svd", "asvd", "svd-llm", "llm-pruner", "palu"} <= set(COMPRESSORS)


@pytest.mark.parametrize(("compressor", "align"), CASES)
def test_contract(plans, tmp_path, compressor, align):
    base, ids, ref, by_name = plans
    model0, p = by_name[compressor]
    prof = p.profile
    model = copy.deepcopy(model0)
    alloc = p.allocation(align)
    report = apply_(model, p, alloc)
    a = report.allocation

    # budget
    assert p.budget == int(RATIO * p.targeted_dense)
    native_total = sum(s.cost(p.native[s.name]) for s in p.sites)
    assert native_total <= p.budget
    assert a["budget"] == native_total
    if align in ("none", "gac", "gac-latency"):
        assert a["cost"] <= a["budget"]
    if align == "gac":
        all_dense = all(s["dense"] for s in a["sites"])
        assert all_dense or a["budget"] - a["cost"] < a["cost_unit"], (
            "gac leaves more than one cost unit unused"
        )
    assert report.targeted_after == a["cost"]
    assert report.model_params_after == sum(q.numel() for q in model.parameters())

    # the model really has the reported dims
    for s in a["sites"]:
        if compressor == "palu":  # one site per (layer, K or V, KV group): a latent rank
            fqn, _, g = s["name"].rpartition(":g")
            attn = model.get_submodule(fqn.rsplit(".", 1)[0])
            assert isinstance(attn, LatentAttention)
            proj = attn.k_proj if fqn.endswith("k_proj") else attn.v_proj
            assert proj.ranks[int(g)] == s["dim"]
            continue
        mod = model.get_submodule(s["name"])
        if compressor == "llm-pruner":  # structured pruning: narrower plain layers, no factors
            assert not any(isinstance(m, FactorizedLinear) for m in mod.modules())
            if s["op"] == "kv_groups":
                assert mod.k_proj.out_features == s["dim"] * mod.head_dim
            else:
                assert mod.gate_proj.out_features == mod.down_proj.in_features == s["dim"]
        elif s["dense"]:
            assert isinstance(mod, torch.nn.Linear)
        else:
            assert isinstance(mod, FactorizedLinear) and mod.rank == s["dim"]

    # alignment
    if align in ("round", "gac", "gac-latency"):
        assert a["pct_aligned"] == 100.0
        for s in a["sites"]:
            assert s["dense"] or prof.is_aligned(s["op"], s["dim"])

    # logits stay close at a high keep ratio
    with torch.no_grad():
        got = model(ids).logits
    rel = ((got - ref).norm() / ref.norm()).item()
    assert rel < 0.05, f"relative logit error {rel:.3f}"

    # exact save/load round trip
    out = io.save(model, tmp_path / "m", {"compressor": compressor, "align": align})
    with torch.no_grad():
        again = io.load(out)(ids).logits
    assert torch.equal(again, got)
