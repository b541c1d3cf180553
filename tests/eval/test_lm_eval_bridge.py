"""The lm-eval bridge runs the real lm-eval path on a local multiple-choice task (offline)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

pytest.importorskip("lm_eval")

from gac.errors import GacError  # noqa: E402
from gac.eval.lm_eval_bridge import run_lm_eval  # noqa: E402

DATA = Path(__file__).resolve().parents[1] / "data" / "lm_eval"
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")


def char_tokenizer():
    """A character-level fast tokenizer (ASCII) small enough for gac.testing's 250-token models."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for c in range(32, 127):
        vocab[chr(c)] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>", pad_token="</s>"
    )


def write_tasks(tmp: Path, broken: bool = False) -> Path:
    d = tmp / "tasks"
    d.mkdir()
    tpl = (DATA / "gac_tiny_mc.yaml.in").read_text()
    (d / "gac_tiny_mc.yaml").write_text(tpl.replace("{DATA}", str(DATA / "gac_tiny_mc.jsonl")))
    if broken:  # same task, but its data file does not exist
        (d / "gac_tiny_mc_missing.yaml").write_text(
            tpl.replace("{DATA}", str(tmp / "missing.jsonl")).replace(
                "task: gac_tiny_mc", "task: gac_tiny_mc_missing"
            )
        )
    return d


@pytest.fixture(scope="module")
def tiny():
    from gac.testing import tiny_model

    return tiny_model("llama"), char_tokenizer()


def test_local_task_full_set_and_limit(tmp_path, tiny):
    model, tok = tiny
    inc = write_tasks(tmp_path)
    out = tmp_path / "lm_eval.json"
    res = run_lm_eval(model, tok, ["gac_tiny_mc"], include_path=inc, out_json=out, batch_size=4)
    t = res["tasks"]["gac_tiny_mc"]
    assert t["n_samples"] == 12  # the full set when no limit is given
    assert t["metric"] == "acc_norm" and 0.0 <= t["value"] <= 1.0
    assert t["value"] * 12 == pytest.approx(round(t["value"] * 12))  # a count of correct answers out of 12
    assert json.loads(out.read_text())["tasks"]["gac_tiny_mc"]["value"] == t["value"]
    res4 = run_lm_eval(model, tok, ["gac_tiny_mc"], include_path=inc, limit=4)
    assert res4["tasks"]["gac_tiny_mc"]["n_samples"] == 4


def test_unknown_task_is_a_clear_error(tmp_path, tiny):
    model, tok = tiny
    with pytest.raises(GacError, match=r"unknown lm-eval task\(s\): no_such_task_xyz.*lm-eval ls tasks"):
        run_lm_eval(model, tok, ["gac_tiny_mc", "no_such_task_xyz"], include_path=write_tasks(tmp_path))


def test_a_failing_task_keeps_the_results_already_measured(tmp_path, tiny):
    model, tok = tiny
    inc = write_tasks(tmp_path, broken=True)
    out = tmp_path / "lm_eval.json"
    res = run_lm_eval(
        model, tok, ["gac_tiny_mc", "gac_tiny_mc_missing"], include_path=inc, out_json=out, limit=3
    )
    assert "gac_tiny_mc" in res["tasks"] and "gac_tiny_mc_missing" in res["errors"]
    saved = json.loads(out.read_text())
    assert saved["tasks"]["gac_tiny_mc"]["n_samples"] == 3 and "gac_tiny_mc_missing" in saved["errors"]
