"""``import gac`` registers gac directories with transformers' Auto classes (no remote code, no pickle)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import torch

from gac import io
from gac.api import CompressConfig, compress_, gac_config_for_save
from gac.testing import tiny_model


def _batches():
    g = torch.Generator().manual_seed(1)
    return [torch.randint(3, 240, (2, 32), generator=g) for _ in range(4)]


CASES = {
    "llama-svd": ("llama", dict(compressor="svd", param_ratio=0.7, align="none")),
    "phi3-svd-llm": ("phi3", dict(compressor="svd-llm", param_ratio=0.8, align="gac")),
    "llama-palu": (
        "llama",
        dict(compressor="palu", param_ratio=0.5, align="gac", options={"group_size": 1}),
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_auto_model_after_import_gac_equals_gac_load(tmp_path, case):
    family, cfg = CASES[case]
    m = tiny_model(family, hidden=96, layers=2, heads=4, kv_heads=2, head_dim=24)
    rep = compress_(m, CompressConfig(**cfg), calib_batches=_batches())
    out = io.save(m, tmp_path / "m", gac_config_for_save(rep))
    doc = json.loads((out / "config.json").read_text())
    assert doc["model_type"] == "gac" and doc["gac_base"]["model_type"] == family
    ids = torch.randint(3, 240, (1, 12), generator=torch.Generator().manual_seed(5))
    torch.save(ids, tmp_path / "ids.pt")
    with torch.no_grad():
        ref = io.load(out)(ids).logits
    torch.save(ref, tmp_path / "ref.pt")
    code = textwrap.dedent(
        f"""
        import torch
        import gac  # registers the gac architecture
        from transformers import AutoConfig, AutoModelForCausalLM
        assert type(AutoConfig.from_pretrained({str(out)!r})).__name__ == "GacConfig"
        m = AutoModelForCausalLM.from_pretrained({str(out)!r})
        ids = torch.load({str(tmp_path / "ids.pt")!r})
        with torch.no_grad():
            got = m(ids).logits
        ref = torch.load({str(tmp_path / "ref.pt")!r})
        print("maxdiff", (got - ref).abs().max().item())
        assert torch.allclose(got, ref, atol=1e-5, rtol=0)
        """
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    # without ``import gac`` transformers refuses the directory instead of loading it wrong
    plain = f"from transformers import AutoModelForCausalLM as A; A.from_pretrained({str(out)!r})"
    r = subprocess.run([sys.executable, "-c", plain], capture_output=True, text=True, timeout=300)
    assert r.returncode != 0 and "gac" in r.stderr
