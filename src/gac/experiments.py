"""Declarative experiment plans: ``gac run PLAN.toml``.

A plan is a TOML file whose axes expand into *cells*; each cell is one model compressed by one
compressor at one parameter ratio with one align strategy (plus one dense ``base`` cell per model),
evaluated by every entry of ``[[evals]]``. Each finished cell is one JSON file written atomically
under ``PLAN_DIR/cells/`` with its environment, its command and the hash of its inputs, so

* a re-run skips finished cells (same input hash) and re-runs failed or missing ones;
* a killed run loses at most the cell in progress;
* shared work is done once: the cells of one (model, compressor, ratio) form a *group* whose one
  calibration / sensitivity pass (:func:`gac.api.plan`) serves every align strategy, each applied
  to a deep copy of the calibrated model, as ``gac demo`` does.

Plan format (every key is checked; unknown keys are refused)::

    [plan]
    name = "demo"                       # PLAN_DIR defaults to runs/<name>
    device = "cpu"                      # cpu | cuda | auto
    dtype = "float32"                   # float32 | bfloat16 | float16 | auto

    [axes]
    models = ["smollm2"]                # aliases, paths, hub ids, tiny:<family> (built in code) or
                                        # shape:NAME[:LAYERS[:SCALE]] (a real shape, random weights)
    compressors = ["*"]                 # "*": every registered compressor
    ratios = [0.9]                      # fraction of targeted parameters kept, in (0, 1)
    align = ["none", "knapsack", "gac"]   # + "gac-allow-slower": gac without its latency guard

    [compress]                          # CompressConfig fields shared by every cell
    profile = "h200-bfloat16"
    n_samples = 16
    seq_len = 128
    serve = "prefill:1x128,decode:16"   # the serving shapes gac is guarded at (default: the grid)
    allow_slower = false                # true: every gac cell without its latency guard

    [compress.options.asvd]             # per-compressor options (constructor arguments)
    sensitivity_samples = 1

    [[evals]]
    kind = "ppl"                        # ppl | predict | infer
    source = "britannica"
    seq_len = 256
    windows = 4
    models = ["smollm2"]                # optional: only these models of the axis

    [[evals]]
    kind = "infer"                      # timed prefill/decode grid, the default `gac eval infer` path
    prefill_batches = [8]               # (fused q/k/v + gate/up, compile + CUDA graphs on CUDA;
                                        #  fuse/compile/graphs = false turn each off)
    prefill_seqs = [2048]
    decode_batches = [1]
    decode_kv = [512]

    [[benches]]                         # kernel-level: one `gac bench` experiment per cell
    experiment = "padding_rescue"       # + its size options (dims, batch, seq_len, heads, m, k, n,
                                        #   half_window); raw files under PLAN_DIR/kernels/<name>/

    [slurm]                             # --executor slurm
    partition = "gpu"
    gpus = 1
    time_min = 60
    mem_gb = 64

The cell JSON (schema ``gac.cell/1``) keeps deterministic ``results`` apart from ``timings`` and
``env``, so two runs of a plan can be compared result for result.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import shlex
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gac.errors import GacError
from gac.runtime import fastpath
from gac.runtime.fastpath import FastPath

try:  # Python 3.11+
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

PLAN_SCHEMA = "gac.plan/1"
CELL_SCHEMA = "gac.cell/1"

#: The keys a plan may hold, per table (anything else is refused before any work).
PLAN_KEYS = {"name", "device", "dtype", "seed"}
AXES_KEYS = {"models", "compressors", "ratios", "align"}
COMPRESS_KEYS = {
    "profile", "calib", "n_samples", "seq_len", "batch_size", "tokens", "candidates",
    "objective", "window", "calib_seed", "latency_target", "quality_target", "options", "serve",
    "allow_slower",
}  # fmt: skip
#: align-axis entries beyond the strategies: ``gac`` without its latency guard (``--allow-slower``)
ALIGN_VARIANTS = {"gac-allow-slower": ("gac", {"allow_slower": True})}
EVAL_KINDS = {
    "ppl": {"kind", "source", "seq_len", "windows", "batch_size", "models"},
    "predict": {"kind", "tokens", "models"},
    "infer": {
        "kind", "models", "prefill_batches", "prefill_seqs", "decode_batches", "decode_kv",
        "prefill_reps", "decode_reps", *fastpath.plan_keys(),
        "capacity_context", "memory_budget_gib",
    },
}  # fmt: skip
#: ``[[benches]]``: one ``gac bench`` experiment per cell (kernel-level tables), sizes as its CLI.
BENCH_KEYS = {"experiment", "name", "dims", "batch", "seq_len", "heads", "m", "k", "n", "half_window"}
BENCH = "kernels"
SLURM_KEYS = {"partition", "gpus", "cpus", "time_min", "mem_gb", "array_parallelism", "setup"}
TOP_KEYS = {"plan", "axes", "compress", "evals", "benches", "slurm", "published"}
DEVICES = ("cpu", "cuda", "auto")
DTYPES = ("float32", "bfloat16", "float16", "auto")
TINY = re.compile(r"^tiny:([a-z0-9]+)$")
BASE = "base"


def _refuse_unknown(d: dict[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(set(d) - allowed)
    if unknown:
        raise GacError(f"plan: unknown key {unknown[0]!r} in {where}; allowed: {', '.join(sorted(allowed))}")


def _list(v: Any, where: str) -> list[Any]:
    if isinstance(v, (str, int, float)):
        v = [v]
    if not isinstance(v, list) or not v:
        raise GacError(f"plan: {where} must be a non-empty list")
    return v


def slug(s: str) -> str:
    """A file-name-safe form of a model spec (``HuggingFaceTB/SmolLM2`` -> ``HuggingFaceTB--SmolLM2``)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", s.replace("/", "--")).strip("-") or "model"


def check_model_spec(spec: str) -> None:
    """Refuse a model spec that cannot name a model (cheap checks only: nothing is loaded)."""
    from gac.models.loading import ALIASES, HUB_ID
    from gac.models.shapes import parse_shape_spec

    try:
        if parse_shape_spec(spec) is not None:
            return
    except GacError as e:
        raise GacError(f"plan: {e}") from None
    m = TINY.match(spec)
    if m:
        from gac.testing import FAMILIES

        if m.group(1) not in FAMILIES:
            raise GacError(f"plan: unknown tiny model family {m.group(1)!r}; known: {', '.join(FAMILIES)}")
        return
    if spec.lower() in ALIASES:
        return
    p = Path(spec).expanduser()
    if p.exists():
        return
    if spec.startswith((".", "/", "~")) or "/" not in spec or not HUB_ID.match(spec):
        raise GacError(
            f"plan: unknown model {spec!r}: not an alias ({', '.join(ALIASES)}), tiny:<family>, "
            "an existing path or a hub id (owner/name)"
        )


# ------------------------------------------------------------------------------------ plan
@dataclass
class Cell:
    """One result file: ``model`` x ``compressor`` x ``ratio`` x ``align`` (``base``: dense)."""

    model: str
    compressor: str
    ratio: float
    align: str
    #: ``[[benches]]`` entry name for a kernel-level cell (then model/compressor/ratio/align are unused)
    bench: str | None = None

    @property
    def id(self) -> str:
        if self.bench is not None:
            return f"{BENCH}/{self.bench}"
        if self.compressor == BASE:
            return f"{slug(self.model)}/base"
        return f"{slug(self.model)}/{self.compressor}-r{self.ratio:g}-{self.align}"

    @property
    def group(self) -> str:
        """Cells of one group share one calibration (one :func:`gac.api.plan`)."""
        if self.bench is not None:
            return self.id
        if self.compressor == BASE:
            return f"{slug(self.model)}/base"
        return f"{slug(self.model)}/{self.compressor}-r{self.ratio:g}"

    def to_dict(self) -> dict[str, Any]:
        if self.bench is not None:
            return {"bench": self.bench}
        return {"model": self.model, "compressor": self.compressor, "ratio": self.ratio, "align": self.align}


@dataclass
class ExperimentPlan:
    """A parsed, validated plan (see the module docstring)."""

    name: str
    models: list[str]
    compressors: list[str]
    ratios: list[float]
    aligns: list[str]
    device: str = "cpu"
    dtype: str = "float32"
    compress: dict[str, Any] = field(default_factory=dict)
    options: dict[str, dict[str, Any]] = field(default_factory=dict)
    evals: list[dict[str, Any]] = field(default_factory=list)
    #: ``[[benches]]``: kernel-level experiments, one cell each (keyed by their ``name``)
    benches: list[dict[str, Any]] = field(default_factory=list)
    slurm: dict[str, Any] = field(default_factory=dict)
    published: dict[str, Any] = field(default_factory=dict)
    source: str = ""
    #: the compressors axis as written (``["*"]`` stays ``["*"]`` in the plan's hash, so a newly
    #: registered compressor adds cells to an existing plan directory instead of orphaning it)
    compressors_spec: list[str] = field(default_factory=list)

    # -- identity
    def to_dict(self) -> dict[str, Any]:
        """Everything that defines the results (not the Slurm resources, not the source path)."""
        extra = {"benches": self.benches} if self.benches else {}  # older plans keep their hash
        return {
            **extra,
            "name": self.name,
            "models": self.models,
            "compressors": self.compressors_spec or self.compressors,
            "ratios": self.ratios,
            "aligns": self.aligns,
            "device": self.device,
            "dtype": self.dtype,
            "compress": self.compress,
            "options": self.options,
            "evals": self.evals,
        }

    @property
    def hash(self) -> str:
        return _hash(self.to_dict())

    # -- expansion
    def cells(self) -> list[Cell]:
        """Every cell, in run order: per model its ``base`` cell, then its groups."""
        out = [Cell(BENCH, BENCH, 1.0, BENCH, bench=b["name"]) for b in self.benches]
        for m in self.models:
            out.append(Cell(m, BASE, 1.0, BASE))
            for c in self.compressors:
                for r in self.ratios:
                    out += [Cell(m, c, r, a) for a in self.aligns]
        return out

    def groups(self, only: list[str] | None = None) -> dict[str, list[Cell]]:
        """Cells by group; ``only`` (shell patterns over cell and group ids) keeps matching groups."""
        import fnmatch

        g: dict[str, list[Cell]] = {}
        for c in self.cells():
            g.setdefault(c.group, []).append(c)
        if only:
            g = {k: v for k, v in g.items()
                 if any(fnmatch.fnmatchcase(x, p) for p in only for x in (k, *(c.id for c in v)))}  # fmt: skip
        return g

    def cell_inputs(self, cell: Cell) -> dict[str, Any]:
        """What a cell's result depends on (hashed into ``input_hash``)."""
        if cell.bench is not None:
            b = next(b for b in self.benches if b["name"] == cell.bench)
            return {"cell": cell.to_dict(), "device": self.device, "dtype": self.dtype, "bench": b}
        d: dict[str, Any] = {
            "cell": cell.to_dict(),
            "device": self.device,
            "dtype": self.dtype,
            "evals": self.evals,
        }
        if cell.compressor != BASE:
            d["compress"] = self.compress
            d["options"] = self.options.get(cell.compressor, {})
        else:
            d["profile"] = self.compress.get("profile")
        return d

    def compress_config(self, cell: Cell) -> Any:
        from gac.api import CompressConfig

        kw = {k: v for k, v in self.compress.items() if k != "options"}
        return CompressConfig(
            compressor=cell.compressor,
            param_ratio=cell.ratio,
            align="gac" if kw.get("allow_slower") else "none",
            options=dict(self.options.get(cell.compressor, {})),
            **kw,
        )


def _hash(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def parse_plan(data: dict[str, Any], source: str = "") -> ExperimentPlan:
    """Validate a plan's TOML data and return the plan; raises :class:`GacError` on bad input."""
    from gac.allocation import STRATEGIES
    from gac.compressors.base import available_compressors, get_compressor

    _refuse_unknown(data, TOP_KEYS, "the plan's top level")
    for t in ("plan", "axes", "compress", "slurm", "published"):
        if t in data and not isinstance(data[t], dict):
            raise GacError(f"plan: [{t}] must be a table")
    meta = data.get("plan", {})
    _refuse_unknown(meta, PLAN_KEYS, "[plan]")
    name = str(meta.get("name") or Path(source).stem or "plan")
    if not re.match(r"^[A-Za-z0-9._-]+$", name):
        raise GacError(f"plan: [plan] name must be a plain file name, got {name!r}")
    device = str(meta.get("device", "cpu"))
    if device not in DEVICES:
        raise GacError(f"plan: [plan] device must be one of {', '.join(DEVICES)}, got {device!r}")
    dtype = str(meta.get("dtype", "float32"))
    if dtype not in DTYPES:
        raise GacError(f"plan: [plan] dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")

    if "axes" not in data:
        raise GacError("plan: no [axes] table (models, compressors, ratios, align)")
    axes = data["axes"]
    _refuse_unknown(axes, AXES_KEYS, "[axes]")
    models = [str(m) for m in _list(axes.get("models"), "[axes] models")]
    for m in models:
        check_model_spec(m)
    known = available_compressors()
    comps = [str(c) for c in _list(axes.get("compressors", ["*"]), "[axes] compressors")]
    spec = list(comps)
    comps = known if comps == ["*"] else comps
    for c in comps:
        if c not in known:
            raise GacError(f"plan: unknown compressor {c!r}; available: {', '.join(known)}")
    ratios = []
    for r in _list(axes.get("ratios"), "[axes] ratios"):
        if isinstance(r, bool) or not isinstance(r, (int, float)) or not math.isfinite(r) or not 0 < r < 1:
            raise GacError(
                f"plan: [axes] ratios must lie strictly between 0 and 1 (fraction kept), got {r!r}"
            )
        ratios.append(float(r))
    aligns = [str(a) for a in _list(axes.get("align", ["none", "knapsack", "gac"]), "[axes] align")]
    for a in aligns:
        if a not in STRATEGIES and a not in ALIGN_VARIANTS:
            raise GacError(
                f"plan: unknown align strategy {a!r}; choose from: {', '.join((*STRATEGIES, *ALIGN_VARIANTS))}"
            )
    for what, xs in (("models", models), ("compressors", comps), ("ratios", ratios), ("align", aligns)):
        if len(set(xs)) != len(xs):
            raise GacError(f"plan: [axes] {what} lists a value twice")

    compress = dict(data.get("compress", {}))
    _refuse_unknown(compress, COMPRESS_KEYS, "[compress]")
    options = compress.pop("options", {}) or {}
    if not isinstance(options, dict) or any(not isinstance(v, dict) for v in options.values()):
        raise GacError("plan: [compress.options] must hold one table per compressor")
    for c, o in options.items():
        if c not in known:
            raise GacError(f"plan: options for unknown compressor {c!r}; available: {', '.join(known)}")
        get_compressor(c, **o)  # validates the option names and types now, before any work
    plan = ExperimentPlan(
        name=name, models=models, compressors=comps, ratios=ratios, aligns=aligns,
        device=device, dtype=dtype, compress=compress,
        options={c: options[c] for c in sorted(options) if c in comps}, source=source,
        compressors_spec=spec,
    )  # fmt: skip
    for c in comps:  # every CompressConfig field checked (range, names) before any work
        for r in ratios:
            try:
                plan.compress_config(Cell(models[0], c, r, "none"))
            except TypeError as e:
                raise GacError(f"plan: bad [compress] settings: {e}") from None

    evals = data.get("evals", [{"kind": "predict"}])
    if isinstance(evals, dict):
        evals = [evals]
    if not isinstance(evals, list) or not all(isinstance(e, dict) for e in evals):
        raise GacError("plan: [[evals]] must be an array of tables")
    for i, e in enumerate(evals):
        kind = e.get("kind")
        ms = e.get("models")
        if ms is not None:
            ms = _list(ms, f"[[evals]] #{i + 1} models")
            for m in ms:
                if m not in models:
                    raise GacError(f"plan: [[evals]] #{i + 1}: model {m!r} is not on the [axes] models axis")
        if kind not in EVAL_KINDS:
            raise GacError(f"plan: [[evals]] #{i + 1}: unknown kind {kind!r}; known: {', '.join(EVAL_KINDS)}")
        _refuse_unknown(e, EVAL_KINDS[kind], f"[[evals]] #{i + 1} ({kind})")
        for k in ("seq_len", "windows", "batch_size", "tokens"):
            v = e.get(k)
            if v is not None and (
                isinstance(v, bool) or not isinstance(v, int) or v < (2 if k == "seq_len" else 1)
            ):
                raise GacError(f"plan: [[evals]] #{i + 1}: {k} must be a positive integer, got {v!r}")
        if kind == "infer":
            for k in ("prefill_batches", "prefill_seqs", "decode_batches", "decode_kv"):
                if k in e:
                    v = e[k] if isinstance(e[k], list) else None
                    if v is None or any(isinstance(x, bool) or not isinstance(x, int) or x < 1 for x in v):
                        raise GacError(f"plan: [[evals]] #{i + 1}: {k} must be a list of positive integers")
            for k in ("prefill_reps", "decode_reps", "capacity_context"):
                v = e.get(k)
                if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                    raise GacError(f"plan: [[evals]] #{i + 1}: {k} must be a positive integer, got {v!r}")
            for k in sorted(fastpath.plan_keys()):
                if k in e and not isinstance(e[k], bool):
                    raise GacError(f"plan: [[evals]] #{i + 1}: {k} must be true or false")
            mb = e.get("memory_budget_gib")
            if mb is not None and (isinstance(mb, bool) or not isinstance(mb, int | float) or mb <= 0):
                raise GacError(
                    f"plan: [[evals]] #{i + 1}: memory_budget_gib must be a positive number, got {mb!r}"
                )
        if kind == "ppl":
            src = str(e.get("source", "britannica"))
            if src not in ("britannica", "shakespeare", "wikitext2", "c4") and not src.startswith("text:"):
                raise GacError(f"plan: [[evals]] #{i + 1}: unknown ppl source {src!r}")
    plan.evals = [dict(e) for e in evals]
    plan.benches = _parse_benches(data.get("benches", []))

    slurm = dict(data.get("slurm", {}))
    _refuse_unknown(slurm, SLURM_KEYS, "[slurm]")
    for k in ("gpus", "cpus", "time_min", "mem_gb", "array_parallelism"):
        v = slurm.get(k)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < (0 if k == "gpus" else 1)):
            raise GacError(
                f"plan: [slurm] {k} must be a {'non-negative' if k == 'gpus' else 'positive'} integer"
            )
    plan.slurm = slurm
    plan.published = dict(data.get("published", {}))
    return plan


def _parse_benches(benches: Any) -> list[dict[str, Any]]:
    """Validate ``[[benches]]``: a known experiment, sizes as ``gac bench`` takes them, unique names."""
    from gac.hardware.sweeps import EXPERIMENTS, parse_dims

    if isinstance(benches, dict):
        benches = [benches]
    if not isinstance(benches, list) or not all(isinstance(b, dict) for b in benches):
        raise GacError("plan: [[benches]] must be an array of tables")
    out, names = [], set()
    for i, b in enumerate(benches):
        _refuse_unknown(b, BENCH_KEYS, f"[[benches]] #{i + 1}")
        exp = b.get("experiment")
        if exp not in EXPERIMENTS:
            raise GacError(
                f"plan: [[benches]] #{i + 1}: unknown experiment {exp!r}; known: {', '.join(EXPERIMENTS)}"
            )
        name = str(b.get("name", exp))
        if not re.match(r"^[A-Za-z0-9._-]+$", name) or name in names:
            raise GacError(f"plan: [[benches]] #{i + 1}: name {name!r} must be a unique plain file name")
        names.add(name)
        for k in ("batch", "seq_len", "heads", "m", "k", "n", "half_window"):
            v = b.get(k)
            if v is not None and (
                isinstance(v, bool) or not isinstance(v, int) or v < (0 if k == "half_window" else 1)
            ):
                raise GacError(f"plan: [[benches]] #{i + 1}: {k} must be a positive integer, got {v!r}")
        if "dims" in b:
            try:
                parse_dims(str(b["dims"]))
            except GacError as e:
                raise GacError(f"plan: [[benches]] #{i + 1}: {e}") from None
        out.append({**b, "name": name})
    return out


def load_plan(path: str | Path) -> ExperimentPlan:
    """Read and validate ``path`` (a TOML plan)."""
    p = Path(path)
    if not p.is_file():
        raise GacError(f"plan: {p} is not a file")
    try:
        data = tomllib.loads(p.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise GacError(f"plan: {p} is not valid TOML: {e}") from None
    return parse_plan(data, str(p))


# ------------------------------------------------------------------------------- plan dir
def cell_path(plan_dir: Path, cell: Cell) -> Path:
    return plan_dir / "cells" / f"{cell.id}.json"


def read_cell(plan_dir: Path, cell: Cell) -> dict[str, Any] | None:
    p = cell_path(plan_dir, cell)
    try:
        d = json.loads(p.read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        return None
    return d if isinstance(d, dict) and d.get("schema") == CELL_SCHEMA else None


def cell_state(plan: ExperimentPlan, plan_dir: Path, cell: Cell) -> str:
    """``done`` (ok, same inputs), ``failed``, ``stale`` (other inputs) or ``pending``."""
    d = read_cell(plan_dir, cell)
    if d is None:
        return "pending"
    if d.get("input_hash") != _hash(plan.cell_inputs(cell)):
        return "stale"
    return "done" if d.get("status") == "ok" else "failed"


def open_plan_dir(plan: ExperimentPlan, plan_dir: str | Path, create: bool = True) -> Path:
    """Check (and create) ``plan_dir``; refuse one written by another plan (hash mismatch)."""
    from gac.utils import atomic_write_text

    d = Path(plan_dir)
    meta = d / "plan.json"
    if meta.exists():
        try:
            old = json.loads(meta.read_text())
        except (OSError, json.JSONDecodeError, UnicodeDecodeError):
            raise GacError(f"{meta} is not a gac plan record; choose another --out") from None
        if old.get("schema") != PLAN_SCHEMA or old.get("plan_hash") != plan.hash:
            raise GacError(
                f"{d} holds the results of another plan (hash {old.get('plan_hash')}, this plan "
                f"{plan.hash}); choose another --out"
            )
        return d
    if d.exists() and any(d.iterdir()):
        raise GacError(f"{d} exists and is not a plan directory (no plan.json); choose another --out")
    if create:
        d.mkdir(parents=True, exist_ok=True)
        rec = {"schema": PLAN_SCHEMA, "plan_hash": plan.hash, "source": plan.source, "plan": plan.to_dict(),
               "published": plan.published, "slurm": plan.slurm}  # fmt: skip
        atomic_write_text(meta, json.dumps(rec, indent=1, default=str))
    return d


def plan_from_dir(plan_dir: str | Path) -> ExperimentPlan:
    """The plan recorded in ``plan_dir/plan.json`` (used by Slurm jobs and ``gac report``)."""
    meta = Path(plan_dir) / "plan.json"
    try:
        rec = json.loads(meta.read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        raise GacError(f"{plan_dir} is not a plan directory (no readable plan.json)") from None
    p = rec["plan"]
    data = {
        "plan": {"name": p["name"], "device": p["device"], "dtype": p["dtype"]},
        "axes": {
            "models": p["models"],
            "compressors": p["compressors"],
            "ratios": p["ratios"],
            "align": p["aligns"],
        },
        "compress": {**p["compress"], **({"options": p["options"]} if p["options"] else {})},
        "evals": p["evals"],
        **({"benches": p["benches"]} if p.get("benches") else {}),
        "slurm": rec.get("slurm") or {},
        "published": rec.get("published") or {},
    }
    return parse_plan(data, rec.get("source", ""))


# ---------------------------------------------------------------------------- execution
def _load(spec: str, dtype: Any, device: str) -> tuple[Any, Any]:
    m = TINY.match(spec)
    if m:
        from gac.testing import char_tokenizer, tiny_model

        model = tiny_model(m.group(1), dtype=dtype).to(device)
        return model, char_tokenizer()
    from gac.models import load_model

    lm = load_model(spec, dtype=dtype, device=device)
    return lm.model, lm.tokenizer


def _infer(model: Any, e: dict[str, Any], label: str) -> dict[str, Any]:
    """The ``infer`` eval: the default ``gac eval infer`` path — q/k/v and gate/up fused (exact, in
    place: later evals see the same function), then :func:`gac.eval.infer.sweep_model` (compile +
    CUDA graphs on CUDA). ``fuse``, ``compile``, ``graphs`` = false turn each off."""
    from gac.eval.infer import SweepConfig, copy_bandwidth, model_device, sweep_model

    fast = FastPath(**{k: e[k] for k in fastpath.plan_keys() if k in e})
    fused = []
    if fast.fuse:
        from gac.nn.fused import fuse_projections_

        fused = fuse_projections_(model)

    grid = {
        k: tuple(e[k]) for k in ("prefill_batches", "prefill_seqs", "decode_batches", "decode_kv") if k in e
    }
    reps = {k: e[k] for k in ("prefill_reps", "decode_reps") if k in e}
    cfg = SweepConfig(
        **grid,
        **reps,
        **fast.to_dict(),
        capacity_context=e.get("capacity_context"),
        capacity_budget_gib=e.get("memory_budget_gib"),
        profile_kernels=False,
    )
    dev = model_device(model)
    cb = copy_bandwidth(dev, cfg.copy_bytes) if dev.type == "cuda" else {}
    rec = sweep_model(model, cfg, cb.get("gbps"), label=label)
    return {"config": cfg.to_dict(), "fused": len(fused), "copy_bandwidth": cb, **rec}


def _evaluate(
    plan: ExperimentPlan, cell: Cell, model: Any, tok: Any, report: Any, prof: Any
) -> dict[str, Any]:
    from gac.data import load_part
    from gac.eval.ppl import check_calibration_overlap, perplexity

    out: dict[str, Any] = {}
    for e in plan.evals:
        if e.get("models") is not None and cell.model not in e["models"]:
            continue
        if e["kind"] == "infer":
            out["infer"] = _infer(model, e, cell.id)
        elif e["kind"] == "ppl":
            src = e.get("source", "britannica")
            part = load_part(src, "test")
            split = check_calibration_overlap(report.calibration if report is not None else None, part)
            r = perplexity(
                model, tok, part.text, seq_len=e.get("seq_len", 512),
                batch_size=e.get("batch_size", 1), max_windows=e.get("windows"),
            )  # fmt: skip
            keep = ("ppl", "nll", "n_predicted", "seq_len", "n_windows", "tokens")
            out[f"ppl:{src}"] = {**{k: r[k] for k in keep}, "split": split}
        elif e["kind"] == "predict":
            a = report.allocation if report is not None else None
            out["predict"] = {
                "profile": prof.id if prof is not None else None,
                "predicted_speedup": 1.0 if a is None else a.get("predicted_speedup"),
                "pct_aligned": None if a is None else a.get("pct_aligned"),
            }
    return out


def _record(plan: ExperimentPlan, plan_dir: Path, cell: Cell, status: str, results: dict[str, Any],
            timings: dict[str, float], error: str | None = None, log: str | None = None) -> None:  # fmt: skip
    from gac.hardware.timing import environment
    from gac.utils import atomic_write_text

    rec = {
        "schema": CELL_SCHEMA,
        "cell": cell.to_dict(),
        "id": cell.id,
        "status": status,
        "error": error,
        "input_hash": _hash(plan.cell_inputs(cell)),
        "plan_hash": plan.hash,
        "inputs": plan.cell_inputs(cell),
        "results": results,
        "timings": timings,
        "command": " ".join(shlex.quote(a) for a in sys.argv),
        "env": environment(_device(plan)),
    }
    if log:
        rec["log_tail"] = log
    p = cell_path(plan_dir, cell)
    p.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(p, json.dumps(rec, indent=1, default=str))


def _device(plan: ExperimentPlan) -> str:
    if plan.device == "auto":
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    return plan.device


def run_group(plan: ExperimentPlan, plan_dir: str | Path, group: str, force: bool = False) -> dict[str, str]:
    """Run the unfinished cells of ``group``: one load, one calibration, one apply per align.

    A failing cell is recorded as ``failed`` with its error; the group's other cells go on
    (a failure of the shared calibration fails every pending cell of the group).

    Returns:
        cell id -> ``done`` (skipped), ``ok`` or ``failed``.
    """
    import copy

    import torch

    from gac.utils import console, resolve_device_dtype

    plan_dir = Path(plan_dir)
    cells = plan.groups()[group]
    if cells[0].bench is not None:
        return {cells[0].id: run_bench_cell(plan, plan_dir, cells[0], force)}
    states = {c.id: cell_state(plan, plan_dir, c) for c in cells}
    todo = [c for c in cells if force or states[c.id] != "done"]
    out = {c.id: "done" for c in cells if c not in todo}
    if not todo:
        return out
    dev, dt = resolve_device_dtype(plan.device, plan.dtype)
    torch.manual_seed(0)
    t0 = time.perf_counter()
    shared: dict[str, float] = {}
    try:
        base, tok = _load(todo[0].model, dt, dev)
        shared["load_s"] = time.perf_counter() - t0
        p = None
        prof = None
        if todo[0].compressor != BASE:
            from gac.api import plan as make_plan

            t0 = time.perf_counter()
            p = make_plan(base, plan.compress_config(todo[0]), tokenizer=tok)
            prof = p.profile
            shared["plan_s"] = time.perf_counter() - t0
        else:
            from gac.api import profile_for

            prof = profile_for(base, plan.compress.get("profile"), None)
    except Exception as e:  # noqa: BLE001 - recorded per cell, the plan goes on
        err = f"{type(e).__name__}: {e}" if not isinstance(e, GacError) else str(e)
        for c in todo:
            _record(plan, plan_dir, c, "failed", {}, shared, err, traceback.format_exc()[-2000:])
            out[c.id] = "failed"
            console.print(f"[red]failed[/red] {c.id}: {err}")
        return out
    for c in todo:
        t0 = time.perf_counter()
        try:
            if p is None:
                model, report = base, None
                results: dict[str, Any] = {"params": sum(q.numel() for q in base.parameters())}
            else:
                from gac.api import apply_

                model = copy.deepcopy(base)
                align, kw = ALIGN_VARIANTS.get(c.align, (c.align, {}))
                alloc = p.allocation(align, **kw)
                report = apply_(model, p, alloc)
                # the group's last cell: its evals need neither the plan nor the dense model
                if c is todo[-1]:
                    p = base = None
                    _release_memory()
                a = report.allocation
                results = {
                    "params": report.model_params_after,
                    "targeted_ratio": report.targeted_ratio,
                    "budget": report.budget,
                    "cost": a.get("cost"),
                    "pct_aligned": a.get("pct_aligned"),
                    "predicted_speedup": a.get("predicted_speedup"),
                    "dims": {k: int(v) for k, v in alloc.dims.items()},
                    "serve": report.config.get("serve"),
                    "guard": a.get("guard"),
                    "predicted_serve": {r["point"]: r["speedup"] for r in a.get("serve") or []},
                }
            with torch.no_grad():
                results["evals"] = _evaluate(plan, c, model, tok, report, prof)
            timings = {**shared, "cell_s": time.perf_counter() - t0}
            _record(plan, plan_dir, c, "ok", results, timings)
            out[c.id] = "ok"
            console.print(f"[green]done[/green] {c.id} ({timings['cell_s']:.1f} s)")
        except Exception as e:  # noqa: BLE001 - recorded, the rest go on
            err = str(e) if isinstance(e, GacError) else f"{type(e).__name__}: {e}"
            _record(plan, plan_dir, c, "failed", {}, {"cell_s": time.perf_counter() - t0}, err,
                    traceback.format_exc()[-2000:])  # fmt: skip
            out[c.id] = "failed"
            console.print(f"[red]failed[/red] {c.id}: {err}")
    return out


def _release_memory() -> None:
    """Free what the dropped references held (a calibrated plan holds GiB of state on the GPU)."""
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def run_bench_cell(plan: ExperimentPlan, plan_dir: Path, cell: Cell, force: bool = False) -> str:
    """Run one ``[[benches]]`` experiment; raw points, CSV and plot under ``PLAN_DIR/kernels/<name>/``."""
    from gac.hardware.sweeps import Config, parse_dims, run_experiment
    from gac.hardware.timing import resolve_device
    from gac.utils import console

    if not force and cell_state(plan, plan_dir, cell) == "done":
        return "done"
    b = plan.cell_inputs(cell)["bench"]
    t0 = time.perf_counter()
    try:
        dev = resolve_device(_device(plan))
        dtype = plan.dtype if plan.dtype != "auto" else ("bfloat16" if dev.type == "cuda" else "float32")
        cfg = Config.default_for(dev)
        for key, attr in (("batch", "batch"), ("seq_len", "seq"), ("heads", "heads"), ("m", "m"), ("k", "k"),
                          ("n", "n"), ("half_window", "half_window")):  # fmt: skip
            if key in b:
                setattr(cfg, attr, b[key])
        if "dims" in b:
            cfg.dims = parse_dims(str(b["dims"]))
        raw = plan_dir / BENCH / cell.bench
        rec = run_experiment(b["experiment"], dtype=dtype, out=raw, config=cfg, device=dev, show=False,
                             command=" ".join(shlex.quote(a) for a in sys.argv))  # fmt: skip
        ok = sum(r.get("status") == "ok" for r in rec.get("records", []))
        if not ok:
            raise GacError(f"{b['experiment']}: no point measured ({len(rec.get('records', []))} failed)")
        results = {
            "experiment": b["experiment"],
            "dtype": rec.get("dtype"),
            "device_label": rec.get("device_label"),
            "config": rec.get("config"),
            "summary": rec.get("summary"),
            # every point, compact (the full records stay in raw_dir): what published values are compared with
            "records": [
                {
                    k: r.get(k)
                    for k in (
                        "group",
                        "series",
                        "variant",
                        "dim",
                        "status",
                        "median_ms",
                        "tflops",
                        "backend",
                        "auto_backend",
                    )
                    if r.get(k) is not None
                }
                for r in rec.get("records", [])
            ],  # fmt: skip
            "points_ok": ok,
            "points": len(rec.get("records", [])),
            "raw_dir": str(Path(BENCH) / cell.bench),
        }
        _record(plan, plan_dir, cell, "ok", results, {"cell_s": time.perf_counter() - t0})
        console.print(f"[green]done[/green] {cell.id} ({time.perf_counter() - t0:.1f} s)")
        return "ok"
    except Exception as e:  # noqa: BLE001 - recorded, the rest go on
        err = str(e) if isinstance(e, GacError) else f"{type(e).__name__}: {e}"
        _record(plan, plan_dir, cell, "failed", {}, {"cell_s": time.perf_counter() - t0}, err,
                traceback.format_exc()[-2000:])  # fmt: skip
        console.print(f"[red]failed[/red] {cell.id}: {err}")
        return "failed"


def check_only(plan: ExperimentPlan, only: list[str] | None) -> None:
    """Refuse ``--only`` patterns that select nothing (a typo would otherwise run nothing and exit 0)."""
    for p in only or []:
        if not plan.groups([p]):
            ids = [c.id for c in plan.cells()]
            raise GacError(
                f"--only {p!r} matches no cell of plan {plan.name}; cells: {', '.join(ids[:6])}..."
            )


def status_table(
    plan: ExperimentPlan, plan_dir: Path, only: list[str] | None = None
) -> list[tuple[str, str, str]]:
    """(group, cell id, state) for every cell (``gac run --dry-run``)."""
    return [(g, c.id, cell_state(plan, plan_dir, c)) for g, cells in plan.groups(only).items() for c in cells]


def run_local(plan: ExperimentPlan, plan_dir: str | Path, only: list[str] | None = None) -> dict[str, str]:
    """Run every (selected) group in order on this machine; returns cell id -> state."""
    out: dict[str, str] = {}
    for g in plan.groups(only):
        out.update(run_group(plan, plan_dir, g))
    return out
