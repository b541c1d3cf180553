"""What ``--variant`` names: ``baseline``, a saved model directory, or a compression SPEC.

* ``baseline``: the ``--baseline-model-id`` model as is;
* a directory: a model saved by ``gac compress`` (or any model directory :func:`gac.models.load_model` reads);
* ``COMPRESSOR:RATIO:ALIGN[:PROFILE]``, e.g. ``asvd:0.85:gac``: the baseline model, compressed on
  the fly in place with :func:`gac.api.compress_` (``RATIO`` = fraction of the targeted
  parameters kept; ``ALIGN`` = ``none | round | gac | gac-latency``).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from gac.api import CompressConfig, compress_
from gac.errors import GacError
from gac.models.loading import load_model

_SPEC = re.compile(
    r"^(?P<comp>[A-Za-z][\w-]*):(?P<ratio>[0-9.]+)(?::(?P<align>[\w-]+))?(?::(?P<profile>.+))?$"
)


@dataclass
class VariantSpec:
    """A parsed ``--variant``."""

    kind: str  # "baseline" | "dir" | "spec"
    text: str
    path: Path | None = None
    compressor: str | None = None
    ratio: float | None = None
    align: str = "gac"
    profile: str | None = None

    @property
    def name(self) -> str:
        if self.kind == "dir" and self.path is not None:
            return self.path.name
        return self.text


@dataclass
class LoadedVariant:
    model: nn.Module
    tokenizer: Any
    info: dict[str, Any] = field(default_factory=dict)


def parse_variant(text: str) -> VariantSpec:
    """Parse ``baseline``, a directory or a SPEC. Raises :class:`GacError` on anything else."""
    t = str(text).strip()
    if t == "baseline":
        return VariantSpec("baseline", t)
    p = Path(t).expanduser()
    if p.exists():
        if not p.is_dir():
            raise GacError(f"variant {t} is a file, not a model directory")
        has = [n for n in ("config.json", "gac_config.json", "gac_repair.json") if (p / n).is_file()]
        if not has and not list(p.glob("*.gguf")):
            raise GacError(
                f"variant {t} is not a model directory (no config.json or gac_config.json in it); "
                "pass 'baseline', a directory written by `gac compress`, or a SPEC like asvd:0.85:gac"
            )
        return VariantSpec("dir", t, path=p)
    m = _SPEC.match(t)
    if m and not ("/" in t or t.startswith(".")):
        try:
            ratio = float(m["ratio"])
        except ValueError:
            raise GacError(f"variant {t}: ratio {m['ratio']!r} is not a number") from None
        if not 0.0 < ratio < 1.0:
            raise GacError(
                f"variant {t}: the ratio (fraction of parameters kept) must lie in (0, 1), got {ratio}"
            )
        return VariantSpec(
            "spec", t, compressor=m["comp"], ratio=ratio, align=m["align"] or "gac", profile=m["profile"]
        )
    raise GacError(
        f"variant {t!r} is neither 'baseline', an existing model directory, nor a SPEC "
        "COMPRESSOR:RATIO:ALIGN (e.g. asvd:0.85:gac)"
    )


def _param_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def load_variant(
    spec: VariantSpec,
    baseline_model_id: str | None,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    compress_options: dict[str, Any] | None = None,
) -> LoadedVariant:
    """Load (and, for a SPEC, compress) the model that ``spec`` names.

    Returns the model, its tokenizer (from the variant, else from the baseline) and an info
    record: ``variant``, ``kind``, ``params``, ``baseline_params``, ``param_ratio`` and, when
    known, ``pct_aligned`` and the compression report.
    """
    info: dict[str, Any] = {"variant": spec.name, "spec": spec.text, "kind": spec.kind}
    if spec.kind in ("baseline", "spec"):
        if not baseline_model_id:
            raise GacError(f"variant {spec.text} needs --baseline-model-id")
        lm = load_model(baseline_model_id, dtype=dtype, device=device)
        info["baseline_model_id"] = baseline_model_id
        info["baseline_params"] = _param_count(lm.model)
        if spec.kind == "spec":
            cfg = CompressConfig(
                compressor=spec.compressor or "asvd",
                param_ratio=float(spec.ratio or 0.85),
                align=spec.align,
                profile=spec.profile,
                **(compress_options or {}),
            )
            report = compress_(lm.model, cfg, tokenizer=lm.tokenizer)
            info["compression"] = report.to_dict()
            info["pct_aligned"] = report.pct_aligned
            info["predicted_speedup"] = report.predicted_speedup
        info["params"] = _param_count(lm.model)
        info["param_ratio"] = info["params"] / info["baseline_params"]
        return LoadedVariant(lm.model, lm.tokenizer, info)
    assert spec.path is not None
    lm = load_model(spec.path, dtype=dtype, device=device)
    tok = lm.tokenizer
    if tok is None and baseline_model_id:
        tok = load_model(baseline_model_id, device="cpu").tokenizer
    info["params"] = _param_count(lm.model)
    gcfg = spec.path / "gac_config.json"
    if gcfg.is_file():
        g = json.loads(gcfg.read_text())
        info["pct_aligned"] = g.get("pct_aligned")
        info["predicted_speedup"] = g.get("predicted_speedup")
        info["gac_config"] = {
            k: g.get(k) for k in ("compressor", "param_ratio", "align", "profile_id", "base_model")
        }
    if baseline_model_id:
        info["baseline_model_id"] = baseline_model_id
    return LoadedVariant(lm.model, tok, info)
