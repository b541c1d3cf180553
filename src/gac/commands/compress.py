"""`gac compress MODEL --compressor NAME --param-ratio R --align gac --out DIR`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

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
            "(GPU: all of them); -o sensitivity_samples=N to change"
        )
    if cfg.compressor == "asvd" and "svd_dtype" not in cfg.options:
        cfg.options["svd_dtype"] = "float32"
        notes.append(
            "SVDs in float32 (as on GPU and in `gac demo`; float64 is several times slower on CPU); "
            "-o svd_dtype=float64 to change"
        )
    return notes


def compress_cmd(
    model: str = typer.Argument(..., help="Model: alias (smollm2), HF directory, .gguf file or hub id."),
    compressor: str = typer.Option(
        "asvd", "--compressor", "-c", help="Compressor name (svd, asvd, svd-llm, llm-pruner, palu)."
    ),
    param_ratio: float = typer.Option(
        0.85,
        "--param-ratio",
        "-r",
        help="Fraction of the targeted weights' parameters to keep, in (0, 1) (palu: of the KV cache).",
    ),
    align: str = typer.Option(
        "gac", "--align", "-a", help="none | round | knapsack (unaligned control) | gac | gac-latency."
    ),
    profile: str | None = typer.Option(
        None, "--profile", "-p", help="Hardware profile: path, shipped id or 'default' (auto)."
    ),
    calib: str = typer.Option(
        "britannica",
        "--calib",
        help="Calibration text: britannica | wikitext2 | c4 | text:PATH (its calibration part; "
        "text:PATH@all for the whole file).",
    ),
    n_samples: int | None = typer.Option(
        None, "--n-samples", help="Calibration windows (default 256 GPU / 32 CPU)."
    ),
    seq_len: int | None = typer.Option(
        None, "--seq-len", help="Tokens per calibration window (default 2048 GPU / 256 CPU)."
    ),
    batch_size: int = typer.Option(4, "--batch-size", help="Calibration windows per forward pass."),
    option: list[str] = typer.Option([], "--option", "-o", help="Compressor option KEY=VALUE (repeatable)."),
    latency_target: float | None = typer.Option(
        None, "--latency-target", help="gac-latency: predicted latency bound as a fraction of dense."
    ),
    latency_tokens: int = typer.Option(
        1024,
        "--latency-tokens",
        help="Rows per GEMM in the latency model (gac-latency, predictions): 1024 a prefill; the batch "
        "for decode, where bytes and launches dominate and a factorized site pays its second launch.",
    ),
    candidates: str = typer.Option(
        "modulus",
        "--candidates",
        help="gac/gac-latency candidate step: modulus (profile rule, finest) | prefer (fastest modulus).",
    ),
    objective: str = typer.Option(
        "paper",
        "--objective",
        help="knapsack value: paper (sensitivity x parameter change) | curve (the compressor's loss curve).",
    ),
    window: float = typer.Option(
        1.0,
        "--window",
        help="knapsack candidates: native dim ± N modulus steps (N >= 1, default 1) or ± a fraction in (0, 1).",
    ),
    calib_seed: int = typer.Option(
        0, "--calib-seed", help="0: the first calibration windows; N: a seeded random choice of windows."
    ),
    recover: str = typer.Option(
        "none",
        "--recover",
        help="none | lora: a short LoRA fine-tune on calibration text, merged (needs peft).",
    ),
    recover_steps: int = typer.Option(20, "--recover-steps", help="LoRA recovery: optimizer steps."),
    recover_rank: int = typer.Option(8, "--recover-rank", help="LoRA recovery: adapter rank."),
    recover_lr: float = typer.Option(1e-4, "--recover-lr", help="LoRA recovery: learning rate."),
    out: Path = typer.Option(..., "--out", help="Output directory (written atomically)."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace an existing output directory."),
    device: str = typer.Option("auto", "--device", help="auto | cpu | cuda | cuda:N."),
    dtype: str = typer.Option(
        "auto", "--dtype", help="auto (bf16 on GPU, fp32 on CPU) | float32 | bfloat16 | float16."
    ),
    rows: int | None = typer.Option(
        None, "--rows", help="Print at most this many per-site rows (all by default)."
    ),
    serve: str | None = typer.Option(
        None,
        "--serve",
        help="Shapes the model will serve, e.g. prefill:1x128,prefill:8x2048,decode:1,decode:16 (decode:B "
        "at 512 cached tokens, decode:BxKV to say). Default: prefill B 1,8 x S 128,512,2048 and decode B 1,16,64. "
        "--align gac never picks dims predicted slower than dense at any of them.",
    ),
    allow_slower: bool = typer.Option(
        False,
        "--allow-slower",
        help="--align gac without the latency guard (least loss at the budget); says where it is predicted slower.",
    ),
    verify: bool = typer.Option(
        False,
        "--verify",
        help="After compressing (GPU), time dense and compressed at the serving shapes on the default "
        "inference path; recorded in gac_report.json, warns where slower beyond the measured spread.",
    ),
    max_gpu_memory: float | None = typer.Option(
        None,
        "--max-gpu-memory",
        help="GiB the model may occupy on the GPU; a larger model stays in CPU memory and is "
        "calibrated and factorized one decoder layer at a time on the GPU (svd, svd-llm).",
    ),
) -> None:
    """Compress MODEL with aligned dims under a parameter budget, save it to --out and print the report."""
    from gac.api import CompressConfig, compress_, gac_config_for_save
    from gac.compressors.base import available_compressors, get_compressor
    from gac.guard import check_out

    # Validate everything cheap before loading a model or calibrating.
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
    )
    if compressor not in available_compressors():
        raise GacError(f"unknown compressor {compressor!r}; available: {', '.join(available_compressors())}")
    get_compressor(compressor, **cfg.options)  # option names and types fail now, not after loading
    if recover not in ("none", "lora"):
        raise GacError(f"unknown recovery {recover!r}; choose none or lora")
    if recover == "lora":
        import importlib.util

        if importlib.util.find_spec("peft") is None:
            raise GacError("--recover lora needs peft: pip install 'gac[recover]' (or pip install peft)")
        if recover_steps < 1 or recover_rank < 1 or not recover_lr > 0:
            raise GacError("--recover-steps and --recover-rank must be >= 1 and --recover-lr > 0")
    check_out(out, overwrite)
    dev, dt = resolve_device_dtype(device, dtype)
    if verify:
        from gac.eval.infer import check_verify

        check_verify(dev)
    if profile is not None:
        from gac.hardware.profile import load_profile

        load_profile(profile)  # a bad spec fails now, not after calibration

    from gac import io
    from gac.models import load_model
    from gac.utils import console

    if not dev.startswith("cuda"):
        for line in cpu_sized_defaults(cfg):
            console.print(f"[yellow]CPU-sized default:[/yellow] {line}")
    # with a GPU budget the model is loaded into CPU memory; gac.api.plan decides whether it fits
    lm = load_model(model, dtype=dt, device="cpu" if max_gpu_memory is not None else dev)
    if max_gpu_memory is not None and dev.startswith("cuda"):
        need = sum(p.numel() * p.element_size() for p in lm.model.parameters())
        if need <= max_gpu_memory * 2**30:
            lm.model.to(dev)
        else:
            console.print(
                f"the model ({need / 2**30:.2f} GiB) exceeds --max-gpu-memory {max_gpu_memory:g} GiB: "
                f"calibrating and factorizing one decoder layer at a time on {dev}",
                markup=False,
            )
    if io.is_gac_dir(model) and io.read_gac_config(model).get("factorized"):
        raise GacError(f"{model} is already compressed; compress its base model instead")
    report = compress_(lm.model, cfg, tokenizer=lm.tokenizer)
    from gac.utils import out_console

    report.print(max_rows=rows, to=out_console)  # the result: stdout (progress stays on stderr)
    meta = gac_config_for_save(report, lm.source)
    if recover == "lora":
        from gac.compressors.calibration import CalibrationConfig, calibration_batches, model_device
        from gac.recovery import recover_lora_

        d = CalibrationConfig.default(model_device(lm.model), source=calib)
        cc = CalibrationConfig(
            source=calib,
            n_samples=n_samples or d.n_samples,
            seq_len=seq_len or d.seq_len,
            batch_size=batch_size,
            seed=calib_seed,
        )
        meta["recovery"] = {
            "method": "lora",
            **recover_lora_(
                lm.model,
                calibration_batches(lm.tokenizer, cc),
                steps=recover_steps,
                rank=recover_rank,
                lr=recover_lr,
            ),
        }
        console.print(
            f"LoRA recovery: loss {meta['recovery']['loss_first']:.3f} -> {meta['recovery']['loss_last']:.3f}"
        )
    io.save(
        lm.model,
        out,
        meta,
        tokenizer=lm.tokenizer,
        overwrite=overwrite,
        extra_files={"gac_report.json": json.dumps(report.to_dict(), indent=1, default=str)},
    )
    console.print(f"saved to {out} (report: {out / 'gac_report.json'})")
    if verify:
        from gac.api import verify_serving

        verify_serving(lm.model, lambda: load_model(model, dtype=dt, device=dev).model, report, out)


def register(app: typer.Typer) -> None:
    app.command("compress")(compress_cmd)
