"""`gac compress MODEL --compressor NAME --param-ratio R --align gac --out DIR`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from gac.errors import GacError
from gac.utils import resolve_device_dtype


def parse_options(items: list[str]) -> dict[str, Any]:
    """``KEY=VALUE`` pairs; a VALUE that parses as JSON is taken as such (numbers, lists...).

    >>> parse_options(["alpha=0.5", "curve=spectrum", "probe_ratios=[0.5,0.9]"])
    {'alpha': 0.5, 'curve': 'spectrum', 'probe_ratios': [0.5, 0.9]}
    """
    out: dict[str, Any] = {}
    for it in items:
        key, sep, val = it.partition("=")
        if not sep or not key:
            raise GacError(f"compressor option {it!r} is not KEY=VALUE")
        try:
            out[key.replace("-", "_")] = json.loads(val)
        except json.JSONDecodeError:
            out[key.replace("-", "_")] = val
    return out


#: Calibration windows ASVD's sensitivity probes use on CPU when ``sensitivity_samples`` is not set
#: (all windows on GPU). Each probe re-runs the model from its layer on over these windows: with
#: the defaults, SmolLM2-135M has 210 sites x 6 ratios = 1,260 probes.
CPU_SENSITIVITY_SAMPLES = 1


def cpu_sized_defaults(cfg: Any) -> list[str]:
    """Shrink the settings that make a CPU run take hours; return one line per change (printed).

    Only options the user did not set are changed.
    """
    notes: list[str] = []
    if cfg.compressor == "asvd" and "sensitivity_samples" not in cfg.options:
        cfg.options["sensitivity_samples"] = CPU_SENSITIVITY_SAMPLES
        notes.append(
            f"asvd sensitivity probes on {CPU_SENSITIVITY_SAMPLES} calibration window "
            "(GPU: all of them); -O sensitivity_samples=N to change"
        )
    if cfg.compressor == "asvd" and "svd_dtype" not in cfg.options:
        cfg.options["svd_dtype"] = "float32"
        notes.append(
            "SVDs in float32 (as on GPU and in `gac demo`; float64 is several times slower on CPU); "
            "-O svd_dtype=float64 to change"
        )
    return notes


# the options of `gac compress`, declared once here (their defaults sit in compress_cmd's signature)
Model = Annotated[str, typer.Argument(help="Model: alias (smollm2), HF directory, .gguf file or hub id.")]
Compressor = Annotated[
    str, typer.Option("--compressor", "-c", help="Compressor name (svd, asvd, svd-llm, llm-pruner, palu).")
]
ParamRatio = Annotated[
    float,
    typer.Option(
        "--param-ratio",
        "-r",
        help="Fraction of the targeted weights' parameters to keep, in (0, 1) (palu: of the KV cache).",
    ),
]
Align = Annotated[
    str,
    typer.Option("--align", "-a", help="none | round | knapsack (unaligned control) | gac | gac-latency."),
]
ProfileSpec = Annotated[
    str | None,
    typer.Option("--profile", "-p", help="Hardware profile: path, shipped id or 'default' (auto)."),
]
Calib = Annotated[
    str,
    typer.Option(
        "--calib",
        help="Calibration text: britannica | wikitext2 | c4 | text:PATH (its calibration part; text:PATH@all for the whole file).",
    ),
]
NSamples = Annotated[
    int | None, typer.Option("--n-samples", help="Calibration windows (default 256 GPU / 32 CPU).")
]
SeqLen = Annotated[
    int | None, typer.Option("--seq-len", help="Tokens per calibration window (default 2048 GPU / 256 CPU).")
]
BatchSize = Annotated[int, typer.Option("--batch-size", help="Calibration windows per forward pass.")]
Options = Annotated[
    list[str], typer.Option("--option", "-O", help="Compressor option KEY=VALUE (repeatable).")
]
LatencyTarget = Annotated[
    float | None,
    typer.Option("--latency-target", help="gac-latency: predicted latency bound as a fraction of dense."),
]
LatencyTokens = Annotated[
    int,
    typer.Option(
        "--latency-tokens",
        help="Rows per GEMM in the latency model (gac-latency, predictions): 1024 a prefill; the batch for decode, where bytes and launches dominate and a factorized site pays its second launch.",
    ),
]
Candidates = Annotated[
    str,
    typer.Option(
        "--candidates",
        help="gac/gac-latency candidate step: modulus (profile rule, finest) | prefer (fastest modulus).",
    ),
]
Objective = Annotated[
    str,
    typer.Option(
        "--objective",
        help="knapsack value: paper (sensitivity x parameter change) | curve (the compressor's loss curve).",
    ),
]
Window = Annotated[
    float,
    typer.Option(
        "--window",
        help="knapsack candidates: native dim ± N modulus steps (N >= 1, default 1) or ± a fraction in (0, 1).",
    ),
]
CalibSeed = Annotated[
    int,
    typer.Option(
        "--calib-seed", help="0: the first calibration windows; N: a seeded random choice of windows."
    ),
]
Recover = Annotated[
    str,
    typer.Option(
        "--recover", help="none | lora: a short LoRA fine-tune on calibration text, merged (needs peft)."
    ),
]
RecoverSteps = Annotated[int, typer.Option("--recover-steps", help="LoRA recovery: optimizer steps.")]
RecoverRank = Annotated[int, typer.Option("--recover-rank", help="LoRA recovery: adapter rank.")]
RecoverLr = Annotated[float, typer.Option("--recover-lr", help="LoRA recovery: learning rate.")]
Out = Annotated[Path, typer.Option("--out", help="Output directory (written atomically).")]
Overwrite = Annotated[bool, typer.Option("--overwrite", help="Replace an existing output directory.")]
Device = Annotated[str, typer.Option("--device", help="auto | cpu | cuda | cuda:N.")]
Dtype = Annotated[
    str, typer.Option("--dtype", help="auto (bf16 on GPU, fp32 on CPU) | float32 | bfloat16 | float16.")
]
Rows = Annotated[
    int | None, typer.Option("--rows", help="Print at most this many per-site rows (all by default).")
]
Serve = Annotated[
    str | None,
    typer.Option(
        "--serve",
        help="Shapes the model will serve, e.g. prefill:1x128,prefill:8x2048,decode:1,decode:16 (decode:B at 512 cached tokens, decode:BxKV to say). Default: prefill B 1,8 x S 128,512,2048 and decode B 1,16,64. --align gac never picks dims predicted slower than dense at any of them.",
    ),
]
AllowSlower = Annotated[
    bool,
    typer.Option(
        "--allow-slower",
        help="--align gac without the latency guard (least loss at the budget); says where it is predicted slower.",
    ),
]
Verify = Annotated[
    bool,
    typer.Option(
        "--verify",
        help="After compressing (GPU), time dense and compressed at the serving shapes on the default inference path; recorded in gac_report.json, warns where slower beyond the measured spread.",
    ),
]
MaxGpuMemory = Annotated[float | None, typer.Option("--max-gpu-memory", help="GiB the model may occupy on the GPU; a larger model stays in CPU memory and is calibrated and factorized one decoder layer at a time on the GPU (svd, svd-llm).")]  # fmt: skip


def compress_cmd(
    model: Model,
    compressor: Compressor = "asvd",
    param_ratio: ParamRatio = 0.85,
    align: Align = "gac",
    profile: ProfileSpec = None,
    calib: Calib = "britannica",
    n_samples: NSamples = None,
    seq_len: SeqLen = None,
    batch_size: BatchSize = 4,
    option: Options = [],  # noqa: B006 (typer copies it)
    latency_target: LatencyTarget = None,
    latency_tokens: LatencyTokens = 1024,
    candidates: Candidates = "modulus",
    objective: Objective = "paper",
    window: Window = 1.0,
    calib_seed: CalibSeed = 0,
    recover: Recover = "none",
    recover_steps: RecoverSteps = 20,
    recover_rank: RecoverRank = 8,
    recover_lr: RecoverLr = 1e-4,
    *,
    out: Out,
    overwrite: Overwrite = False,
    device: Device = "auto",
    dtype: Dtype = "auto",
    rows: Rows = None,
    serve: Serve = None,
    allow_slower: AllowSlower = False,
    verify: Verify = False,
    max_gpu_memory: MaxGpuMemory = None,
) -> None:
    """Compress MODEL with aligned dims under a parameter budget, save it to --out and print the report."""
    from gac import io
    from gac.api import CompressConfig, check_not_compressed, compress_, gac_config_for_save, preflight
    from gac.models import load_model
    from gac.utils import console, out_console

    cfg = CompressConfig(
        compressor=compressor,
        param_ratio=param_ratio,
        align=align,
        profile=profile,
        calib=calib,
        n_samples=n_samples,
        seq_len=seq_len,
        batch_size=batch_size,
        options=parse_options(option),
        latency_target=latency_target,
        tokens=latency_tokens,
        candidates=candidates,
        objective=objective,
        window=window,
        calib_seed=calib_seed,
        max_gpu_memory=max_gpu_memory,
        serve=serve,
        allow_slower=allow_slower,
        recover=recover,
        recover_steps=recover_steps,
        recover_rank=recover_rank,
        recover_lr=recover_lr,
        verify=verify,
    )
    dev, dt = resolve_device_dtype(device, dtype)
    preflight(cfg, dev, out, overwrite)  # everything cheap, before loading a model or calibrating
    if not dev.startswith("cuda"):
        for line in cpu_sized_defaults(cfg):
            console.print(f"[yellow]CPU-sized default:[/yellow] {line}")
    # with a GPU budget the model is loaded into CPU memory; compress_ places it
    lm = load_model(model, dtype=dt, device="cpu" if max_gpu_memory is not None else dev)
    check_not_compressed(lm.model, model)
    report = compress_(
        lm.model,
        cfg,
        tokenizer=lm.tokenizer,
        device=dev,
        dense=lambda: load_model(model, dtype=dt, device=dev).model,
    )
    report.print(max_rows=rows, to=out_console)  # the result: stdout (progress stays on stderr)
    report_json = json.dumps(report.to_dict(), indent=1, default=str)
    io.save(lm.model, out, gac_config_for_save(report, lm.source), tokenizer=lm.tokenizer, overwrite=overwrite,
            extra_files={"gac_report.json": report_json})  # fmt: skip
    console.print(f"saved to {out} (report: {out / 'gac_report.json'})")


def register(app: typer.Typer) -> None:
    app.command("compress")(compress_cmd)
