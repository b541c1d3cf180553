"""Evaluation over several devices with accelerate's device_map (CPU memory + disk offload here)."""

from __future__ import annotations

import copy

import pytest
import torch

from gac.api import CompressConfig, compress_
from gac.errors import GacError
from gac.eval.dispatch import dispatch_, parse_max_memory
from gac.testing import tiny_model


@pytest.mark.parametrize("compressor", [None, "svd-llm", "palu"])
def test_split_over_cpu_and_disk_gives_the_same_logits(tmp_path, compressor):
    m = tiny_model("llama", layers=4, hidden=96, heads=4, kv_heads=2, head_dim=24)
    if compressor:
        g = torch.Generator().manual_seed(1)
        batches = [torch.randint(3, 240, (2, 24), generator=g) for _ in range(3)]
        opts = {"group_size": 1} if compressor == "palu" else {}
        compress_(
            m,
            CompressConfig(compressor=compressor, param_ratio=0.6, align="gac", options=opts),
            calib_batches=batches,
        )
    ids = torch.randint(3, 240, (2, 16), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref = m(ids).logits
    layer = sum(p.numel() * p.element_size() for p in m.model.layers[0].parameters())
    d = copy.deepcopy(m)
    dmap = dispatch_(d, {"cpu": f"{(3 * layer) // 1024}KiB", "disk": "1GiB"}, offload_dir=tmp_path)
    assert "disk" in dmap.values() and "cpu" in dmap.values()
    with torch.no_grad():
        got = d(ids).logits
    assert torch.allclose(got, ref, atol=1e-5, rtol=0)
    if compressor == "palu":  # offloaded up-projections are called, one GEMM a group, and that is recorded
        from gac.nn.latent import latent_attention_paths

        why = latent_attention_paths(d)["prompt_rebuild_per_group"]
        assert why == [
            "an up-projection's forward is wrapped (accelerate's hooks: offloaded or dispatched weights)"
        ]
        assert "prompt_rebuild_per_group" not in latent_attention_paths(m)


def test_bad_max_memory():
    with pytest.raises(GacError, match="DEVICE=SIZE"):
        parse_max_memory("20GiB")
    with pytest.raises(GacError, match="not a size"):
        parse_max_memory("0=lots")
    with pytest.raises(GacError, match="not a GPU index"):
        parse_max_memory("tpu=1GiB")
    m = tiny_model("llama", layers=2)
    if not torch.cuda.is_available():
        with pytest.raises(GacError, match="has 0 GPU"):
            dispatch_(m, {0: "1GiB", "cpu": "1GiB"})
    with pytest.raises(GacError, match="offload folder"):
        dispatch_(m, {"cpu": "1KiB", "disk": "1GiB"})
