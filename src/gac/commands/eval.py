"""`gac eval ...`: perplexity (`ppl`), downstream tasks (`lm_eval`) and inference sweeps (`infer`)."""

from __future__ import annotations

import typer

from gac.runtime.fastpath import INFER, FastPath, typer_options

eval_app = typer.Typer(
    help="Evaluate a model: perplexity, lm-eval tasks, inference speed.", no_args_is_help=True
)


def register(app: typer.Typer) -> None:
    app.add_typer(eval_app, name="eval")


@eval_app.command("ppl")
def ppl_cmd(
    model: str = typer.Argument(..., help="Model: alias (smollm2), gac/HF directory, .gguf file or hub id."),
    dataset: str = typer.Option(
        "britannica",
        "--dataset",
        "-d",
        help="britannica (embedded) | wikitext2 | c4 (need the hub) | text:PATH (its test part; "
        "text:PATH@calib / @all pick another).",
    ),
    allow_overlap: bool = typer.Option(
        False,
        "--allow-overlap",
        help="Evaluate even on text the model was calibrated on (recorded in the result).",
    ),
    seq_len: int = typer.Option(2048, "--seq-len", help="Window length (non-overlapping windows)."),
    max_windows: int | None = typer.Option(None, "--max-windows", help="Score only the first N windows."),
    batch_size: int = typer.Option(1, "--batch-size", help="Windows per forward pass."),
    device: str = typer.Option("auto", "--device", help="auto | cpu | cuda | cuda:N."),
    dtype: str = typer.Option(
        "auto", "--dtype", help="auto (bf16 on GPU, fp32 on CPU) | float32 | bfloat16 | float16."
    ),
    tokenizer: str | None = typer.Option(
        None, "--tokenizer", help="Take the tokenizer from this model spec."
    ),
    out: str | None = typer.Option(None, "--out", help="Also write the result as JSON here."),
    max_memory: str | None = typer.Option(
        None,
        "--max-memory",
        help="Spread the model over devices with accelerate, whole decoder layers each: "
        "'0=20GiB,1=20GiB,cpu=64GiB[,disk=200GiB]'.",
    ),
    offload_dir: str | None = typer.Option(
        None, "--offload-dir", help="Folder for disk offload (--max-memory disk=...)."
    ),
) -> None:
    """Perplexity by the standard protocol (non-overlapping windows, mean NLL, last window kept).

    Tokens follow the model's tokenizer (a leading BOS where it adds one); evaluation text that the
    model was calibrated on is refused unless --allow-overlap.
    """
    import json
    from pathlib import Path

    from gac.data import check_split_windows, load_part
    from gac.errors import GacError
    from gac.eval.ppl import check_calibration_overlap, perplexity, saved_calibration
    from gac.guard import check_out
    from gac.models import load_model
    from gac.utils import atomic_write_text, console, resolve_device_dtype

    if out:
        check_out(out, overwrite=True, kind="file")
    dev, dt = resolve_device_dtype(device, dtype)
    spread = None
    if max_memory is not None:
        from gac.eval.dispatch import parse_max_memory

        spread = parse_max_memory(max_memory)  # bad input fails before loading
    part = load_part(dataset, "test")
    split = check_calibration_overlap(saved_calibration(model), part, allow_overlap)
    lm = load_model(model, dtype=dt, device="cpu" if spread else dev)
    if spread:
        from gac.eval.dispatch import dispatch_

        dmap = dispatch_(lm.model, spread, offload_dir)
        console.print(
            f"device map: {sorted(set(map(str, dmap.values())))} ({len(dmap)} entries)", markup=False
        )
    tok = lm.tokenizer if tokenizer is None else load_model(tokenizer, device="cpu").tokenizer
    if tok is None:
        raise GacError(f"{model} has no tokenizer; pass --tokenizer with the base model")
    check_split_windows(tok, dataset, seq_len)
    res = perplexity(
        lm.model, tok, part.text, seq_len=seq_len, batch_size=batch_size, max_windows=max_windows
    )
    res = {
        "model": model,
        "dataset": dataset,
        "device": dev,
        "dtype": str(dt).removeprefix("torch."),
        **res,
        "split": split,
    }
    partial = f", last partial window {res['last_window_tokens']} tokens" if res["last_window_tokens"] else ""
    trunc = " (first windows only: --max-windows)" if res["truncated"] else ""
    console.print(
        f"ppl {res['ppl']:.4f} on {dataset}: {res['n_windows']} windows of {seq_len}{partial}, "
        f"{res['n_predicted']:,} predicted tokens{trunc}"
    )
    if out:
        atomic_write_text(Path(out), json.dumps(res, indent=2) + "\n")
    typer.echo(json.dumps(res))


@eval_app.command("lm_eval")
def lm_eval_cmd(
    variant: str = typer.Option(
        ..., "--variant", help="baseline | a model directory | SPEC (asvd:0.85:gac)."
    ),
    suite: str = typer.Option("lm_eval", "--suite", help="lm_eval | ppl."),
    baseline_model_id: str | None = typer.Option(
        None, "--baseline-model-id", help="Base model: alias (smollm2), HF id, directory or GGUF."
    ),
    out: str = typer.Option(..., "--out", help="Results directory (lm_eval.json / ppl.json, variant.json)."),
    tasks: str | None = typer.Option(
        None,
        "--tasks",
        help="lm-eval tasks, comma separated (default: piqa,hellaswag,arc_easy,arc_challenge,winogrande).",
    ),
    limit: float | None = typer.Option(None, "--limit", help="Examples per task (default: the full sets)."),
    batch_size: int = typer.Option(8, "--batch-size"),
    num_fewshot: int | None = typer.Option(None, "--num-fewshot"),
    include_path: list[str] | None = typer.Option(None, "--include-path", help="Folder of local task YAMLs."),
    dataset: str = typer.Option(
        "britannica",
        "--dataset",
        help="ppl suite: britannica | wikitext2 | c4 | text:PATH (its test part; @calib / @all pick another).",
    ),
    allow_overlap: bool = typer.Option(
        False, "--allow-overlap", help="ppl suite: evaluate even on the calibration text (recorded)."
    ),
    seq_len: int = typer.Option(2048, "--seq-len", help="ppl suite: window length."),
    max_windows: int | None = typer.Option(None, "--max-windows", help="ppl suite: first N windows only."),
    device: str = typer.Option("auto", "--device"),
    dtype: str = typer.Option("auto", "--dtype"),
    overwrite: bool = typer.Option(False, "--overwrite"),
) -> None:
    """Downstream accuracy (lm-eval tasks) or perplexity of a variant: the `python -m gac.llm_eval` entry point."""
    from gac.plans.suites import evaluate, parse_limit

    evaluate(
        variant,
        suite,
        baseline_model_id,
        out,
        tasks=[t.strip() for t in tasks.split(",") if t.strip()] if tasks else None,
        limit=parse_limit(limit),
        batch_size=batch_size,
        num_fewshot=num_fewshot,
        include_path=include_path or None,
        dataset=dataset,
        allow_overlap=allow_overlap,
        seq_len=seq_len,
        max_windows=max_windows,
        device=device,
        dtype=dtype,
        overwrite=overwrite,
    )


@eval_app.command("infer")
@typer_options(INFER)
def infer_cmd(
    variant: str = typer.Option(
        "baseline", "--variant", help="baseline | a model directory | SPEC (asvd:0.85:gac)."
    ),
    baseline_model_id: str | None = typer.Option(
        None, "--baseline-model-id", help="Base model (timed first)."
    ),
    out: str = typer.Option(..., "--out", help="Results directory (infer.json, infer.csv, plots)."),
    prefill_batches: str = typer.Option("1,8", "--prefill-batches"),
    prefill_seqs: str = typer.Option("128,512,1024,2048", "--prefill-seqs"),
    decode_batches: str = typer.Option("1,16,64", "--decode-batches"),
    decode_kv: str = typer.Option("512,4096", "--decode-kv"),
    fast: FastPath = None,  # type: ignore[assignment]  # one option per switch: gac.runtime.fastpath
    prefill_reps: int = typer.Option(10, "--prefill-reps"),
    decode_reps: int = typer.Option(30, "--decode-reps"),
    capacity_context: int | None = typer.Option(
        None,
        "--capacity-context",
        help="Also the largest decode batch that fits the memory budget at this context, and its tokens/s (GPU).",
    ),
    memory_budget: float | None = typer.Option(
        None, "--memory-budget", help="Capacity's memory budget in GiB (default: this GPU's free memory)."
    ),
    device: str = typer.Option("auto", "--device"),
    dtype: str = typer.Option("auto", "--dtype"),
    overwrite: bool = typer.Option(False, "--overwrite"),
) -> None:
    """Prefill and decode speed of a variant next to its dense baseline: the `python -m gac.llm_run` entry point."""
    from gac.plans.suites import run

    run(
        variant,
        baseline_model_id,
        out,
        prefill_batches=prefill_batches,
        prefill_seqs=prefill_seqs,
        decode_batches=decode_batches,
        decode_kv=decode_kv,
        fast=fast,
        prefill_reps=prefill_reps,
        decode_reps=decode_reps,
        capacity_context=capacity_context,
        memory_budget=memory_budget,
        device=device,
        dtype=dtype,
        overwrite=overwrite,
    )
