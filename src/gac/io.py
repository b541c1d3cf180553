"""Save and load compressed models: ``config.json`` + ``gac_config.json`` + safetensors.

A saved directory holds:

* ``config.json``: the base architecture's Hugging Face config when the skeleton is the base
  architecture's (e.g. uniformly pruned widths); for widths that vary by layer (LLM-Pruner under
  ``gac``), the base config with transformers' standard ``per_layer_config`` (transformers >= 5.24:
  a map from layer index to ``intermediate_size``, ``num_attention_heads`` and
  ``num_key_value_heads``, written for every layer; :func:`per_layer_config`); otherwise a
  wrapping config (``model_type: gac``, the base config under ``gac_base``) that ``transformers``
  loads after ``import gac`` (:mod:`gac.hf_auto`) and refuses without it;
* ``gac_config.json``: how the artefact was made (schema ``gac.model/1``): compressor, ratio,
  profile id, base model id and revision, gac version, and every factorized site with its
  ``(in, rank, out)`` and factor shapes, every module that rebuilds its own skeleton
  (``modules``: e.g. PaLU's latent attention, by gac class and spec), plus the tied weights that
  were stored once;
* ``model.safetensors``, or ``model-0000i-of-0000n.safetensors`` shards with
  ``model.safetensors.index.json`` when larger than ``max_shard_bytes``;
* the tokenizer files, when a tokenizer is given.

Non-persistent buffers (e.g. the rotary ``inv_freq``) are stored too, under the
``__buffers__.`` prefix, so a model whose buffers were edited (repair) reloads exactly.

:func:`load` rebuilds the skeleton with its parameters on the meta device, swaps in
:class:`~gac.nn.FactorizedLinear` at the recorded sites, memory-maps the
shards and assigns the tensors (``load_state_dict(assign=True)``). No pickles, no
``trust_remote_code``.
"""

from __future__ import annotations

import copy
import importlib
import json
import mmap
import os
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from torch import nn

from gac import __version__
from gac.errors import GacError, check_schema
from gac.hf_config import BASE_KEY, MODEL_TYPE, base_config, wrap_config
from gac.models.adapters import get_adapter, model_rotary
from gac.nn import FactorizedLinear, replace_module
from gac.utils import atomic_dir, console

SCHEMA = "gac.model/1"
GAC_CONFIG = "gac_config.json"
WEIGHTS = "model.safetensors"
INDEX = "model.safetensors.index.json"
BUFFER_PREFIX = "__buffers__."
DEFAULT_MAX_SHARD_BYTES = 4 * 1024**3

_ST_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}


# ------------------------------------------------------------------------------------ save
def factorized_sites(model: nn.Module) -> list[dict[str, Any]]:
    """Every :class:`FactorizedLinear` in ``model``: name, in/rank/out, bias and factor shapes."""
    out = []
    for name, m in model.named_modules():
        if isinstance(m, FactorizedLinear):
            out.append(
                {
                    "name": name,
                    "in_features": m.in_features,
                    "rank": m.rank,
                    "out_features": m.out_features,
                    "bias": m.bias is not None,
                    "factor_shapes": {"v": list(m.v.weight.shape), "u": list(m.u.weight.shape)},
                }
            )
    return out


def structured_modules(model: nn.Module) -> list[dict[str, Any]]:
    """Every module that describes its own skeleton (a ``gac_spec()`` method), e.g. PaLU's latent attention.

    Each entry names the module, its class (``package.module:Class``, always inside ``gac``) and
    the spec that class's ``skeleton(spec, original, rotary)`` rebuilds it from (``rotary``: the
    model's rotary embedding module, :func:`gac.models.adapters.model_rotary`).
    """
    out = []
    for name, m in model.named_modules():
        spec = getattr(m, "gac_spec", None)
        if callable(spec):
            cls = type(m)
            out.append({"name": name, "class": f"{cls.__module__}:{cls.__qualname__}", "spec": spec()})
    return out


def _skeleton_class(path: str, where: Path) -> Any:
    mod_name, _, cls_name = path.partition(":")
    if not mod_name.startswith("gac.") or not cls_name:
        raise GacError(f"{where / GAC_CONFIG}: module class {path!r} is not a gac class; refusing to load it")
    try:
        cls = getattr(importlib.import_module(mod_name), cls_name)
    except (ImportError, AttributeError):
        raise GacError(
            f"{where / GAC_CONFIG}: module class {path!r} is unknown to this gac version"
        ) from None
    if not hasattr(cls, "skeleton"):
        raise GacError(f"{where / GAC_CONFIG}: module class {path!r} cannot rebuild a skeleton")
    return cls


def _tensors_to_save(model: nn.Module) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """State dict with tied tensors stored once, plus non-persistent buffers."""
    sd = model.state_dict()
    tensors: dict[str, torch.Tensor] = {}
    tied: dict[str, str] = {}
    seen: dict[tuple[int, int, tuple[int, ...], tuple[int, ...]], str] = {}
    for k, t in sd.items():
        if t.device.type == "meta":
            raise GacError(f"tensor {k} is on the meta device; cannot save an unmaterialized model")
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()))
        if key in seen and t.numel() > 0:
            tied[k] = seen[key]
            continue
        seen[key] = k
        tensors[k] = t.detach().contiguous().cpu()
    persistent = set(sd)
    for mod_name, mod in model.named_modules():
        for b_name, buf in mod.named_buffers(recurse=False):
            full = f"{mod_name}.{b_name}" if mod_name else b_name
            if full not in persistent and buf is not None:
                tensors[BUFFER_PREFIX + full] = buf.detach().contiguous().cpu()
    return tensors, tied


def _shards(tensors: dict[str, torch.Tensor], max_bytes: int) -> list[dict[str, torch.Tensor]]:
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for k, t in tensors.items():
        n = t.numel() * t.element_size()
        if shards[-1] and size + n > max_bytes:
            shards.append({})
            size = 0
        shards[-1][k] = t
        size += n
    return shards


def save(
    model: nn.Module,
    out_dir: str | Path,
    gac_config: dict[str, Any] | None = None,
    tokenizer: Any | None = None,
    overwrite: bool = False,
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
    extra_files: dict[str, str] | None = None,
) -> Path:
    """Save ``model`` (compressed or not) to ``out_dir`` atomically.

    Args:
        model: a Hugging Face causal LM, possibly with :class:`FactorizedLinear` sites.
        out_dir: the directory to create (must not exist or be empty unless ``overwrite``).
        gac_config: how the model was made (compressor, ratio, profile id, base model...);
            the site list, tied weights and versions are added here.
        tokenizer: saved alongside when given.
        overwrite: replace an existing directory.
        max_shard_bytes: shard size above which the weights are split (with an index).
        extra_files: file name -> text, written in the same atomic step (e.g. a report).

    Returns:
        The output directory.
    """
    if not hasattr(model, "config") or not hasattr(model.config, "to_json_string"):
        raise GacError("gac.save needs a Hugging Face model (with a .config)")
    tensors, tied = _tensors_to_save(model)
    meta = dict(gac_config or {})
    meta.update(
        schema=SCHEMA,
        gac_version=__version__,
        torch_version=torch.__version__.split("+")[0],
        architecture=type(model).__name__,
        factorized=factorized_sites(model),
        modules=structured_modules(model),
        pruned=dict(getattr(model, "_gac_pruned", {})),
        tied=tied,
        dtype=str(next(iter(tensors.values())).dtype).removeprefix("torch.") if tensors else None,
    )
    out_dir = Path(out_dir)
    hf_config = model.config
    layers: dict[str, dict[str, int]] | None = None
    if meta["pruned"]:
        uniform = uniform_pruned_config(model)
        meta["pruned_uniform"] = uniform is not None
        meta["pruned_widths"] = pruned_widths(model)
        if uniform is not None:
            hf_config, meta["pruned"] = uniform, {}
        else:
            layers = per_layer_config(model)
    with atomic_dir(out_dir, overwrite=overwrite) as tmp:
        _write_config_json(tmp, model, hf_config, layers, wrapped=bool(meta["factorized"] or meta["modules"]))
        _write_weights(tmp, tensors, max_shard_bytes, out_dir)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        for name, text in (extra_files or {}).items():
            if Path(name).name != name or name in (GAC_CONFIG, "config.json"):
                raise GacError(f"bad extra file name {name!r}")
            (tmp / name).write_text(text)
        (tmp / GAC_CONFIG).write_text(json.dumps(meta, indent=1, default=str))
    return out_dir


def _write_config_json(
    tmp: Path, model: nn.Module, hf_config: Any, layers: dict[str, dict[str, int]] | None, wrapped: bool
) -> None:
    """``config.json``: wrapping (``wrapped``: the skeleton differs from the base architecture), the base
    config with ``per_layer_config`` (``layers``), or the base config as is."""
    if wrapped:
        # the skeleton differs from the base architecture: a wrapping config that only
        # transformers-after-``import gac`` (or gac.load) reads, never a silently wrong model
        doc = wrap_config(hf_config)
        if layers is not None:
            doc[BASE_KEY].update(head_dim=get_head_dim(model), per_layer_config=layers)
        (tmp / "config.json").write_text(json.dumps(doc, indent=2, default=str) + "\n")
    elif layers is not None:
        # per-layer widths: the base config with the standard per_layer_config; transformers
        # >= 5.24 reads it, and refuses to build the model from it without gac (the modeling
        # side is not upstream yet), never a silently wrong model
        doc = _config_dict(hf_config)
        doc.update(head_dim=get_head_dim(model), per_layer_config=layers)
        (tmp / "config.json").write_text(json.dumps(doc, indent=2, sort_keys=True, default=str) + "\n")
    else:
        hf_config.save_pretrained(tmp)


def _write_weights(tmp: Path, tensors: dict[str, torch.Tensor], max_shard_bytes: int, out_dir: Path) -> None:
    """``model.safetensors``, or shards with their index above ``max_shard_bytes``."""
    shards = _shards(tensors, max_shard_bytes)
    nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
    console.print(
        f"saving {len(tensors):,} tensors ({nbytes / 1e6:,.1f} MB, {len(shards)} file(s)) to {out_dir}",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )
    if len(shards) == 1:
        save_file(shards[0], str(tmp / WEIGHTS), metadata={"format": "pt"})
    else:
        weight_map: dict[str, str] = {}
        n = len(shards)
        for i, shard in enumerate(shards, 1):
            fname = f"model-{i:05d}-of-{n:05d}.safetensors"
            save_file(shard, str(tmp / fname), metadata={"format": "pt"})
            weight_map.update(dict.fromkeys(shard, fname))
        (tmp / INDEX).write_text(
            json.dumps({"metadata": {"total_size": nbytes}, "weight_map": weight_map}, indent=1)
        )


def pruned_widths(model: nn.Module) -> list[dict[str, int]]:
    """Per layer: MLP width, query heads and KV heads (as the modules hold them)."""
    ad = get_adapter(model)
    hd = ad.head_dim
    out = []
    for i in range(ad.num_layers):
        p = ad.projections(i)
        out.append(
            {
                "intermediate": int(model.get_submodule(p["gate"]).out_features),
                "heads": int(model.get_submodule(p["q"]).out_features) // hd,
                "kv_heads": int(model.get_submodule(p["k"]).out_features) // hd,
            }
        )
    return out


#: the per-layer attributes gac writes into ``per_layer_config``, and the width each comes from
PER_LAYER_KEYS = {
    "intermediate_size": "intermediate",
    "num_attention_heads": "heads",
    "num_key_value_heads": "kv_heads",
}


def get_head_dim(model: nn.Module) -> int:
    return int(get_adapter(model).head_dim)


def _config_dict(config: Any) -> dict[str, Any]:
    """``config`` as ``config.json`` holds it (``to_dict``, plus transformers' version)."""
    import transformers

    d = config.to_dict()
    d.setdefault("transformers_version", transformers.__version__)
    return d


def per_layer_config(model: nn.Module) -> dict[str, dict[str, int]]:
    """transformers' ``per_layer_config`` for a model whose widths vary by layer: every layer's
    ``intermediate_size``, ``num_attention_heads`` and ``num_key_value_heads`` (explicit for each
    layer, keys zero-padded as transformers writes them)."""
    widths = pruned_widths(model)
    digits = len(str(len(widths) - 1))
    return {
        str(i).zfill(digits): {key: int(w[src]) for key, src in PER_LAYER_KEYS.items()}
        for i, w in enumerate(widths)
    }


def read_per_layer_config(doc: dict[str, Any], where: str | Path) -> list[dict[str, int]]:
    """Per-layer widths (``pruned_widths``' form) from a config dict with ``per_layer_config``.

    Layers it leaves out take the global values (the standard's sparse form).

    Raises:
        GacError: its layers do not match ``num_hidden_layers``, or a value is not a positive int.
    """
    raw = doc.get("per_layer_config")
    n = doc.get("num_hidden_layers")
    if not isinstance(raw, dict) or not isinstance(n, int) or n < 1:
        raise GacError(f"{where}: per_layer_config must be a map from layer index to overrides")
    try:
        per = {int(k): v for k, v in raw.items()}
    except (TypeError, ValueError):
        raise GacError(f"{where}: per_layer_config keys must be layer indices, got {sorted(raw)}") from None
    bad = sorted(i for i in per if not 0 <= i < n)
    if bad:
        raise GacError(
            f"{where}: per_layer_config names layer(s) {bad} but the model has {n} layers "
            f"(0-{n - 1}); the layer count does not match"
        )
    out = []
    for i in range(n):
        over = per.get(i) or {}
        w = {}
        for key, dst in PER_LAYER_KEYS.items():
            v = over.get(key, doc.get(key))
            if key == "num_key_value_heads" and v is None:
                v = over.get("num_attention_heads", doc.get("num_attention_heads"))
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise GacError(
                    f"{where}: per_layer_config layer {i}: {key} must be a positive integer, got {v!r}"
                )
            w[dst] = v
        out.append(w)
    return out


def per_layer_shapes(model: nn.Module, widths: list[dict[str, int]]) -> dict[str, list[int]]:
    """``fqn -> [out, in]`` of every projection whose shape the per-layer widths change."""
    ad = get_adapter(model)
    hd = ad.head_dim
    if len(widths) != ad.num_layers:
        raise GacError(f"per-layer widths for {len(widths)} layers, but the model has {ad.num_layers}")
    shapes: dict[str, list[int]] = {}
    for i, w in enumerate(widths):
        q, kv, inter = w["heads"] * hd, w["kv_heads"] * hd, w["intermediate"]
        want = {"q": (q, None), "k": (kv, None), "v": (kv, None), "o": (None, q), "gate": (inter, None),
                "up": (inter, None), "down": (None, inter), "qkv": (q + 2 * kv, None),
                "gate_up": (2 * inter, None)}  # fmt: skip
        for role, fqn in ad.projections(i).items():
            mod = model.get_submodule(fqn)
            out_f, in_f = want.get(role, (None, None))
            shape = [out_f or mod.out_features, in_f or mod.in_features]
            if shape != [mod.out_features, mod.in_features]:
                shapes[fqn] = shape
    return shapes


def uniform_pruned_config(model: nn.Module) -> Any | None:
    """A standard Hugging Face config for a model whose layers all share one set of widths, else None.

    Plain ``transformers`` then rebuilds the pruned model without gac (head_dim written explicitly).
    """
    widths = pruned_widths(model)
    if any(w != widths[0] for w in widths):
        return None
    cfg = copy.deepcopy(model.config)
    hd = get_adapter(model).head_dim
    cfg.intermediate_size = widths[0]["intermediate"]
    cfg.num_attention_heads = widths[0]["heads"]
    cfg.num_key_value_heads = widths[0]["kv_heads"]
    cfg.head_dim = hd
    return cfg


def _apply_pruned_shapes(model: nn.Module, pruned: dict[str, list[int]]) -> None:
    """Swap the skeleton's linears for empty ones of the recorded (pruned) shapes."""
    for fqn, (out_f, in_f) in pruned.items():
        try:
            old = model.get_submodule(fqn)
        except AttributeError:
            raise GacError(
                f"{GAC_CONFIG} names pruned module {fqn!r}, absent from the architecture"
            ) from None
        replace_module(model, fqn, nn.Linear(in_f, out_f, bias=old.bias is not None, device="meta"))
    ad = get_adapter(model)
    hd = ad.head_dim if ad.num_layers else 1
    for i in range(ad.num_layers):
        attn = model.get_submodule(ad.attention_fqn(i))
        q, k = (model.get_submodule(ad.projection(i, r)) for r in ("q", "k"))
        for attr, val in (("num_heads", q.out_features // hd), ("num_key_value_heads", k.out_features // hd)):
            if hasattr(attn, attr):
                setattr(attn, attr, val)
    model._gac_pruned = dict(pruned)  # type: ignore[attr-defined]


# ------------------------------------------------------------------------------------ load
def read_gac_config(path: str | Path) -> dict[str, Any]:
    """The ``gac_config.json`` of a saved directory (validated schema)."""
    p = Path(path) / GAC_CONFIG
    if not p.is_file():
        raise GacError(f"{path} is not a gac-saved model directory (no {GAC_CONFIG})")
    try:
        cfg = json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise GacError(f"{p} is not valid JSON: {e}") from None
    check_schema(cfg.get("schema"), SCHEMA, p)
    return cfg


def _mmap_safetensors(path: Path) -> dict[str, torch.Tensor]:
    """Memory-map one safetensors file (copy-on-write) and return tensors viewing it.

    Every header entry is checked against the file size, so a truncated or corrupt shard is a
    :class:`GacError` naming the file rather than garbage weights.
    """
    if not path.is_file():
        raise GacError(f"missing weight file {path}")
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise GacError(f"corrupt weight file {path}: too short for a safetensors header")
        n = int.from_bytes(head, "little")
        if n <= 0 or 8 + n > size:
            raise GacError(f"corrupt weight file {path}: header length {n} does not fit in {size} bytes")
        try:
            header = json.loads(f.read(n))
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise GacError(f"corrupt weight file {path}: unreadable header") from None
        if not isinstance(header, dict):
            raise GacError(f"corrupt weight file {path}: header is not a JSON object")
        data_len = size - 8 - n
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY) if size > 0 else None
    out: dict[str, torch.Tensor] = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype = _ST_DTYPES[info["dtype"]]
            shape = [int(s) for s in info["shape"]]
            b, e = (int(x) for x in info["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise GacError(f"corrupt weight file {path}: bad entry for tensor {name!r}") from None
        numel = 1
        for s in shape:
            numel *= s
        itemsize = torch.empty(0, dtype=dtype).element_size()
        if not (0 <= b <= e <= data_len) or e - b != numel * itemsize:
            raise GacError(f"corrupt weight file {path}: tensor {name!r} lies outside the file (truncated?)")
        if numel == 0:
            out[name] = torch.empty(shape, dtype=dtype)
            continue
        t = torch.frombuffer(mm, dtype=dtype, count=numel, offset=8 + n + b)
        out[name] = t.view(shape)
    return out


def _read_weights(path: Path) -> dict[str, torch.Tensor]:
    index = path / INDEX
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError):
            raise GacError(f"corrupt shard index {index}") from None
        tensors: dict[str, torch.Tensor] = {}
        for fname in sorted(set(weight_map.values())):
            shard = _mmap_safetensors(path / fname)
            expected = {k for k, v in weight_map.items() if v == fname}
            missing = expected - set(shard)
            if missing:
                raise GacError(
                    f"corrupt weight file {path / fname}: lacks {len(missing)} tensor(s), e.g. {min(missing)}"
                )
            tensors.update(shard)
        return tensors
    return _mmap_safetensors(path / WEIGHTS)


def _set_tensor(model: nn.Module, fqn: str, value: torch.Tensor | nn.Parameter) -> None:
    mod_name, _, attr = fqn.rpartition(".")
    mod = model.get_submodule(mod_name) if mod_name else model
    if isinstance(value, nn.Parameter) or attr in mod._parameters:
        mod._parameters[attr] = (
            value if isinstance(value, nn.Parameter) else nn.Parameter(value, requires_grad=False)
        )
    else:
        mod._buffers[attr] = value


def load(path: str | Path, dtype: torch.dtype | None = None, device: str | torch.device = "cpu") -> nn.Module:
    """Load a directory written by :func:`save` (or ``gac compress``).

    Args:
        path: the saved directory.
        dtype: cast floating-point weights to this dtype (default: as saved).
        device: where to put the model.

    Returns:
        The model in eval mode, with :class:`FactorizedLinear` at the recorded sites.
    """
    path = Path(path)
    cfg = read_gac_config(path)
    if not (path / "config.json").is_file():
        raise GacError(f"{path} has no config.json")
    config, widths = _base_config(path)
    model = _build_skeleton(path, cfg, config, widths)
    buffers = _assign_weights(model, path, cfg)
    if dtype is not None:
        model.to(dtype=dtype)
        for k, b in buffers.items():  # keep saved buffers (e.g. inv_freq) at their saved precision
            _set_tensor(model, k, b)
    model.to(device)
    model.gac_config = cfg  # type: ignore[attr-defined]
    return model.eval()


def _base_config(path: Path) -> tuple[Any, list[dict[str, int]] | None]:
    """The base architecture's config from ``path/config.json`` (wrapping, per-layer or plain), and the
    per-layer widths it records (None when uniform)."""
    from transformers import AutoConfig

    widths: list[dict[str, int]] | None = None
    try:
        doc = json.loads((path / "config.json").read_text())
        if isinstance(doc, dict) and doc.get("model_type") == MODEL_TYPE:
            if isinstance(doc.get(BASE_KEY), dict) and "per_layer_config" in doc[BASE_KEY]:
                widths = read_per_layer_config(doc[BASE_KEY], path / "config.json")
                doc = {**doc, BASE_KEY: {k: v for k, v in doc[BASE_KEY].items() if k != "per_layer_config"}}
            config = base_config(doc)
        elif isinstance(doc, dict) and "per_layer_config" in doc:
            # the standard per-layer form: gac builds the layers (transformers' modeling side cannot yet)
            from transformers import CONFIG_MAPPING

            widths = read_per_layer_config(doc, path / "config.json")
            if doc.get("model_type") not in CONFIG_MAPPING:
                raise GacError(f"{path / 'config.json'}: unknown model_type {doc.get('model_type')!r}")
            config = CONFIG_MAPPING[doc["model_type"]].from_dict(
                {k: v for k, v in doc.items() if k != "per_layer_config"}
            )
        else:
            config = AutoConfig.from_pretrained(path, trust_remote_code=False)
    except (ValueError, OSError, KeyError, TypeError) as e:
        raise GacError(f"cannot read {path / 'config.json'}: {str(e).splitlines()[0]}") from None
    return config, widths


def _build_skeleton(
    path: Path, cfg: dict[str, Any], config: Any, widths: list[dict[str, int]] | None
) -> nn.Module:
    """The model of ``config`` on the meta device, reshaped as ``gac_config.json`` (``cfg``) records:
    pruned widths, factorized sites, modules that rebuild their own skeleton."""
    from accelerate import init_empty_weights
    from transformers import AutoModelForCausalLM

    with init_empty_weights(include_buffers=False):
        model = AutoModelForCausalLM.from_config(config, trust_remote_code=False)
    pruned = dict(cfg.get("pruned") or {})
    if widths is not None:
        shapes = per_layer_shapes(model, widths)
        for fqn, shape in pruned.items():  # gac_config.json's record must agree with config.json
            try:
                mod = model.get_submodule(fqn)
            except AttributeError:
                raise GacError(
                    f"{GAC_CONFIG} names pruned module {fqn!r}, absent from the architecture"
                ) from None
            if list(shapes.get(fqn, [mod.out_features, mod.in_features])) != list(shape):
                raise GacError(
                    f"{path}: config.json's per_layer_config gives {fqn} the shape "
                    f"{shapes.get(fqn, [mod.out_features, mod.in_features])}, {GAC_CONFIG} records {list(shape)}"
                )
        pruned = shapes
    if pruned:
        _apply_pruned_shapes(model, pruned)
    for site in cfg.get("factorized", []):
        try:
            model.get_submodule(site["name"])
        except AttributeError:
            raise GacError(
                f"{path / GAC_CONFIG} names site {site['name']!r}, absent from the architecture"
            ) from None
        replace_module(
            model,
            site["name"],
            FactorizedLinear(
                site["in_features"], site["rank"], site["out_features"], bias=site["bias"], device="meta"
            ),
        )
    for entry in cfg.get("modules", []):
        cls = _skeleton_class(str(entry.get("class", "")), path)
        try:
            original = model.get_submodule(entry["name"])
        except AttributeError:
            raise GacError(
                f"{path / GAC_CONFIG} names module {entry['name']!r}, absent from the architecture"
            ) from None
        replace_module(model, entry["name"], cls.skeleton(entry["spec"], original, model_rotary(model)))
    return model


def _assign_weights(model: nn.Module, path: Path, cfg: dict[str, Any]) -> dict[str, torch.Tensor]:
    """Check the saved tensors against the skeleton and assign them (tied ones shared, buffers set);
    returns the saved buffers."""
    tensors = _read_weights(path)
    buffers = {k.removeprefix(BUFFER_PREFIX): v for k, v in tensors.items() if k.startswith(BUFFER_PREFIX)}
    params = {k: v for k, v in tensors.items() if not k.startswith(BUFFER_PREFIX)}
    tied: dict[str, str] = cfg.get("tied", {})
    expected = set(model.state_dict())
    missing = expected - set(params) - set(tied)
    unexpected = set(params) - expected
    if missing:
        raise GacError(
            f"{path}: the weights lack {len(missing)} tensor(s), e.g. {min(missing)} (missing shard?)"
        )
    if unexpected:
        raise GacError(
            f"{path}: the weights hold {len(unexpected)} unknown tensor(s), e.g. {min(unexpected)}"
        )
    for k, t in params.items():
        ref = model.get_parameter(k) if _is_param(model, k) else None
        if ref is not None and tuple(ref.shape) != tuple(t.shape):
            raise GacError(
                f"{path}: tensor {k} has shape {tuple(t.shape)}, the skeleton expects {tuple(ref.shape)}"
            )
    model.load_state_dict(params, strict=False, assign=True)
    for dst, src in tied.items():
        src_mod, _, src_attr = src.rpartition(".")
        holder = model.get_submodule(src_mod) if src_mod else model
        _set_tensor(model, dst, getattr(holder, src_attr))
    for k, b in buffers.items():
        _set_tensor(model, k, b)
    leftover = [
        n for n, t in list(model.named_parameters()) + list(model.named_buffers()) if t.device.type == "meta"
    ]
    if leftover:
        raise GacError(f"{path}: {len(leftover)} tensor(s) were not loaded, e.g. {leftover[0]}")
    return buffers


def _is_param(model: nn.Module, fqn: str) -> bool:
    mod_name, _, attr = fqn.rpartition(".")
    try:
        mod = model.get_submodule(mod_name) if mod_name else model
    except AttributeError:
        return False
    return attr in mod._parameters


def is_gac_dir(path: str | Path) -> bool:
    """True when ``path`` is a directory written by :func:`save`."""
    return os.path.isfile(Path(path) / GAC_CONFIG)
