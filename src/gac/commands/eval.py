"""`gac eval ...`: perplexity (`ppl`), downstream tasks (`lm_eval`) and inference sweeps (`infer`)."""

from __future__ import annotations

from typing import Annotated

import typer

from gac.commands import options as o
from gac.runtime.fastpath import INFER, FastPath, typer_options

#: Help panels of `gac eval lm_eval` and `gac eval infer`: what a user sets first stays on top.
PPL_SUITE = "ppl suite (--suite ppl)"
SHAPES = "Shapes and repetitions"
CAPACITY = "Capacity"
MACHINE = "Machine"
FAST_PATH = "Fast path"

eval_app = typer.Typer(
    help="Evaluate a model: perplexity, lm-eval tasks, inference speed.", no_args_is_help=True
)


def register(app: typer.Typer) -> None:
    app.add_typer(eval_app, name="eval")


@eval_app.command("ppl")
def ppl_cmd(
    model: o.MODEL,
    dataset: Annotated[str, o.DATASET()] = "britannica",
    allow_overlap: Annotated[bool, o.ALLOW_OVERLAP()] = False,
    seq_len: Annotated[int, o.SEQ_LEN()] = 2048,
    max_windows: Annotated[int | None, o.MAX_WINDOWS()] = None,
    batch_size: Annotated[int, o.BATCH_SIZE()] = 1,
    device: Annotated[str, o.DEVICE()] = "auto",
    dtype: Annotated[str, o.DTYPE()] = "auto",
    tokenizer: Annotated[str | None, o.TOKENIZER()] = None,
    out: Annotated[str | None, o.OUT()] = None,
    max_memory: Annotated[str | None, o.MAX_MEMORY()] = None,
    offload_dir: str | None = typer.Option(
        None, "--offload-dir", help="Folder for disk offload (--max-memory disk=...)."
    ),
) -> None:
    """Perplexity by the standard protocol (non-overlapping windows, mean NLL, last window kept).

    Tokens follow the model's tokenizer (a leading BOS where it adds one); evaluation text that the
    model was calibrated on is refused unless --allow-overlap. The result is printed as JSON on
    stdout and, with --out FILE, also written there.
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
    variant: Annotated[str, o.VARIANT()],
    out: Annotated[str, o.OUT()],
    suite: str = typer.Option("lm_eval", "--suite", help="lm_eval | ppl."),
    baseline_model_id: Annotated[str | None, o.BASELINE_MODEL_ID()] = None,
    tasks: str | None = typer.Option(
        None,
        "--tasks",
        help="lm-eval tasks, comma separated (default: piqa,hellaswag,arc_easy,arc_challenge,winogrande).",
    ),
    limit: float | None = typer.Option(None, "--limit", help="Examples per task (default: the full sets)."),
    batch_size: Annotated[int, o.BATCH_SIZE()] = 8,
    num_fewshot: int | None = typer.Option(None, "--num-fewshot", help="Few-shot examples per prompt."),
    include_path: list[str] | None = typer.Option(None, "--include-path", help="Folder of local task YAMLs."),
    dataset: Annotated[str, o.DATASET(panel=PPL_SUITE)] = "britannica",
    allow_overlap: Annotated[bool, o.ALLOW_OVERLAP(panel=PPL_SUITE)] = False,
    seq_len: Annotated[int, o.SEQ_LEN(panel=PPL_SUITE)] = 2048,
    max_windows: Annotated[int | None, o.MAX_WINDOWS(panel=PPL_SUITE)] = None,
    device: Annotated[str, o.DEVICE()] = "auto",
    dtype: Annotated[str, o.DTYPE()] = "auto",
    overwrite: Annotated[bool, o.OVERWRITE()] = False,
) -> None:
    """Downstream accuracy (lm-eval tasks) or perplexity of a variant into the --out directory
    (lm_eval.json / ppl.json, variant.json): the `python -m gac.llm_eval` entry point."""
    params = dict(locals())
    from gac.plans.suites import evaluate, parse_limit

    o.call(
        evaluate,
        params,
        tasks=[t.strip() for t in tasks.split(",") if t.strip()] if tasks else None,
        limit=parse_limit(limit),
        include_path=include_path or None,
    )


@eval_app.command("infer")
@typer_options(INFER, panel=FAST_PATH)
def infer_cmd(
    *,
    variant: Annotated[str, o.VARIANT()] = "baseline",
    baseline_model_id: Annotated[str | None, o.BASELINE_MODEL_ID()] = None,
    out: Annotated[str, o.OUT()],
    overwrite: Annotated[bool, o.OVERWRITE()] = False,
    prefill_batches: str = typer.Option(
        "1,8", "--prefill-batches", help="Prefill batch sizes.", rich_help_panel=SHAPES
    ),
    prefill_seqs: str = typer.Option(
        "128,512,1024,2048", "--prefill-seqs", help="Prefill sequence lengths.", rich_help_panel=SHAPES
    ),
    decode_batches: str = typer.Option(
        "1,16,64", "--decode-batches", help="Decode batch sizes.", rich_help_panel=SHAPES
    ),
    decode_kv: str = typer.Option(
        "512,4096", "--decode-kv", help="Decode KV-cache lengths.", rich_help_panel=SHAPES
    ),
    prefill_reps: int = typer.Option(
        10, "--prefill-reps", help="Timed prefills per point.", rich_help_panel=SHAPES
    ),
    decode_reps: int = typer.Option(
        30, "--decode-reps", help="Timed decode steps per point.", rich_help_panel=SHAPES
    ),
    fast: FastPath = None,  # type: ignore[assignment]  # one option per switch: gac.runtime.fastpath
    capacity_context: int | None = typer.Option(
        None,
        "--capacity-context",
        help="Also the largest decode batch that fits --max-gpu-memory at this context, and its tokens/s (GPU).",
        rich_help_panel=CAPACITY,
    ),
    max_gpu_memory: Annotated[float | None, o.MAX_GPU_MEMORY(panel=CAPACITY)] = None,
    memory_budget: float | None = typer.Option(None, "--memory-budget", hidden=True),  # the old name
    device: Annotated[str, o.DEVICE(panel=MACHINE)] = "auto",
    dtype: Annotated[str, o.DTYPE(panel=MACHINE)] = "auto",
) -> None:
    """Prefill and decode speed of a variant next to its dense baseline, into the --out directory
    (infer.json, infer.csv, plots): the `python -m gac.llm_run` entry point."""
    params = dict(locals())
    from gac.plans.suites import run

    budget = o.renamed(
        params.pop("memory_budget"), "--memory-budget", params.pop("max_gpu_memory"), "--max-gpu-memory"
    )
    o.call(run, params, memory_budget=budget)
