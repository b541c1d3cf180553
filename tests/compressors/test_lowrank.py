"""SVD-family compressors: loss-curve identities, exact folding, allocations, fallbacks."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from gac.compressors.asvd import SuffixRunner, sensitivity_curve, threshold_allocation
from gac.compressors.base import available_compressors, get_compressor
from gac.compressors.lowrank import ratio_rank, uniform_ratio_dims
from gac.compressors.svdllm import whitening_factor
from gac.errors import GacError
from gac.nn import FactorizedLinear
from gac.testing import tiny_model

COMPRESSORS = ("svd", "asvd", "svd-llm")


def _batches(n: int = 3, b: int = 2, t: int = 48, vocab: int = 250, seed: int = 1) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (b, t), generator=g) for _ in range(n)]


def _prepared(name: str, family: str = "llama", **opts):
    model = tiny_model(family)
    c = get_compressor(name, **opts)
    sites = c.sites(model)
    c.calibrate(model, _batches())
    return model, c, sites


def test_registry_lists_builtins_and_rejects_unknown():
    assert set(COMPRESSORS) <= set(available_compressors())
    with pytest.raises(GacError, match="unknown compressor 'nope'"):
        get_compressor("nope")


def test_sites_are_the_seven_projections_per_layer():
    model = tiny_model("qwen2")
    sites = get_compressor("svd").sites(model)
    assert len(sites) == 2 * 7
    roles = [s.meta["role"] for s in sites[:7]]
    assert roles == ["q", "k", "v", "o", "gate", "up", "down"]
    q = sites[0]
    assert q.shape == (120, 120) and q.fixed_cost == 120  # qwen2 q carries a bias
    assert q.cost(q.max_dim) == q.dense_cost == 120 * 120 + 120


def test_svd_loss_curve_is_truncation_error():
    model, c, sites = _prepared("svd")
    for site in (sites[0], sites[6]):
        lin = model.get_submodule(site.name)
        curve = c.loss_curve(site)
        assert curve.shape == (site.max_dim + 1,) and curve[-1] == 0.0
        assert np.all(np.diff(curve) <= 1e-12)
        for d in (1, site.max_dim // 3, site.max_dim - 1):
            err = (lin.weight.double() - c.factorize(site, lin, d).weight.double()).pow(2).sum().item()
            assert err == pytest.approx(curve[d], rel=1e-5)


def test_svdllm_loss_curve_is_output_error_on_calibration_data():
    model = tiny_model("llama")
    c = get_compressor("svd-llm")
    sites = c.sites(model)
    batches = _batches(n=4, b=2, t=64)  # 512 tokens > 200 inputs: positive-definite Grams
    xs: dict[str, list[torch.Tensor]] = {}
    picked = [sites[1], sites[3], sites[6]]  # k (shares q's Gram), o, down
    hooks = [
        model.get_submodule(s.name).register_forward_hook(
            lambda m, a, o, n=s.name: xs.setdefault(n, []).append(a[0].detach().reshape(-1, a[0].shape[-1]))
        )
        for s in picked
    ]
    c.calibrate(model, batches)
    for h in hooks:
        h.remove()
    for site in picked:
        x = torch.cat(xs[site.name]).double()
        lin = model.get_submodule(site.name)
        curve = c.loss_curve(site)
        assert c.whitening(site)[1] == 0.0  # no jitter: the identity is exact
        for d in (2, site.max_dim // 2, site.max_dim - 1):
            dw = lin.weight.double() - c.factorize(site, lin, d).weight.double()
            err = (x @ dw.T).pow(2).sum().item() / x.shape[0]
            assert err == pytest.approx(curve[d], rel=1e-4)


def test_asvd_folding_is_exact_at_full_rank():
    model, c, sites = _prepared("asvd")
    for site in (sites[0], sites[5], sites[6]):
        lin = model.get_submodule(site.name)
        u, s, vh, sc = c.decompose(site, lin)
        assert "diag" in sc and not torch.allclose(sc["diag"], torch.ones_like(sc["diag"]))
        a, b = c.factors(u, s, vh, sc, min(site.shape))
        torch.testing.assert_close(a @ b, lin.weight.double(), rtol=0, atol=1e-10)


@pytest.mark.parametrize("name", COMPRESSORS)
def test_exact_on_low_rank_weights(name):
    """Projections of true rank 6, kept at rank 12: the compressed model equals the original."""
    model = tiny_model("llama")
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for n, mod in model.named_modules():
            if n.startswith("model.layers.") and isinstance(mod, torch.nn.Linear):
                o, i = mod.weight.shape
                mod.weight.copy_(torch.randn(o, 6, generator=g) @ torch.randn(6, i, generator=g) / 8)
    x = torch.randint(0, 250, (2, 40), generator=g)
    ref = model(x).logits
    c = get_compressor(name)
    sites = c.sites(model)
    c.calibrate(model, _batches())
    c.apply(model, sites, {s.name: 12 for s in sites})
    assert all(isinstance(model.get_submodule(s.name), FactorizedLinear) for s in sites)
    torch.testing.assert_close(model(x).logits, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", COMPRESSORS)
def test_apply_keeps_dense_at_max_dim_and_dtype(name):
    model = tiny_model("qwen2", dtype=torch.bfloat16)
    c = get_compressor(name)
    sites = c.sites(model)
    c.calibrate(model, _batches())
    dims = {s.name: (s.max_dim if s.meta["role"] == "v" else 7) for s in sites}
    c.apply(model, sites, dims)
    v = model.get_submodule(sites[2].name)
    q = model.get_submodule(sites[0].name)
    assert type(v) is torch.nn.Linear
    assert isinstance(q, FactorizedLinear) and q.rank == 7 and q.u.weight.dtype == torch.bfloat16
    assert q.bias is not None  # qwen2 q bias kept
    assert torch.isfinite(model(torch.randint(0, 250, (1, 16))).logits).all()
    with pytest.raises(GacError, match="outside"):
        get_compressor("svd").apply(tiny_model(), sites[:1], {sites[0].name: 0})


@pytest.mark.parametrize("ratio", [0.3, 0.7, 0.9])
def test_uniform_native_allocation_fits_budget_and_is_maximal(ratio):
    sites = get_compressor("svd").sites(tiny_model("llama", layers=3))
    budget = int(ratio * sum(s.dense_cost for s in sites))
    dims = uniform_ratio_dims(sites, budget)
    cost = sum(s.cost(dims[s.name]) for s in sites)
    assert cost <= budget
    # one uniform ratio: every site's rank is ratio_rank at a common r
    bump = {s.name: min(dims[s.name] + 1, s.max_dim) for s in sites}
    assert sum(s.cost(bump[s.name]) for s in sites) > budget or bump == dims
    with pytest.raises(GacError, match="cannot be met"):
        uniform_ratio_dims(sites, 10)


def test_singular_gram_falls_back_and_never_crashes(caplog):
    x = torch.randn(10, 50, dtype=torch.float64)  # 10 tokens, 50 channels: rank 10
    with caplog.at_level(logging.WARNING):
        chol, lam = whitening_factor(x.T @ x, "site")
    assert chol is not None and lam > 0 and "not positive-definite" in caplog.text
    torch.testing.assert_close(chol @ chol.T, x.T @ x + lam * torch.eye(50, dtype=torch.float64))
    chol, lam = whitening_factor(torch.zeros(5, 5), "dead")
    assert chol is None
    # end to end: 8 calibration tokens against 200 down_proj inputs
    model = tiny_model("llama")
    c = get_compressor("svd-llm")
    sites = c.sites(model)
    c.calibrate(model, [torch.randint(0, 250, (1, 8))])
    c.apply(model, sites, uniform_ratio_dims(sites, int(0.6 * sum(s.dense_cost for s in sites))))
    assert torch.isfinite(model(torch.randint(0, 250, (1, 16))).logits).all()
    assert c.options()["fallback_groups"]


def test_suffix_runner_matches_full_forward():
    model = tiny_model("mistral", layers=3)
    runner = SuffixRunner(model, _batches(n=2))
    assert runner.layers is not None  # the shortcut was verified and kept
    with torch.no_grad():
        model.model.layers[1].mlp.up_proj.weight.mul_(0.5)
    full = runner._full()
    assert runner.nll(1) == pytest.approx(full, rel=1e-5)
    assert runner.nll(1) != pytest.approx(runner.base_nll, rel=1e-5)


def test_asvd_sensitivity_allocation_meets_budget_and_curve_is_monotone():
    model, c, sites = _prepared("asvd", probe_ratios=(0.2, 0.5, 0.8))
    budget = int(0.75 * sum(s.dense_cost for s in sites))
    dims = c.native_allocation(model, sites, budget)
    cost = sum(s.cost(dims[s.name]) for s in sites)
    assert cost <= budget
    allowed = {s.name: {ratio_rank(s, r) for r in (0.2, 0.5, 0.8)} | {s.max_dim} for s in sites}
    assert all(dims[n] in allowed[n] for n in dims)
    for s in sites:
        curve = c.loss_curve(s)
        assert curve.shape == (s.max_dim + 1,) and curve[-1] == 0 and np.all(np.diff(curve) <= 1e-12)
    with pytest.raises(GacError, match="cannot be met"):
        c.native_allocation(model, sites, int(0.05 * sum(s.dense_cost for s in sites)))


def test_threshold_allocation_loosest_threshold():
    sites = get_compressor("svd").sites(tiny_model("llama", layers=1))[:2]
    a, b = sites
    sens = {a.name: {0.5: 10.0, 0.8: 5.0}, b.name: {0.5: 20.0, 0.8: 6.0}}
    total = a.dense_cost + b.dense_cost
    # budget allows compressing both at 0.8 (thresholds 5 and 6) but not a at 0.5 too
    budget = a.cost(ratio_rank(a, 0.8)) + b.cost(ratio_rank(b, 0.8))
    assert threshold_allocation(sites, sens, budget) == {
        a.name: ratio_rank(a, 0.8),
        b.name: ratio_rank(b, 0.8),
    }
    assert threshold_allocation(sites, sens, total) == {a.name: a.max_dim, b.name: b.max_dim}


def test_sensitivity_curve_interpolates_probes():
    site = get_compressor("svd").sites(tiny_model("llama", layers=1))[0]
    probes = {0.5: 12.0, 0.8: 11.0}
    curve = sensitivity_curve(site, probes, base_ppl=10.0)
    d5, d8 = ratio_rank(site, 0.5), ratio_rank(site, 0.8)
    assert curve[d5] == pytest.approx(2.0) and curve[d8] == pytest.approx(1.0) and curve[-1] == 0
    assert curve[0] > curve[d5]  # extrapolated below the smallest probe


def test_sensitivity_curve_pools_noisy_probes_instead_of_clamping():
    """A probe above a deeper cut, and one below the dense ppl, are averaged with their neighbours."""
    site = get_compressor("svd").sites(tiny_model("llama", layers=1))[0]
    # ppl increase at ratios 0.4, 0.6, 0.8: 3.0, 1.0, 2.0 (0.8 noisier than 0.6), 0.9 below base.
    probes = {0.4: 13.0, 0.6: 11.0, 0.8: 12.0, 0.9: 9.0}
    curve = sensitivity_curve(site, probes, base_ppl=10.0)
    d4, d6, d8, d9 = (ratio_rank(site, r) for r in (0.4, 0.6, 0.8, 0.9))
    # isotonic fit of [3, 1, 2, -1, 0 (dense)]: 3, then the pool (1 + 2) / 2 = 1.5, then the pool
    # of (-1, 0) = -0.5, floored at 0 only after fitting
    assert curve[d4] == pytest.approx(3.0)
    assert curve[d6] == pytest.approx(1.5) and curve[d8] == pytest.approx(1.5)
    assert curve[d9] == pytest.approx(0.0) and curve[site.max_dim] == 0.0
    assert np.all(np.diff(curve) <= 1e-12)
