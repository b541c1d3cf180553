"""The plan format of ``gac run PLAN.toml``: parse and validate a plan, expand it into cells.

A plan is a TOML file whose axes expand into *cells*; each cell is one model compressed by one
compressor at one parameter ratio with one align strategy (plus one dense ``base`` cell per model),
evaluated by every entry of ``[[evals]]``. The cells of one (model, compressor, ratio) form a
*group*: one calibration serves them all (:mod:`gac.plans.cells`).

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
    guard_margin = 0.08                 # the guard's margin (default: the profile's measured one)

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

The cell JSON (schema ``gac.cell/1``, :mod:`gac.plans.store`) keeps deterministic ``results`` apart
from ``timings`` and ``env``, so two runs of a plan can be compared result for result.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gac.errors import GacError
from gac.runtime import fastpath

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
    "allow_slower", "guard_margin",
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
        return digest(self.to_dict())

    def run_device(self) -> str:
        """The device the cells run on: ``auto`` is ``cuda`` where CUDA is, else ``cpu``."""
        if self.device == "auto":
            import torch

            return "cuda" if torch.cuda.is_available() else "cpu"
        return self.device

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


def digest(obj: Any) -> str:
    """The 16-hex-digit hash of a plan or of a cell's inputs (sorted JSON, SHA-256)."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def parse_plan(data: dict[str, Any], source: str = "") -> ExperimentPlan:
    """Validate a plan's TOML data and return the plan; raises :class:`GacError` on bad input."""
    _refuse_unknown(data, TOP_KEYS, "the plan's top level")
    for t in ("plan", "axes", "compress", "slurm", "published"):
        if t in data and not isinstance(data[t], dict):
            raise GacError(f"plan: [{t}] must be a table")
    name, device, dtype = _parse_meta(data.get("plan", {}), source)
    models, comps, spec, ratios, aligns = _parse_axes(data)
    compress, options = _parse_compress(data.get("compress", {}))
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
    plan.evals = _parse_evals(data.get("evals", [{"kind": "predict"}]), models)
    plan.benches = _parse_benches(data.get("benches", []))
    plan.slurm = _parse_slurm(data.get("slurm", {}))
    plan.published = dict(data.get("published", {}))
    return plan


def _parse_meta(meta: dict[str, Any], source: str) -> tuple[str, str, str]:
    """``[plan]``: the name (a plain file name), the device and the dtype."""
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
    return name, device, dtype


def _parse_axes(data: dict[str, Any]) -> tuple[list[str], list[str], list[str], list[float], list[str]]:
    """``[axes]``: models, compressors (and the axis as written), ratios, align strategies."""
    from gac.allocation import STRATEGIES
    from gac.compressors.base import available_compressors

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
    return models, comps, spec, ratios, aligns


def _parse_compress(compress: dict[str, Any]) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """``[compress]`` without its options, and ``[compress.options.<compressor>]`` (checked by name now)."""
    from gac.compressors.base import available_compressors, get_compressor

    compress = dict(compress)
    _refuse_unknown(compress, COMPRESS_KEYS, "[compress]")
    options = compress.pop("options", {}) or {}
    if not isinstance(options, dict) or any(not isinstance(v, dict) for v in options.values()):
        raise GacError("plan: [compress.options] must hold one table per compressor")
    known = available_compressors()
    for c, o in options.items():
        if c not in known:
            raise GacError(f"plan: options for unknown compressor {c!r}; available: {', '.join(known)}")
        get_compressor(c, **o)  # validates the option names and types now, before any work
    return compress, options


def _parse_evals(evals: Any, models: list[str]) -> list[dict[str, Any]]:
    """``[[evals]]``: a known kind per entry, its keys and values checked."""
    if isinstance(evals, dict):
        evals = [evals]
    if not isinstance(evals, list) or not all(isinstance(e, dict) for e in evals):
        raise GacError("plan: [[evals]] must be an array of tables")
    for i, e in enumerate(evals):
        where = f"[[evals]] #{i + 1}"
        kind = e.get("kind")
        ms = e.get("models")
        if ms is not None:
            for m in _list(ms, f"{where} models"):
                if m not in models:
                    raise GacError(f"plan: {where}: model {m!r} is not on the [axes] models axis")
        if kind not in EVAL_KINDS:
            raise GacError(f"plan: {where}: unknown kind {kind!r}; known: {', '.join(EVAL_KINDS)}")
        _refuse_unknown(e, EVAL_KINDS[kind], f"{where} ({kind})")
        for k in ("seq_len", "windows", "batch_size", "tokens"):
            v = e.get(k)
            if v is not None and (
                isinstance(v, bool) or not isinstance(v, int) or v < (2 if k == "seq_len" else 1)
            ):
                raise GacError(f"plan: {where}: {k} must be a positive integer, got {v!r}")
        if kind == "infer":
            _check_infer_eval(e, where)
        if kind == "ppl":
            src = str(e.get("source", "britannica"))
            if src not in ("britannica", "shakespeare", "wikitext2", "c4") and not src.startswith("text:"):
                raise GacError(f"plan: {where}: unknown ppl source {src!r}")
    return [dict(e) for e in evals]


def _check_infer_eval(e: dict[str, Any], where: str) -> None:
    """An ``infer`` eval's grid (lists of positive integers), counts, switches and memory budget."""
    for k in ("prefill_batches", "prefill_seqs", "decode_batches", "decode_kv"):
        if k in e:
            v = e[k] if isinstance(e[k], list) else None
            if v is None or any(isinstance(x, bool) or not isinstance(x, int) or x < 1 for x in v):
                raise GacError(f"plan: {where}: {k} must be a list of positive integers")
    for k in ("prefill_reps", "decode_reps", "capacity_context"):
        v = e.get(k)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise GacError(f"plan: {where}: {k} must be a positive integer, got {v!r}")
    for k in sorted(fastpath.plan_keys()):
        if k in e and not isinstance(e[k], bool):
            raise GacError(f"plan: {where}: {k} must be true or false")
    mb = e.get("memory_budget_gib")
    if mb is not None and (isinstance(mb, bool) or not isinstance(mb, int | float) or mb <= 0):
        raise GacError(f"plan: {where}: memory_budget_gib must be a positive number, got {mb!r}")


def _parse_slurm(slurm: dict[str, Any]) -> dict[str, Any]:
    """``[slurm]``: the resources of ``--executor slurm``."""
    slurm = dict(slurm)
    _refuse_unknown(slurm, SLURM_KEYS, "[slurm]")
    for k in ("gpus", "cpus", "time_min", "mem_gb", "array_parallelism"):
        v = slurm.get(k)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < (0 if k == "gpus" else 1)):
            raise GacError(
                f"plan: [slurm] {k} must be a {'non-negative' if k == 'gpus' else 'positive'} integer"
            )
    return slurm


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


def check_only(plan: ExperimentPlan, only: list[str] | None) -> None:
    """Refuse ``--only`` patterns that select nothing (a typo would otherwise run nothing and exit 0)."""
    for p in only or []:
        if not plan.groups([p]):
            ids = [c.id for c in plan.cells()]
            raise GacError(
                f"--only {p!r} matches no cell of plan {plan.name}; cells: {', '.join(ids[:6])}..."
            )
