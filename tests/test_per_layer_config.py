"""Per-layer pruned widths deploy through transformers' standard ``per_layer_config``.

A tiny Llama pruned by LLM-Pruner to widths that vary by layer is saved; a fresh process without
gac reads each layer's values with plain ``AutoConfig`` (transformers >= 5.24), and with
``import gac`` ``AutoModelForCausalLM`` gives the logits of ``gac.load``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import torch
import transformers

from gac import io
from gac.api import CompressConfig, apply_, plan
from gac.errors import GacError
from gac.hardware.profile import default_profile
from gac.testing import tiny_model

IDS = torch.randint(0, 250, (2, 24), generator=torch.Generator().manual_seed(0))
HAS_PER_LAYER = hasattr(transformers.PretrainedConfig, "per_layer_config")


@pytest.fixture(scope="module")
def pruned_dir(tmp_path_factory):
    """3 layers, 6 query heads over 3 KV heads of 20, MLP 200; global pruning to 60%."""
    m = tiny_model(heads=6, kv_heads=3, head_dim=20, layers=3)
    opts = {"global_pruning": True, "layer_start": 0, "layer_end": 3}
    cfg = CompressConfig(compressor="llm-pruner", param_ratio=0.6, align="none", options=opts)
    apply_(m, plan(m, cfg, calib_batches=[IDS], profile=default_profile()))
    widths = io.pruned_widths(m)
    assert len({tuple(w.values()) for w in widths}) > 1, widths  # the case under test: non-uniform
    out = io.save(m, tmp_path_factory.mktemp("per_layer") / "m", {"compressor": "llm-pruner"})
    with torch.no_grad():
        ref = m(IDS).logits
    return out, widths, ref


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300
    )


def test_config_json_is_the_base_config_with_per_layer_config(pruned_dir):
    out, widths, ref = pruned_dir
    doc = json.loads((out / "config.json").read_text())
    assert doc["model_type"] == "llama" and doc["head_dim"] == 20
    per = {int(k): v for k, v in doc["per_layer_config"].items()}
    assert sorted(per) == [0, 1, 2]
    for i, w in enumerate(widths):
        assert per[i] == {
            "intermediate_size": w["intermediate"],
            "num_attention_heads": w["heads"],
            "num_key_value_heads": w["kv_heads"],
        }
    gac_cfg = json.loads((out / io.GAC_CONFIG).read_text())
    assert gac_cfg["pruned_widths"] == widths and not gac_cfg["pruned_uniform"]
    back = io.load(out)
    with torch.no_grad():
        torch.testing.assert_close(back(IDS).logits, ref, rtol=0, atol=0)
    from gac.models.inventory import kv_bytes_per_token

    kv = kv_bytes_per_token(back)  # each layer caches its own KV heads (float32: 4 bytes)
    assert kv["cache"] == sum(2 * w["kv_heads"] * 20 * 4 for w in widths)
    assert kv["dense"] == 3 * 2 * 3 * 20 * 4


@pytest.mark.skipif(not HAS_PER_LAYER, reason="transformers < 5.24 has no per_layer_config")
def test_plain_autoconfig_reads_each_layer_without_gac(pruned_dir):
    out, widths, _ = pruned_dir
    r = _run(
        f"""
        import json, sys
        from transformers import AutoConfig, AutoModelForCausalLM
        c = AutoConfig.from_pretrained({str(out)!r})
        print(json.dumps([[c.per_layer_config[i].intermediate_size, c.per_layer_config[i].num_attention_heads,
                           c.per_layer_config[i].num_key_value_heads] for i in range(c.num_hidden_layers)]))
        assert "gac" not in sys.modules
        try:  # the modeling side is not upstream: plain transformers refuses, never a wrong model
            AutoModelForCausalLM.from_pretrained({str(out)!r})
        except Exception as e:
            print("refused", type(e).__name__)
        """
    )
    assert r.returncode == 0, r.stderr[-2000:]
    got, refused = r.stdout.strip().splitlines()
    assert json.loads(got) == [[w["intermediate"], w["heads"], w["kv_heads"]] for w in widths]
    assert refused.startswith("refused")


def test_auto_model_after_import_gac_equals_gac_load(pruned_dir, tmp_path):
    out, _, _ = pruned_dir
    torch.save(IDS, tmp_path / "ids.pt")
    with torch.no_grad():
        torch.save(io.load(out)(IDS).logits, tmp_path / "ref.pt")
    r = _run(
        f"""
        import torch
        import gac
        from transformers import AutoModelForCausalLM
        m = AutoModelForCausalLM.from_pretrained({str(out)!r})
        ids = torch.load({str(tmp_path / "ids.pt")!r})
        with torch.no_grad():
            got = m(ids).logits
        assert torch.equal(got, torch.load({str(tmp_path / "ref.pt")!r}))
        print(type(m).__name__, m.model.layers[0].mlp.gate_proj.out_features)
        """
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split()[0] == "LlamaForCausalLM"


def test_a_per_layer_config_whose_layers_do_not_match_is_one_error(pruned_dir, tmp_path):
    import shutil

    out, _, _ = pruned_dir
    bad = shutil.copytree(out, tmp_path / "bad")
    doc = json.loads((bad / "config.json").read_text())
    doc["per_layer_config"]["3"] = dict(doc["per_layer_config"]["0"])
    (bad / "config.json").write_text(json.dumps(doc))
    with pytest.raises(GacError, match="layer count does not match") as e:
        io.load(bad)
    assert "\n" not in str(e.value)
    # gac_config.json's recorded shapes must agree with config.json
    doc = json.loads((out / "config.json").read_text())
    doc["per_layer_config"]["0"]["intermediate_size"] -= 1
    (bad / "config.json").write_text(json.dumps(doc))
    with pytest.raises(GacError, match="per_layer_config gives"):
        io.load(bad)


def test_uniform_widths_stay_a_plain_checkpoint(tmp_path):
    m = tiny_model(heads=6, kv_heads=3, head_dim=20, layers=2)
    cfg = CompressConfig(compressor="llm-pruner", param_ratio=0.7, align="round",
                         options={"layer_start": 0, "layer_end": 2})  # fmt: skip
    apply_(m, plan(m, cfg, calib_batches=[IDS], profile=default_profile()))
    out = io.save(m, tmp_path / "m", {"compressor": "llm-pruner"})
    doc = json.loads((out / "config.json").read_text())
    assert "per_layer_config" not in doc and doc["model_type"] == "llama"
    assert doc["intermediate_size"] == m.model.layers[0].mlp.gate_proj.out_features
