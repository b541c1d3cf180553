"""Exact repair of a deliberately misaligned SmolLM2-135M (slow: the real model)."""

from __future__ import annotations

import copy

import pytest
import torch

from gac.hardware.profile import default_profile
from gac.models import get_adapter, load_model
from gac.surgery.repair import repair_, save_repaired

from .test_repair import BOUND, GEN_TOKENS, factorize_

pytestmark = pytest.mark.slow

KEEP = 1500  # of 1536 MLP channels
RANKS = {"q": 101, "v": 61, "o": 203}  # odd ranks on layers 0-2


def prune_mlp_(model: torch.nn.Module, keep: int = KEEP) -> None:
    """Keep ``keep`` of the MLP channels of every layer (those with the largest down-projection columns)."""
    ad = get_adapter(model)
    with torch.no_grad():
        for i in range(ad.num_layers):
            p = ad.projections(i)
            gate, up, down = (model.get_submodule(p[r]) for r in ("gate", "up", "down"))
            idx = down.weight.norm(dim=0).topk(keep).indices.sort().values
            for lin in (gate, up):
                lin.weight = torch.nn.Parameter(lin.weight.data[idx].contiguous())
                lin.out_features = keep
            down.weight = torch.nn.Parameter(down.weight.data[:, idx].contiguous())
            down.in_features = keep
    model.config.intermediate_size = keep  # every layer alike, so the HF config can say it


def misalign_(model: torch.nn.Module) -> None:
    """Prune the MLPs to 1500 channels and factorize q, v, o of layers 0-2 at odd ranks."""
    prune_mlp_(model)
    ad = get_adapter(model)
    for i in range(3):
        for role, r in RANKS.items():
            factorize_(model, ad.projection(i, role), r)


def britannica_ids(tokenizer, n: int) -> torch.Tensor:
    from gac.data import load_text

    text = load_text("britannica")
    start = text.index("ENCYCLOPAEDIA") if "ENCYCLOPAEDIA" in text else 0
    ids = tokenizer(text[start : start + 20 * n], return_tensors="pt").input_ids[:, :n]
    assert ids.shape[1] == n
    return ids


@pytest.fixture(scope="module")
def smollm2():
    return load_model("smollm2")


def max_diff(a: torch.nn.Module, b: torch.nn.Module, ids: torch.Tensor) -> float:
    with torch.no_grad():
        return (a(ids).logits.double() - b(ids).logits.double()).abs().max().item()


def test_smollm2_pruned_mlp_repair_float32(smollm2) -> None:
    """1500 MLP channels -> 1504: float32 logits within 1e-5 on Britannica text and on random ids."""
    ref = copy.deepcopy(smollm2.model)
    prune_mlp_(ref)
    model = copy.deepcopy(ref)
    report = repair_(model, "minimal", profile=default_profile())
    assert {(c.kind, c.before, c.after) for c in report.changes} == {("intermediate", 1500, 1504)}
    assert report.dims_changed == 30
    text = britannica_ids(smollm2.tokenizer, 256)
    rand = torch.randint(0, 49152, (2, 128), generator=torch.Generator().manual_seed(0))
    diffs = {"britannica": max_diff(ref, model, text), "random": max_diff(ref, model, rand)}
    print(f"smollm2 pruned-MLP repair, float32 max |logit diff|: {diffs}")
    assert max(diffs.values()) <= BOUND, diffs


def test_smollm2_misaligned_repair_is_exact(smollm2, tmp_path) -> None:
    """Pruned MLPs + odd factorized ranks, repaired: exact in float64; in float32 the difference is
    of the size of the model's own float32 rounding error, and greedy text and the saved copy are identical."""
    ref = copy.deepcopy(smollm2.model)
    misalign_(ref)
    model = copy.deepcopy(ref)
    report = repair_(model, "minimal", profile=default_profile())
    got = {(c.kind, c.before, c.after) for c in report.changes}
    assert ("intermediate", 1500, 1504) in got
    assert {("rank", 101, 104), ("rank", 61, 64), ("rank", 203, 208)} <= got
    assert report.dims_changed == 30 + 9
    text = britannica_ids(smollm2.tokenizer, 64)
    rand = torch.randint(0, 49152, (1, 48), generator=torch.Generator().manual_seed(0))
    ref64, model64 = copy.deepcopy(ref).double(), copy.deepcopy(model).double()
    for name, ids in (("britannica", text), ("random", rand)):
        exact = max_diff(ref64, model64, ids)
        d32 = max_diff(ref, model, ids)
        floor = max_diff(ref, ref64, ids)  # float32 rounding error of the unrepaired model itself
        print(
            f"smollm2 full repair [{name}]: float64 {exact:.2e}, float32 {d32:.2e}, float32 noise floor {floor:.2e}"
        )
        assert exact <= 1e-9  # the padding is exact: float64 logits agree (measured: 0.0)
        # float32: only the summation order differs (u's reduction over rank 203 vs 208), amplified
        # by SmolLM2's massive activations; it stays at the size of the model's own float32 error
        assert d32 <= 2 * floor
    del ref64, model64
    kw = dict(max_new_tokens=GEN_TOKENS, min_new_tokens=GEN_TOKENS, do_sample=False)
    prompt = text[:, :32]
    assert torch.equal(ref.generate(prompt, **kw), model.generate(prompt, **kw))
    out = save_repaired(model, tmp_path / "rep", report, tokenizer=smollm2.tokenizer)
    again = load_model(out)
    assert again.source["kind"] == "repaired" and again.tokenizer is not None
    with torch.no_grad():
        assert torch.equal(model(text).logits, again.model(text).logits)


def test_cli_on_smollm2(tmp_path, capsys) -> None:
    from gac.cli import main

    assert (
        main(["analyze", "smollm2", "--out", str(tmp_path / "a.json"), "--plot", str(tmp_path / "a.png")])
        == 0
    )
    assert (tmp_path / "a.json").is_file() and (tmp_path / "a.png").is_file()
    # SmolLM2 itself is aligned: repair is a no-op that says so and writes nothing
    assert main(["repair", "smollm2", "--strategy", "optimal", "--out", str(tmp_path / "r")]) == 0
    err = capsys.readouterr().err
    assert "no-op" in err and not (tmp_path / "r").exists()
