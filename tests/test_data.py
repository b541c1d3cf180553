"""Text sources and token windows."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from gac.compressors.calibration import CalibrationConfig, calibration_batches
from gac.data import (
    check_disjoint,
    check_seq_len,
    check_split_windows,
    load_part,
    load_text,
    special_tokens,
    token_windows,
    tokenize,
)
from gac.errors import GacError
from gac.testing import char_tokenizer, tiny_model

EXCERPT = Path(__file__).resolve().parent / "data" / "britannica_excerpt.txt"

PROSE = (
    "The Encyclopaedia Britannica is a general knowledge English-language encyclopaedia. "
    "It was first published between 1768 and 1771 in Edinburgh, Scotland. "
)


class CharTokenizer:
    """One token per byte: enough to test windowing without a real vocabulary."""

    def __call__(self, text, add_special_tokens=True):
        ids = list(text.encode())
        return {"input_ids": ([1] if add_special_tokens else []) + ids}


def test_text_source_splits_into_disjoint_parts(tmp_path):
    text = EXCERPT.read_text()
    p = tmp_path / "a.txt"
    p.write_text(text)
    test, train = load_part(f"text:{p}", "test"), load_part(f"text:{p}", "train")
    # cut once at a paragraph break: the parts are disjoint, in order, and lose only blank lines
    assert test.text == text[: test.end] and train.text == text[train.start :]
    assert test.end <= train.start and text[test.end : train.start].strip() == ""
    assert len(test.text) >= len(text) // 2 and train.text and not test.overlaps(train)
    assert load_part(f"text:{p}", "test") == test  # deterministic
    # selectors pick one part whatever the role, or the whole file
    assert load_text(f"text:{p}@calib", "test") == train.text
    assert load_text(f"text:{p}@test", "train") == test.text
    assert load_text(f"text:{p}@all", "train") == text


def test_overlap_is_refused_unless_allowed(tmp_path):
    p, q = tmp_path / "a.txt", tmp_path / "copy.txt"
    p.write_text(EXCERPT.read_text())
    q.write_text(EXCERPT.read_text())
    ok = check_disjoint(load_part(f"text:{p}", "train"), load_part(f"text:{p}", "test"))
    assert not ok["overlap"] and ok["calibration"]["part"] == "train"
    # the calibration part evaluated, or a copy of the same file under another name: refused
    for calib, ev in ((f"text:{p}", f"text:{p}@calib"), (f"text:{p}@all", f"text:{q}")):
        with pytest.raises(GacError, match=r"overlap \(characters .*--allow-overlap"):
            check_disjoint(load_part(calib, "train"), load_part(ev, "test"))
    rec = check_disjoint(load_part(f"text:{p}@all", "train"), load_part(f"text:{q}", "test"), True)
    assert rec["overlap"] and rec["allow_overlap"]


def _windows_found(calib_ids: torch.Tensor, eval_ids: torch.Tensor, seq_len: int) -> int:
    """How many of the calibration text's windows occur anywhere in the evaluation token stream."""
    haystack = "".join(map(chr, eval_ids.tolist()))
    n = calib_ids.numel() // seq_len
    return sum("".join(map(chr, w.tolist())) in haystack for w in calib_ids[: n * seq_len].view(n, seq_len))


@pytest.mark.parametrize(
    "source",
    [
        "text:EXCERPT",
        pytest.param("britannica", marks=pytest.mark.slow),
        pytest.param("shakespeare", marks=pytest.mark.slow),
        pytest.param("wikitext2", marks=pytest.mark.slow),
        pytest.param("c4", marks=pytest.mark.slow),
    ],
)
def test_no_calibration_window_among_evaluation_windows(source):
    """Every calibration window (the first N, or any seeded choice) is absent from the evaluation text."""
    source = source.replace("EXCERPT", str(EXCERPT))
    try:
        calib, ev = load_part(source, "train"), load_part(source, "test")
    except GacError as e:  # wikitext2 / c4 need the hub
        pytest.skip(str(e))
    assert not calib.overlaps(ev)
    tok = char_tokenizer(bos=True)
    calib_ids, eval_ids = tokenize(tok, calib.text[:200_000]), tokenize(tok, ev.text)
    assert _windows_found(calib_ids, eval_ids, 256) == 0  # a CPU calibration window
    # the check can fail: the same text in both roles (what text:PATH meant before it was split)
    assert _windows_found(tokenize(tok, ev.text[:20_000]), eval_ids, 256) > 0


def test_tokens_follow_the_tokenizer_convention():
    with_bos, without = char_tokenizer(bos=True), char_tokenizer()
    assert tokenize(with_bos, "Hamlet").tolist() == [1, *tokenize(without, "Hamlet").tolist()]
    assert special_tokens(with_bos) == {
        "add_special_tokens": True, "bos": True, "prefix_ids": [1], "suffix_ids": [], "bos_token_id": 1
    }  # fmt: skip
    assert not special_tokens(without)["bos"] and special_tokens(without)["prefix_ids"] == []
    w = token_windows(with_bos, PROSE, seq_len=16, n=2)
    assert w[0, 0].item() == 1 and w[1, 0].item() != 1  # BOS once, at the start of the text


def test_bad_windows_are_clear_errors(tmp_path):
    model = tiny_model("llama")  # max_position_embeddings 512
    check_seq_len(model, 512)
    with pytest.raises(GacError, match="--seq-len 1024 is beyond the model's context of 512"):
        check_seq_len(model, 1024)
    p = tmp_path / "short.txt"
    p.write_text(PROSE * 3)  # ~460 characters: parts of ~230 tokens each
    check_split_windows(char_tokenizer(), f"text:{p}", 128)
    with pytest.raises(
        GacError, match=r"too short to give both its parts a window of 256 tokens \(test part"
    ):
        check_split_windows(char_tokenizer(), f"text:{p}", 256)
    check_split_windows(char_tokenizer(), f"text:{p}@all", 256)  # one role: no split to check


@pytest.mark.parametrize(
    ("source", "split", "msg"),
    [
        ("text:/no/such/file.txt", "test", "does not exist"),
        ("gutenberg", "test", "unknown text source"),
        ("britannica", "validation", "unknown split"),
    ],
)
def test_bad_sources(source, split, msg):
    with pytest.raises(GacError, match=msg):
        load_text(source, split)


def test_token_windows_are_consecutive_and_exact():
    tok = CharTokenizer()
    w = token_windows(tok, PROSE, seq_len=16, n=3)
    assert w.shape == (3, 16) and w.dtype == torch.long
    assert bytes(w.reshape(-1).tolist()) == bytes([1]) + PROSE.encode()[:47]  # its BOS, no overlap
    assert token_windows(tok, PROSE, 16).shape[0] == (len(PROSE.encode()) + 1) // 16


def test_short_text_is_a_clear_error(tmp_path):
    tok = CharTokenizer()
    with pytest.raises(GacError, match="text too short: 154 tokens hold 1 window"):
        token_windows(tok, PROSE, seq_len=128, n=2)
    p = tmp_path / "short.txt"
    p.write_text(PROSE)
    cfg = CalibrationConfig(source=f"text:{p}", n_samples=4, seq_len=64, batch_size=3)
    with pytest.raises(GacError, match=r"calibration text \(text:.*, train part\) too short"):
        calibration_batches(tok, cfg)
    ok = calibration_batches(
        tok, CalibrationConfig(source=f"text:{p}@all", n_samples=4, seq_len=32, batch_size=3)
    )
    assert [b.shape for b in ok] == [(3, 32), (1, 32)]


def test_calibration_defaults():
    assert (
        CalibrationConfig.default("cuda").n_samples * CalibrationConfig.default("cuda").seq_len == 256 * 2048
    )
    cpu = CalibrationConfig.default("cpu")
    assert cpu.n_samples * cpu.seq_len < 256 * 2048


@pytest.mark.slow
def test_britannica_and_plays_are_real_and_disjoint(tmp_path, monkeypatch):
    monkeypatch.setenv("GAC_CACHE", str(tmp_path))
    ev = load_text("britannica", "test")
    cal = load_text("britannica", "train")
    plays = load_text("shakespeare", "train")
    # the article is cut in two halves at a paragraph break: both prose, disjoint, nothing lost
    assert len(ev) > 120_000 and len(cal) > 120_000 and "ENCYCLOPAEDIA" in ev.upper()
    assert ev[-2000:] not in cal and cal[:2000] not in ev
    assert len(ev) + len(cal) > 280_000
    assert load_text("shakespeare", "test") == ev
    assert "HAMLET" in plays and len(plays) > 500_000 and ev[:2000] not in plays
    assert not list(tmp_path.glob(".shakespeare*"))  # no temporary leftovers
