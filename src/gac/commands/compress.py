"""`gac compress MODEL --compressor NAME --param-ratio R --align gac --out DIR`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from gac.commands import options as o
from gac.errors import GacError


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


# the options of `gac compress` (the recurring ones are gac.commands.options'), in help panels: what a
# user sets first (model, compressor, ratio, align, out, profile, serve) on top, the rest grouped
CALIBRATION, ALLOCATION, RECOVERY, MACHINE, REPORT = (
    "Calibration",
    "Allocation (--align gac, knapsack, gac-latency)",
    "Recovery (--recover lora)",
    "Machine",
    "Report",
)
Compressor = Annotated[str, o.COMPRESSOR()]
ParamRatio = Annotated[float, o.PARAM_RATIO()]
Align = Annotated[str, o.ALIGN()]
ProfileSpec = Annotated[str | None, o.PROFILE(shown_default="auto")]
Calib = Annotated[str, o.CALIB(panel=CALIBRATION)]
NSamples = Annotated[int | None, o.N_SAMPLES(panel=CALIBRATION, shown_default="256 GPU / 32 CPU")]
SeqLen = Annotated[int | None, o.SEQ_LEN(panel=CALIBRATION, shown_default="2048 GPU / 256 CPU")]
BatchSize = Annotated[int, o.BATCH_SIZE(panel=CALIBRATION)]
Options = Annotated[list[str], o.OPTION()]
LatencyTarget = Annotated[
    float | None,
    typer.Option(
        "--latency-target",
        help="gac-latency: predicted latency bound as a fraction of dense.",
        rich_help_panel=ALLOCATION,
    ),
]
LatencyTokens = Annotated[
    int,
    typer.Option(
        "--latency-tokens",
        help="Rows per GEMM in the latency model (gac-latency, predictions): 1024 a prefill; the batch for decode, where bytes and launches dominate and a factorized site pays its second launch.",
        rich_help_panel=ALLOCATION,
    ),
]
Candidates = Annotated[
    str,
    typer.Option(
        "--candidates",
        help="gac/gac-latency candidate step: modulus (profile rule, finest) | prefer (fastest modulus).",
        rich_help_panel=ALLOCATION,
    ),
]
Objective = Annotated[
    str,
    typer.Option(
        "--objective",
        help="knapsack value: paper (sensitivity x parameter change) | curve (the compressor's loss curve).",
        rich_help_panel=ALLOCATION,
    ),
]
Window = Annotated[
    float,
    typer.Option(
        "--window",
        help="knapsack candidates: native dim ± N modulus steps (N >= 1, default 1) or ± a fraction in (0, 1).",
        rich_help_panel=ALLOCATION,
    ),
]
CalibSeed = Annotated[
    int,
    typer.Option(
        "--calib-seed",
        help="0: the first calibration windows; N: a seeded random choice of windows.",
        rich_help_panel=CALIBRATION,
    ),
]
Recover = Annotated[
    str,
    typer.Option(
        "--recover",
        help="none | lora: a short LoRA fine-tune on calibration text, merged (needs peft).",
        rich_help_panel=RECOVERY,
    ),
]
RecoverSteps = Annotated[
    int, typer.Option("--recover-steps", help="LoRA recovery: optimizer steps.", rich_help_panel=RECOVERY)
]
RecoverRank = Annotated[
    int, typer.Option("--recover-rank", help="LoRA recovery: adapter rank.", rich_help_panel=RECOVERY)
]
RecoverLr = Annotated[
    float, typer.Option("--recover-lr", help="LoRA recovery: learning rate.", rich_help_panel=RECOVERY)
]
Out = Annotated[Path, o.OUT(short=False)]  # -o was --option here: refused, not misread
Overwrite = Annotated[bool, o.OVERWRITE()]
Device = Annotated[str, o.DEVICE(panel=MACHINE)]
Dtype = Annotated[str, o.DTYPE(panel=MACHINE)]
Rows = Annotated[
    int | None,
    typer.Option(
        "--rows", help="Print at most this many per-site rows (all by default).", rich_help_panel=REPORT
    ),
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
        rich_help_panel=ALLOCATION,
    ),
]
GuardMargin = Annotated[
    float | None,
    typer.Option(
        "--guard-margin",
        help="The latency guard's safety margin in [0, 1): --align gac needs a predicted speedup of at least 1 + M x dense at every serving shape. Default: the latency model's worst optimistic error measured on this GPU (the profile's), else 0.08.",
        rich_help_panel=ALLOCATION,
    ),
]
Verify = Annotated[
    bool,
    typer.Option(
        "--verify",
        help="After compressing (GPU), time dense and compressed at the serving shapes on the default inference path; recorded in gac_report.json, warns where slower beyond the measured spread.",
        rich_help_panel=REPORT,
    ),
]
MaxGpuMemory = Annotated[float | None, o.MAX_GPU_MEMORY(panel=MACHINE)]


def compress_cmd(
    model: o.MODEL,
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
    guard_margin: GuardMargin = None,
    verify: Verify = False,
    max_gpu_memory: MaxGpuMemory = None,
) -> None:
    """Compress MODEL with aligned dims under a parameter budget, save it to the --out directory
    (model, gac_config.json, gac_report.json) and print the report."""
    params = dict(locals())
    from gac import io
    from gac.api import CompressConfig, check_not_compressed, compress_, gac_config_for_save, preflight
    from gac.models import load_model
    from gac.utils import console, out_console, resolve_device_dtype

    # the command's options are named after CompressConfig's fields (but two)
    cfg = o.call(CompressConfig, params, options=parse_options(option), tokens=latency_tokens)
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
