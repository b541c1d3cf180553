"""Family adapters and the dimension inventory / analysis."""

from __future__ import annotations

import pytest
import torch

from gac.errors import GacError
from gac.hardware.profile import default_profile
from gac.models import ROLES, get_adapter
from gac.models.inventory import analyze, inventory, plot_histogram
from gac.nn import FactorizedLinear, replace_module
from gac.testing import FAMILIES, tiny_model


@pytest.mark.parametrize("family", FAMILIES)
def test_adapter_finds_every_projection(family: str) -> None:
    model = tiny_model(family, hidden=120, intermediate=200, heads=5, kv_heads=1, head_dim=24, layers=3)
    ad = get_adapter(model)
    assert ad.family == family and ad.num_layers == 3
    assert (ad.hidden, ad.heads, ad.kv_heads, ad.head_dim, ad.vocab) == (120, 5, 1, 24, 250)
    assert [ad.intermediate(i) for i in range(3)] == [200, 200, 200]
    assert len(ad.all_projections()) == 3 * len(ROLES)
    p = ad.projections(1)
    shapes = {r: tuple(model.get_submodule(f).weight.shape) for r, f in p.items()}
    assert shapes == {
        "q": (120, 120),
        "k": (24, 120),
        "v": (24, 120),
        "o": (120, 120),
        "gate": (200, 120),
        "up": (200, 120),
        "down": (120, 200),
    }
    assert ad.has_qkv_bias == (family == "qwen2") == (model.get_submodule(p["q"]).bias is not None)
    assert len(ad.qk_norm_fqns(0)) == (2 if family == "qwen3" else 0)
    assert len(ad.hidden_norm_fqns()) == 2 * 3 + 1


def test_unsupported_architecture_names_families() -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=50))
    with pytest.raises(
        GacError, match=r"GPT2LMHeadModel: the blocks of transformer.h hold no nn.Linear .*Conv1D"
    ):
        get_adapter(model)


def test_inventory_sees_factorized_and_pruned_layers() -> None:
    model = tiny_model("llama", hidden=128, intermediate=256, heads=4, kv_heads=2, head_dim=32, vocab=256)
    w = model.model.layers[0].self_attn.o_proj.weight.data
    replace_module(
        model, "model.layers.0.self_attn.o_proj", FactorizedLinear.from_factors(w[:, :37], torch.eye(37, 128))
    )
    mlp = model.model.layers[1].mlp  # prune layer 1 to 250 channels
    mlp.gate_proj = torch.nn.Linear(128, 250, bias=False)
    mlp.up_proj = torch.nn.Linear(128, 250, bias=False)
    mlp.down_proj = torch.nn.Linear(250, 128, bias=False)
    dims = inventory(model)
    by = {(d.kind, d.layer): d.value for d in dims}
    assert by[("o.rank", 0)] == 37 and by[("o.in", 0)] == 128 and by[("o.out", 0)] == 128
    assert by[("intermediate", 0)] == 256 and by[("intermediate", 1)] == 250
    assert by[("k.out", 1)] == 64 and by[("head_dim", 0)] == 32
    an = analyze(model, default_profile())
    bad = {(d.kind, d.value) for d in an.misaligned}
    assert bad == {
        ("o.rank", 37),
        ("intermediate", 250),
        ("gate.out", 250),
        ("up.out", 250),
        ("down.in", 250),
    }
    rank = next(d for d in an.dims if d.kind == "o.rank")
    assert rank.op == "lowrank_r" and rank.target == 40
    assert rank.penalty == pytest.approx(1 / 0.25)  # class 1 under the built-in default
    inter = next(d for d in an.dims if d.kind == "intermediate" and d.layer == 1)
    assert inter.penalty == pytest.approx(1 / 0.35)  # 250 = 2 * 125: class 2
    assert an.pct_aligned == pytest.approx(100 * (len(an.judged) - 5) / len(an.judged))
    heads = next(d for d in an.dims if d.kind == "heads")
    assert heads.op is None and heads.aligned is None
    doc = an.to_dict()
    assert doc["n_misaligned"] == 5 and doc["profile"]["id"] == default_profile().id


def test_histogram_png(tmp_path) -> None:
    an = analyze(tiny_model("qwen3", head_dim=24), default_profile())
    out = plot_histogram(an, tmp_path / "sub" / "dims.png", title="t")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_find_layers_skips_lists_of_projections_and_nested_lists() -> None:
    """A PaLU layer holds its per-group up-projections in an ``nn.ModuleList`` of bare projections, and an
    MoE block its experts in a nested list: with more groups (or experts) than layers, either was taken
    for the decoder layers by length alone."""
    from gac.api import CompressConfig, compress_
    from gac.models.adapters import find_layers

    model = tiny_model(
        "llama", layers=2, hidden=96, intermediate=160, heads=8, kv_heads=8, head_dim=12, vocab=128
    )
    ids = [torch.randint(3, 120, (2, 16), generator=torch.Generator().manual_seed(i)) for i in range(3)]
    cfg = CompressConfig(compressor="palu", param_ratio=0.5, align="none", options={"group_size": 1})
    compress_(model, cfg, calib_batches=ids)
    ups = [n for n, m in model.named_modules() if isinstance(m, torch.nn.ModuleList) and len(m) == 8]
    assert ups, "the latent projections' per-group lists"
    assert find_layers(model) == "model.layers"

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.experts = torch.nn.ModuleList(torch.nn.Sequential(torch.nn.Linear(4, 4)) for _ in range(5))

    class Toy(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = torch.nn.ModuleList(Block() for _ in range(3))

    assert find_layers(Toy()) == "layers"
