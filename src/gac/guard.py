"""The CLI's safety contract in one place: output paths, atomic outputs, signals, option checks.

Every command that writes goes through :func:`check_out` (before any work starts) and
:func:`atomic_dir` / :func:`atomic_file` (at the end), so that:

* nothing is deleted that the command did not create: an existing non-empty ``--out`` is refused
  unless ``--overwrite`` is given, and even then ``/``, the home directory, the current directory
  and its parents are never replaced;
* nothing half-written remains: outputs are built under a temporary sibling name and renamed at
  the end; the temporary is removed on every exit path (exceptions, SIGINT, SIGTERM), and one left
  by a killed run (SIGKILL) is removed by the next run that writes the same output;
* outputs get the user's umask permissions (not ``mkdtemp``'s 0700 / ``mkstemp``'s 0600).

:func:`install_signal_handlers` turns SIGINT/SIGTERM into :class:`Interrupted`, which the CLI
prints as one line with exit status ``128 + signum`` (130 for Ctrl-C). :func:`validate_options`
checks ``KEY=VALUE`` options against the type hints of a constructor (compressors, strategies).
"""

from __future__ import annotations

import contextlib
import inspect
import os
import re
import shutil
import signal
import tempfile
import types
import typing
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from gac.errors import GacError

#: Temporary outputs are named ``.<out name>.gac-<pid>-<random>.tmp`` next to the output.
_TMP_RE = re.compile(r"^\.(?P<name>.+)\.gac-(?P<pid>\d+)-[^/]*\.tmp$")
_SPECIAL_FS = ("/proc", "/sys", "/dev")


# ----------------------------------------------------------------------------- permissions
def umask() -> int:
    """The process umask (read without changing it for longer than one call)."""
    m = os.umask(0o022)
    os.umask(m)
    return m


def _fix_modes(root: Path) -> None:
    """Give ``root`` and everything below it the modes a plain ``mkdir``/``open`` would have."""
    m = umask()
    dmode, fmode = 0o777 & ~m, 0o666 & ~m
    if root.is_dir():
        os.chmod(root, dmode)
        for dirpath, dirnames, filenames in os.walk(root):
            for d in dirnames:
                os.chmod(os.path.join(dirpath, d), dmode)
            for f in filenames:
                p = os.path.join(dirpath, f)
                if not os.path.islink(p):
                    os.chmod(p, fmode)
    elif root.is_file():
        os.chmod(root, fmode)


# ----------------------------------------------------------------------------- output paths
def _protected(resolved: Path) -> str | None:
    """Why ``resolved`` may never be replaced, or None."""
    cwd = Path.cwd().resolve()
    if resolved == Path(resolved.anchor):
        return "it is the filesystem root"
    if resolved == Path.home().resolve():
        return "it is your home directory"
    if resolved == cwd:
        return "it is the current directory"
    if resolved in cwd.parents:
        return "it contains the current directory"
    return None


def _nearest_existing(p: Path) -> Path:
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def check_out(out: str | Path, overwrite: bool = False, kind: str = "dir") -> Path:
    """Check an output path before any work starts; raise :class:`GacError` with one line if bad.

    Args:
        out: the path the user named (``--out``).
        overwrite: the user allowed replacing an existing output (``--overwrite``).
        kind: ``dir`` (a directory of files) or ``file`` (one file, e.g. a profile JSON).

    Returns:
        ``out`` as a :class:`Path`.
    """
    out = Path(out).expanduser()
    if str(out) in ("", "."):
        out = Path(".")
    resolved = out.resolve()
    for special in _SPECIAL_FS:
        if resolved == Path(special) or Path(special) in resolved.parents:
            raise GacError(f"cannot write to {out}: {special} is not a place for outputs")
    why = _protected(resolved)
    if why and (out.exists() or kind == "dir"):
        raise GacError(f"refusing to write to {out}: {why}; name a new directory")
    if out.is_symlink() or out.exists():
        if kind == "dir" and out.is_dir() and not out.is_symlink():
            if any(out.iterdir()) and not overwrite:
                raise GacError(
                    f"output {out} already exists and is not empty (pass --overwrite to replace it)"
                )
        elif kind == "file" and out.is_dir():
            raise GacError(f"output {out} is a directory; give a file path")
        elif not overwrite:
            what = "is a file" if kind == "dir" else "already exists"
            raise GacError(f"output {out} {what} (pass --overwrite to replace it)")
    anc = _nearest_existing(out.absolute().parent)
    if not anc.is_dir():
        raise GacError(f"cannot write to {out}: {anc} is not a directory")
    if not os.access(anc, os.W_OK | os.X_OK):
        raise GacError(f"cannot write to {out}: {anc} is not writable")
    return out


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def clean_stale(out: str | Path) -> list[Path]:
    """Remove temporaries of ``out`` left by runs that were killed (their process is gone).

    Only names this module creates (``.<name>.gac-<pid>-*.tmp``) are touched.
    """
    out = Path(out)
    parent = out.parent if str(out.parent) else Path(".")
    removed: list[Path] = []
    if not parent.is_dir():
        return removed
    for p in parent.iterdir():
        m = _TMP_RE.match(p.name)
        if not m or m["name"] != out.name or _pid_alive(int(m["pid"])):
            continue
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                p.unlink()
        removed.append(p)
    return removed


def _tmp_prefix(out: Path) -> str:
    return f".{out.name}.gac-{os.getpid()}-"


def _mkparents(parent: Path) -> list[Path]:
    """``mkdir -p parent``; return the directories created (deepest last)."""
    created: list[Path] = []
    p = parent
    while not p.exists() and p != p.parent:
        created.append(p)
        p = p.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise GacError(f"cannot create {parent}: {e.strerror or e}") from None
    return created[::-1]


def _rm_created(created: list[Path]) -> None:
    for d in reversed(created):
        with contextlib.suppress(OSError):
            d.rmdir()  # only if still empty


def _replace(tmp: Path, out: Path) -> None:
    """Move ``tmp`` onto ``out``; an existing ``out`` is moved aside first, removed after."""
    old: Path | None = None
    if out.is_symlink() or out.is_file():
        out.unlink()
    elif out.is_dir():
        old = out.parent / f"{_tmp_prefix(out)}old.tmp"
        os.replace(out, old)
    os.replace(tmp, out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


@contextlib.contextmanager
def atomic_dir(out: str | Path, overwrite: bool = False) -> Iterator[Path]:
    """Yield a temporary directory next to ``out``; rename it to ``out`` only on success.

    ``out`` is checked by :func:`check_out`; temporaries of killed earlier runs are removed; on any
    exception (SIGINT included) the temporary directory, and any parent directory this call made,
    are removed, so no half-written output remains. The result has the user's umask permissions.
    """
    out = check_out(out, overwrite)
    clean_stale(out)
    created = _mkparents(out.parent)
    try:
        tmp = Path(tempfile.mkdtemp(prefix=_tmp_prefix(out), suffix=".tmp", dir=out.parent))
    except OSError as e:
        _rm_created(created)
        raise GacError(f"cannot write to {out}: {e.strerror or e}") from None
    try:
        yield tmp
        _fix_modes(tmp)
        _replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        _rm_created(created)
        raise


@contextlib.contextmanager
def atomic_file(path: str | Path, overwrite: bool = True) -> Iterator[Path]:
    """Yield a temporary file path next to ``path``; rename it to ``path`` only on success."""
    path = check_out(path, overwrite, kind="file")
    clean_stale(path)
    created = _mkparents(path.parent)
    try:
        fd, name = tempfile.mkstemp(prefix=_tmp_prefix(path), suffix=".tmp", dir=path.parent)
    except OSError as e:
        _rm_created(created)
        raise GacError(f"cannot write to {path}: {e.strerror or e}") from None
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        _fix_modes(tmp)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        _rm_created(created)
        raise


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file and an atomic rename (umask modes)."""
    with atomic_file(path) as tmp:
        tmp.write_text(text)


def atomic_savefig(fig: Any, path: str | Path, dpi: int = 110) -> Path:
    """Save a matplotlib figure to ``path`` through a temporary file and an atomic rename.

    The format follows ``path``'s suffix (PNG without one); the caller closes the figure.
    """
    path = Path(path)
    with atomic_file(path) as tmp:
        fig.savefig(tmp, dpi=dpi, format=path.suffix.lstrip(".").lower() or "png")
    return path


# ----------------------------------------------------------------------------- signals
class Interrupted(BaseException):
    """SIGINT or SIGTERM arrived. A BaseException (like KeyboardInterrupt) so that no
    ``except Exception`` swallows it, but not a KeyboardInterrupt, which click turns into a
    silent exit."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


def install_signal_handlers() -> Callable[[], None]:
    """Raise :class:`Interrupted` on SIGINT/SIGTERM; return a function restoring the old handlers.

    A no-op outside the main thread (signal handlers can only be set there).
    """
    import threading

    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def handler(signum: int, frame: types.FrameType | None) -> None:
        raise Interrupted(signum)

    old = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}

    def restore() -> None:
        for s, h in old.items():
            signal.signal(s, h)

    return restore


def _one_line(text: object) -> str:
    return " ".join(str(text).split())


def run_main(fn: Callable[[], Any]) -> int:
    """Run a command-line entry point under the error contract; return its exit status.

    * :class:`GacError` (bad input caught where it is first seen): ``error: ...`` on one line, 2;
    * SIGINT / SIGTERM: ``error: interrupted by SIGINT ...`` on one line, ``128 + signum``
      (130 for Ctrl-C); outputs are atomic, so nothing half-written remains;
    * ``SystemExit`` (typer's usage errors, argparse): its status;
    * anything else is a bug: ``error: internal error: ...`` and a hint, status 1;
      ``GAC_DEBUG=1`` prints the traceback instead.
    """
    import sys
    import traceback

    restore = install_signal_handlers()
    try:
        fn()
    except SystemExit as e:
        if e.code is None:
            return 0
        if isinstance(e.code, int):
            return e.code
        print(e.code, file=sys.stderr)
        return 1
    except GacError as e:
        print(f"error: {_one_line(e)}", file=sys.stderr)
        return 2
    except (Interrupted, KeyboardInterrupt) as e:
        name = signal.Signals(e.signum).name if isinstance(e, Interrupted) else "SIGINT"
        code = e.exit_code if isinstance(e, Interrupted) else 130
        print(f"error: interrupted by {name}; no partial output was left behind", file=sys.stderr)
        return code
    except Exception as e:  # noqa: BLE001 - the last line of defence: a bug, reported in one line
        if os.environ.get("GAC_DEBUG", "") not in ("", "0"):
            traceback.print_exc()
        else:
            msg = _one_line(e)[:300]
            print(
                f"error: internal error: {type(e).__name__}{': ' + msg if msg else ''} "
                "(run with GAC_DEBUG=1 for the traceback)",
                file=sys.stderr,
            )
        return 1
    finally:
        restore()
    return 0


# ----------------------------------------------------------------------------- options
def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _split_list(value: str) -> list[str]:
    v = value.strip()
    if v.startswith("[") and v.endswith("]"):
        v = v[1:-1]
    return [x.strip() for x in v.split(",") if x.strip()]


def coerce(value: Any, tp: Any, what: str) -> Any:
    """Convert ``value`` (a string from the command line, or a JSON value) to type ``tp``.

    Supports ``bool``, ``int``, ``float``, ``str``, ``Literal[...]``, ``X | None`` and sequences
    (``Sequence[float]``, ``list[int]``, ``tuple[float, ...]``; a string is split at commas).

    >>> coerce("0.6,0.8,0.9", Sequence[float], "probe_ratios")
    [0.6, 0.8, 0.9]
    >>> coerce("none", int | None, "n")
    """
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is Any or tp is inspect.Parameter.empty:
        return value
    if origin in (typing.Union, types.UnionType):
        is_none = value is None or (isinstance(value, str) and value.lower() in ("none", "null"))
        if is_none and type(None) in args:
            return None
        errors = []
        for a in (a for a in args if a is not type(None)):
            try:
                return coerce(value, a, what)
            except GacError as e:
                errors.append(str(e))
        raise GacError(errors[0] if len(errors) == 1 else f"{what} must be {_type_name(tp)}, got {value!r}")
    if origin is typing.Literal:
        if value in args:
            return value
        raise GacError(f"{what} must be one of {', '.join(map(repr, args))}, got {value!r}")
    if origin in (list, tuple, Sequence, typing.Sequence) or tp in (list, tuple):
        items = _split_list(value) if isinstance(value, str) else value
        if not isinstance(items, (list, tuple)):
            raise GacError(f"{what} must be a comma-separated list, got {value!r}")
        inner = args[0] if args else Any
        out = [coerce(x, inner, f"{what} item") for x in items]
        return tuple(out) if origin is tuple else out
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "1", "yes", "false", "0", "no"):
            return value.lower() in ("true", "1", "yes")
        raise GacError(f"{what} must be true or false, got {value!r}")
    if tp in (int, float):
        try:
            if isinstance(value, bool):
                raise ValueError
            num = float(value)
            if tp is int:
                if not num.is_integer():
                    raise ValueError
                return int(num)
            return num
        except (TypeError, ValueError):
            raise GacError(
                f"{what} must be {'an integer' if tp is int else 'a number'}, got {value!r}"
            ) from None
    if tp is str:
        if isinstance(value, (dict, list)):
            raise GacError(f"{what} must be a string, got {value!r}")
        return str(value)
    return value


def validate_options(fn: Callable[..., Any], options: dict[str, Any], owner: str) -> dict[str, Any]:
    """Check ``options`` against the keyword parameters (and type hints) of ``fn``.

    Unknown keys and values of the wrong type raise :class:`GacError` naming the option and the
    accepted ones, before any model is loaded. Returns the options converted to the declared types.
    """
    sig = inspect.signature(fn)
    try:
        hints = typing.get_type_hints(fn)
    except Exception:  # noqa: BLE001 - unresolved annotations: check names only
        hints = {}
    params = {
        n: p
        for n, p in sig.parameters.items()
        if n != "self" and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    }
    takes_kwargs = any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values())
    out: dict[str, Any] = {}
    for key, value in options.items():
        if key not in params:
            if takes_kwargs:
                out[key] = value
                continue
            known = ", ".join(params) or "none"
            raise GacError(f"{owner} has no option {key!r}; its options: {known}")
        out[key] = coerce(value, hints.get(key, Any), f"{owner} option {key}")
    return out


def parse_device(device: str) -> str:
    """Check a device string (``auto``, ``cpu``, ``cuda``, ``cuda:N``, ``mps``); return it resolved.

    ``auto`` is CUDA when available, else CPU.
    """
    import torch

    d = device.strip().lower()
    if d == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    m = re.fullmatch(r"(cpu|cuda|mps)(?::(\d+))?", d)
    if not m:
        raise GacError(f"unknown device {device!r}; use auto, cpu, cuda or cuda:N")
    kind, idx = m[1], m[2]
    if kind == "cuda":
        if not torch.cuda.is_available():
            raise GacError(f"device {device} requested but CUDA is not available")
        if idx is not None and int(idx) >= torch.cuda.device_count():
            raise GacError(f"device {device}: only {torch.cuda.device_count()} CUDA device(s) here")
    if kind == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise GacError(f"device {device} requested but MPS is not available")
    if kind == "cpu" and idx not in (None, "0"):
        raise GacError(f"unknown device {device!r}; use cpu")
    return d


# ----------------------------------------------------------------------------- model configs
#: Sanity bounds on a model config, checked before anything is allocated. Generous: the largest
#: published decoder-only models stay far inside them.
CONFIG_LIMITS = {
    "hidden_size": 1 << 17,
    "intermediate_size": 1 << 20,
    "num_hidden_layers": 1024,
    "num_attention_heads": 1 << 12,
    "num_key_value_heads": 1 << 12,
    "head_dim": 1 << 12,
    "vocab_size": 1 << 24,
}


def _total_ram() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def check_model_config(cfg: Any, where: str, bytes_per_param: int = 4) -> None:
    """Refuse a model config with wrong types or absurd sizes before any tensor is allocated.

    Checks that the size fields present are positive integers within :data:`CONFIG_LIMITS`, that
    the heads divide evenly, and that the weights (estimated from the sizes) fit in this machine's
    memory.

    Args:
        cfg: the parsed ``config.json`` (a dict; text configs of nested models are checked too).
        where: the file, for the message.
        bytes_per_param: bytes per weight of the dtype that will be loaded.

    Raises:
        GacError: one line naming the field and the bad value.
    """
    if not isinstance(cfg, dict):
        raise GacError(f"{where} is not a JSON object")
    if isinstance(cfg.get("text_config"), dict):
        check_model_config(cfg["text_config"], where, bytes_per_param)
    vals: dict[str, int] = {}
    for key, limit in CONFIG_LIMITS.items():
        if key not in cfg or cfg[key] is None:
            continue
        v = cfg[key]
        if isinstance(v, bool) or not isinstance(v, int):
            raise GacError(f"{where}: {key} must be an integer, got {v!r}")
        if v < 1:
            raise GacError(f"{where}: {key} must be positive, got {v}")
        if v > limit:
            raise GacError(f"{where}: {key} = {v:,} is beyond any real model (limit {limit:,})")
        vals[key] = v
    h, heads = vals.get("hidden_size"), vals.get("num_attention_heads")
    kv = vals.get("num_key_value_heads")
    if heads and kv and heads % kv:
        raise GacError(f"{where}: num_attention_heads {heads} is not a multiple of num_key_value_heads {kv}")
    if h and heads and "head_dim" not in vals and h % heads:
        raise GacError(f"{where}: hidden_size {h} is not divisible by num_attention_heads {heads}")
    if h:
        layers = vals.get("num_hidden_layers", 1)
        hd = vals.get("head_dim") or (h // heads if heads else h)
        attn = h * hd * ((heads or 1) * 2 + 2 * (kv or heads or 1))
        mlp = 3 * h * vals.get("intermediate_size", 4 * h)
        params = layers * (attn + mlp) + 2 * vals.get("vocab_size", 0) * h
        need, ram = params * bytes_per_param, _total_ram()
        if ram and need > ram:
            raise GacError(
                f"{where}: these sizes need about {need / 2**30:,.0f} GiB of weights, more than this "
                f"machine's {ram / 2**30:,.0f} GiB of memory"
            )


def check_model_dir_config(path: str | Path, bytes_per_param: int = 4) -> None:
    """:func:`check_model_config` on ``path/config.json`` (if present), with a readable message for
    invalid JSON."""
    import json

    p = Path(path) / "config.json"
    if not p.is_file():
        return
    try:
        cfg = json.loads(p.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise GacError(f"{p} is not valid JSON: {e}") from None
    except OSError as e:
        raise GacError(f"cannot read {p}: {e.strerror or e}") from None
    check_model_config(cfg, str(p), bytes_per_param)
