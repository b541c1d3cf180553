"""Spread a loaded model over several devices for evaluation (``accelerate``'s ``device_map``).

:func:`dispatch_` places whole decoder layers (never half a layer) on the devices of
``max_memory`` in order, with ``accelerate.infer_auto_device_map``, and installs accelerate's hooks
(``dispatch_model``) so activations follow the layers: GPUs first, then CPU memory, then a disk
folder when ``"disk"`` is given. It works for dense and gac models alike (factorized layers, PaLU's
latent attention and pruned widths are ordinary submodules of their decoder layer).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from torch import nn

from gac.errors import GacError

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(GiB|MiB|KiB|GB|MB|KB|B)?\s*$", re.I)


def parse_max_memory(spec: str) -> dict[int | str, str]:
    """``"0=20GiB,1=20GiB,cpu=64GiB"`` -> accelerate's ``max_memory`` dict.

    >>> parse_max_memory("0=20GiB, cpu=1.5GiB")
    {0: '20GiB', 'cpu': '1.5GiB'}
    """
    out: dict[int | str, str] = {}
    for part in (p for p in spec.split(",") if p.strip()):
        if "=" not in part:
            raise GacError(f"--max-memory entry {part.strip()!r} is not DEVICE=SIZE (e.g. 0=20GiB)")
        dev, size = (x.strip() for x in part.split("=", 1))
        if not _SIZE.match(size):
            raise GacError(f"--max-memory size {size!r} is not a size such as 20GiB or 512MiB")
        key: int | str = int(dev) if dev.isdigit() else dev
        if isinstance(key, str) and key not in ("cpu", "disk", "mps"):
            raise GacError(f"--max-memory device {dev!r} is not a GPU index, cpu or disk")
        out[key] = size
    if not out:
        raise GacError("--max-memory is empty")
    return out


def decoder_layer_classes(model: nn.Module) -> list[str]:
    """Class names of the model's decoder layers (kept whole by the device map)."""
    from gac.models.adapters import get_adapter

    layers = model.get_submodule(get_adapter(model).layers_fqn)
    return sorted({type(layer).__name__ for layer in layers})


def dispatch_(
    model: nn.Module, max_memory: dict[int | str, str], offload_dir: str | Path | None = None
) -> dict[str, Any]:
    """Place ``model`` over the devices of ``max_memory`` (in place) and return the device map.

    Raises:
        GacError: a GPU index that does not exist, or ``disk`` without ``offload_dir``.
    """
    import torch
    from accelerate import dispatch_model, infer_auto_device_map

    n_gpu = torch.cuda.device_count()
    bad = [k for k in max_memory if isinstance(k, int) and k >= n_gpu]
    if bad:
        raise GacError(f"--max-memory names GPU {bad[0]}, but this machine has {n_gpu} GPU(s)")
    if "disk" in max_memory and offload_dir is None:
        raise GacError("--max-memory with disk needs an offload folder (--offload-dir)")
    mem = {k: v for k, v in max_memory.items() if k != "disk"}
    dmap = infer_auto_device_map(model, max_memory=mem, no_split_module_classes=decoder_layer_classes(model))
    if "disk" in dmap.values() and "disk" not in max_memory:
        raise GacError("the model does not fit the --max-memory devices (add cpu or disk memory)")
    tied = getattr(model, "_tied_weights_keys", None)
    if tied and len(set(dmap.values())) > 1:
        model.tie_weights()
    dispatch_model(model, device_map=dmap, offload_dir=str(offload_dir) if offload_dir else None)
    return dict(dmap)
