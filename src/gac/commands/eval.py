"""`gac eval ...`: perplexity (`ppl`), downstream tasks (`lm_eval`) and inference sweeps (`infer`)."""

from __future__ import annotations

import typer

eval_app = typer.Typer(
    help="Evaluate a model: perplexity, lm-eval tasks, inference speed.", no_args_is_help=True
)


def register(app: typer.Typer) -> None:
    app.add_typer(eval_app, name="eval")


@eval_app.command("ppl")
def ppl_cmd(
    model: str = typer.Argument(..., help="Model: alias (smollm2), gac/HF directory, .gguf file or hub id."),
    dataset: str = typer.Option(
        "wikitext2", "--dataset", "-d", help="wikitext2 | c4 | britannica | text:PATH (its test split)."
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
) -> None:
    """Perplexity by the standard protocol (non-overlapping windows, mean NLL, last window kept)."""
    import json
    from pathlib import Path

    import torch

    from gac.data import load_text
    from gac.errors import GacError
    from gac.eval.ppl import perplexity
    from gac.models import load_model
    from gac.utils import atomic_write_text, console

    dev = ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device
    dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if dtype == "auto":
        dt = torch.bfloat16 if dev.startswith("cuda") else torch.float32
    elif dtype in dtypes:
        dt = dtypes[dtype]
    else:
        raise GacError(f"unknown dtype {dtype!r}; use auto, {', '.join(dtypes)}")
    text = load_text(dataset, "test")
    lm = load_model(model, dtype=dt, device=dev)
    tok = lm.tokenizer if tokenizer is None else load_model(tokenizer, device="cpu").tokenizer
    if tok is None:
        raise GacError(f"{model} has no tokenizer; pass --tokenizer with the base model")
    res = perplexity(lm.model, tok, text, seq_len=seq_len, batch_size=batch_size, max_windows=max_windows)
    res = {"model": model, "dataset": dataset, "device": dev, "dtype": str(dt).removeprefix("torch."), **res}
    partial = f", last partial window {res['last_window_tokens']} tokens" if res["last_window_tokens"] else ""
    trunc = " (first windows only: --max-windows)" if res["truncated"] else ""
    console.print(
        f"ppl {res['ppl']:.4f} on {dataset}: {res['n_windows']} windows of {seq_len}{partial}, "
        f"{res['n_predicted']:,} predicted tokens{trunc}"
    )
    if out:
        atomic_write_text(Path(out), json.dumps(res, indent=2) + "\n")
    typer.echo(json.dumps(res))
