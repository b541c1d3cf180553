"""SmolLM2-135M on CPU: a tiny inference grid, fused exactly, and the local lm-eval task (slow tier)."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smollm2():
    from gac.models import load_model

    return load_model("smollm2", dtype=torch.float32, device="cpu")


def test_smollm2_tiny_grid_dense_and_fused(smollm2):
    from gac.eval.infer import SweepConfig, sweep_model
    from gac.nn.fused import fuse_projections_, unfuse_projections_

    m = smollm2.model
    cfg = SweepConfig(prefill_batches=(1,), prefill_seqs=(32, 64), decode_batches=(1, 2), decode_kv=(32,),
                      prefill_reps=2, decode_warmup=1, decode_reps=3)  # fmt: skip
    dense = sweep_model(m, cfg)
    assert dense["params"] == sum(p.numel() for p in m.parameters())
    assert all(r["status"] == "ok" for r in dense["prefill"] + dense["decode"])
    ids = torch.randint(0, 49152, (1, 16))
    with torch.no_grad():
        ref = m(ids).logits
        assert len(fuse_projections_(m)) == 60  # 30 layers x (qkv, gate/up)
        fused = sweep_model(m, cfg)
        torch.testing.assert_close(m(ids).logits, ref, rtol=1e-4, atol=1e-4)
    assert all(r["status"] == "ok" for r in fused["decode"])
    unfuse_projections_(m)


def test_smollm2_local_task(smollm2, tmp_path):
    pytest.importorskip("lm_eval")
    from pathlib import Path

    from gac.eval.lm_eval_bridge import run_lm_eval

    data = Path(__file__).resolve().parents[1] / "data" / "lm_eval"
    (tmp_path / "gac_tiny_mc.yaml").write_text(
        (data / "gac_tiny_mc.yaml.in").read_text().replace("{DATA}", str(data / "gac_tiny_mc.jsonl"))
    )
    res = run_lm_eval(smollm2.model, smollm2.tokenizer, ["gac_tiny_mc"], include_path=tmp_path)
    t = res["tasks"]["gac_tiny_mc"]
    assert t["n_samples"] == 12
    assert t["value"] >= 0.5  # at least chance on two choices; SmolLM2-135M scored 7/12 (acc_norm) here
