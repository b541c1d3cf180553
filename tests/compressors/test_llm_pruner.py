"""llm-pruner: dependency groups, Taylor importance, native allocation, align strategies, artefacts."""

from __future__ import annotations

import copy
import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from gac import io
from gac.allocation import STRATEGIES
from gac.api import CompressConfig, apply_, plan
from gac.compressors.llm_pruner import default_layer_range
from gac.errors import GacError
from gac.hardware.profile import default_profile
from gac.testing import tiny_model

IDS = torch.randint(0, 250, (2, 24), generator=torch.Generator().manual_seed(0))


def _model(layers: int = 3):
    # 6 query heads over 3 KV heads (n_rep 2), head_dim 20, MLP 200: misaligned on purpose
    return tiny_model(heads=6, kv_heads=3, head_dim=20, layers=layers)


def _compress(model, ratio=0.8, align="none", **opts):
    cfg = CompressConfig(compressor="llm-pruner", param_ratio=ratio, align=align, options=opts)
    p = plan(model, cfg, calib_batches=[IDS], profile=default_profile())
    return p, apply_(model, p)


def test_default_layer_range_scales_the_reference():
    assert default_layer_range(32) == (4, 30)
    assert default_layer_range(30) == (4, 28)


@pytest.mark.parametrize("align", STRATEGIES)
def test_every_align_meets_budget_and_keeps_gqa(align):
    m = _model()
    p, r = _compress(m, 0.7, align, layer_start=0, layer_end=3)
    assert r.targeted_after <= p.budget
    assert r.model_params_after == sum(t.numel() for t in m.parameters())
    for i in range(3):
        a = m.model.layers[i].self_attn
        q, k, v, o = a.q_proj, a.k_proj, a.v_proj, a.o_proj
        assert a.head_dim == 20
        assert k.out_features == v.out_features and k.out_features % 20 == 0
        assert q.out_features == 2 * k.out_features == o.in_features
        mlp = m.model.layers[i].mlp
        assert mlp.gate_proj.out_features == mlp.up_proj.out_features == mlp.down_proj.in_features
    if align in ("gac", "gac-latency"):
        assert r.pct_aligned == 100.0
        assert all(m.model.layers[i].mlp.gate_proj.out_features % 8 == 0 for i in range(3))
    with torch.no_grad():
        assert torch.isfinite(m(IDS).logits).all()


def test_zero_channel_is_pruned_first_and_exactly():
    """A dead MLP channel has zero Taylor importance: removing it leaves the logits unchanged."""
    m = _model(layers=1)
    with torch.no_grad():
        m.model.layers[0].mlp.down_proj.weight[:, 7] = 0
        m.model.layers[0].mlp.gate_proj.weight[7] = 0
        m.model.layers[0].mlp.up_proj.weight[7] = 0
        ref = m(IDS).logits
    cfg = CompressConfig(compressor="llm-pruner", param_ratio=0.99, align="none", options={"layer_end": 1})
    p = plan(m, cfg, calib_batches=[IDS], profile=default_profile())
    site = next(s for s in p.sites if s.name.endswith("mlp"))
    curve = p.compressor.loss_curve(site)
    assert curve[-1] == 0 and curve[-2] == 0 and np.all(np.diff(curve) <= 0)
    dims = {s.name: s.max_dim for s in p.sites}
    dims[site.name] = site.max_dim - 1
    p.compressor.apply(m, p.sites, dims)
    assert m.model.layers[0].mlp.gate_proj.out_features == 199
    with torch.no_grad():
        torch.testing.assert_close(m(IDS).logits, ref, rtol=0, atol=1e-5)


@pytest.mark.parametrize("importance", ["param_first", "vectorize"])
@pytest.mark.parametrize("reduction", ["sum", "mean", "max"])
def test_importance_options(importance, reduction):
    m = _model(layers=2)
    p, r = _compress(m, 0.8, "none", importance=importance, reduction=reduction, layer_end=2)
    assert r.compressor_options["importance"] == importance
    assert r.targeted_after <= p.budget


def test_global_pruning_varies_per_layer():
    m = _model()
    p, r = _compress(m, 0.75, "none", global_pruning=True, layer_start=0, layer_end=3)
    assert r.targeted_after <= p.budget
    assert len({d for k, d in p.native.items() if k.endswith("mlp")}) > 1


def test_nonuniform_roundtrip_with_gac_load(tmp_path):
    m = _model()
    _compress(m, 0.8, "gac")  # default range [0, 3) of 3 layers? scaled -> uses some layers
    with torch.no_grad():
        ref = m(IDS).logits
    io.save(m, tmp_path / "m", {"compressor": "llm-pruner"})
    cfg = json.loads((tmp_path / "m" / "gac_config.json").read_text())
    assert len(cfg["pruned_widths"]) == 3
    back = io.load(tmp_path / "m")
    with torch.no_grad():
        torch.testing.assert_close(back(IDS).logits, ref, rtol=0, atol=0)


def test_uniform_pruned_loads_with_plain_transformers(tmp_path):
    m = _model(layers=2)
    _compress(m, 0.7, "round", layer_start=0, layer_end=2)  # round keeps one width per layer
    with torch.no_grad():
        ref = m(IDS).logits
    io.save(m, tmp_path / "m", {"compressor": "llm-pruner"})
    cfg = json.loads((tmp_path / "m" / "gac_config.json").read_text())
    assert cfg["pruned_uniform"] and cfg["pruned_widths"][0] == cfg["pruned_widths"][1]
    torch.save(IDS, tmp_path / "ids.pt")
    code = (
        "import sys, torch\n"
        "from transformers import AutoModelForCausalLM\n"
        f"m = AutoModelForCausalLM.from_pretrained({str(tmp_path / 'm')!r}).eval()\n"
        "assert 'gac' not in sys.modules\n"
        f"ids = torch.load({str(tmp_path / 'ids.pt')!r})\n"
        "with torch.no_grad(): torch.save(m(ids).logits, sys.argv[1])\n"
    )
    out = tmp_path / "logits.pt"
    subprocess.run(
        [sys.executable, "-c", code, str(out)], check=True, env={"OMP_NUM_THREADS": "1", "PATH": ""}
    )
    torch.testing.assert_close(torch.load(out), ref, rtol=0, atol=1e-5)


def test_bad_layer_range():
    with pytest.raises(GacError, match="layer range"):
        _compress(_model(), 0.8, "none", layer_start=2, layer_end=9)


def test_ratio_removing_everything():
    with pytest.raises(GacError):
        _compress(_model(), 0.01, "none", layer_start=0, layer_end=3)


def test_no_gradient_path():
    bad = copy.deepcopy(_model())
    bad.model.layers[1].mlp.gate_proj.weight = torch.nn.Parameter(
        bad.model.layers[1].mlp.gate_proj.weight.data.to(torch.int8), requires_grad=False
    )
    with pytest.raises(GacError, match="gradient path"):
        _compress(bad, 0.8, "none", layer_start=0, layer_end=3)


def test_lora_recovery_merges_and_keeps_shapes(tmp_path):
    pytest.importorskip("peft")
    from gac.recovery import recover_lora_

    m = _model()
    _compress(m, 0.8, "gac", layer_start=0, layer_end=3)
    shapes = {n: tuple(p.shape) for n, p in m.named_parameters()}
    before = m.model.layers[0].mlp.down_proj.weight.clone()
    info = recover_lora_(m, [IDS], steps=4, rank=4, lr=1e-2)
    assert {n: tuple(p.shape) for n, p in m.named_parameters()} == shapes  # merged: no peft modules left
    assert not torch.equal(m.model.layers[0].mlp.down_proj.weight, before)
    assert info["loss_last"] < info["loss_first"]
    io.save(m, tmp_path / "m", {"compressor": "llm-pruner"})
    with torch.no_grad():
        torch.testing.assert_close(io.load(tmp_path / "m")(IDS).logits, m(IDS).logits, rtol=0, atol=0)


def test_lora_recovery_without_peft(monkeypatch):
    import builtins

    real = builtins.__import__

    def fake(name, *a, **k):
        if name == "peft" or name.startswith("peft."):
            raise ImportError(name)
        return real(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", fake)
    from gac.recovery import recover_lora_

    with pytest.raises(GacError, match="peft"):
        recover_lora_(_model(), [IDS])
