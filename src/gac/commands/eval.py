"""`gac eval ...`: perplexity (`ppl`), downstream tasks (`lm_eval`) and inference sweeps (`infer`)."""

from __future__ import annotations

import typer

eval_app = typer.Typer(
    help="Evaluate a model: perplexity, lm-eval tasks, inference speed.", no_args_is_help=True
)


def register(app: typer.Typer) -> None:
    app.add_typer(eval_app, name="eval")
