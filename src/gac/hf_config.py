"""The wrapping ``config.json`` of a gac directory, torch-free.

A directory whose skeleton differs from its base architecture (factorized low-rank layers, PaLU's
latent attention, per-layer pruned widths held in the wrapper) is saved with::

    {"model_type": "gac", "architectures": ["GacForCausalLM"], "gac_base": {...the base config...}}

:mod:`gac.io` writes and reads it; :mod:`gac.hf_auto` registers it with ``transformers``' Auto
classes (``import gac`` imports this module, so it imports neither torch nor transformers at module
level).
"""

from __future__ import annotations

import json
import os
from typing import Any

from gac.errors import GacError

MODEL_TYPE = "gac"
ARCHITECTURE = "GacForCausalLM"
BASE_KEY = "gac_base"


def wrap_config(base: Any) -> dict[str, Any]:
    """The ``config.json`` content of a gac directory whose base config is ``base``."""
    import transformers

    return {
        "model_type": MODEL_TYPE,
        "architectures": [ARCHITECTURE],
        BASE_KEY: base.to_dict(),
        "transformers_version": transformers.__version__,
    }


def base_config(doc: dict[str, Any]) -> Any:
    """The base architecture's config from a wrapping ``config.json`` dict."""
    from transformers import CONFIG_MAPPING

    base = dict(doc[BASE_KEY])
    mt = base.get("model_type")
    if mt not in CONFIG_MAPPING:
        raise GacError(f"the base model_type {mt!r} of this gac directory is unknown to transformers")
    return CONFIG_MAPPING[mt].from_dict(base)


def is_per_layer_dir(path: Any) -> bool:
    """A local gac directory whose ``config.json`` is a base config with ``per_layer_config``."""
    if not isinstance(path, (str, os.PathLike)) or not os.path.isdir(path):
        return False
    cfg = os.path.join(path, "config.json")
    if not (os.path.isfile(os.path.join(path, "gac_config.json")) and os.path.isfile(cfg)):
        return False
    try:
        with open(cfg) as f:
            doc = json.load(f)
    except (OSError, ValueError):
        return False
    return isinstance(doc, dict) and doc.get("model_type") != MODEL_TYPE and "per_layer_config" in doc
