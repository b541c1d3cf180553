"""``gac generate MODEL --prompt TEXT``: greedy generation on the fast path, with its speed."""

from __future__ import annotations

import typer

from gac.runtime.fastpath import GENERATE, FastPath, typer_options


def register(app: typer.Typer) -> None:
    @app.command("generate")
    @typer_options(GENERATE)
    def generate_cmd(
        model: str = typer.Argument(
            ..., help="Model: alias (smollm2), gac/HF directory, .gguf file or hub id."
        ),
        prompt: str = typer.Option(..., "--prompt", "-p", help="The text to continue."),
        max_new_tokens: int = typer.Option(32, "--max-new-tokens", "-n", help="Tokens to generate."),
        device: str = typer.Option("auto", "--device", help="auto | cpu | cuda | cuda:N."),
        dtype: str = typer.Option(
            "auto", "--dtype", help="auto (bf16 on GPU, fp32 on CPU) | float32 | bfloat16 | float16."
        ),
        fast: FastPath = None,  # type: ignore[assignment]  # one option per switch: gac.runtime.fastpath
        tokenizer: str | None = typer.Option(
            None, "--tokenizer", help="Take the tokenizer from this model spec."
        ),
        json_out: bool = typer.Option(False, "--json", help="Print the result as JSON instead of text."),
    ) -> None:
        """Greedy-decode after PROMPT (static cache; compiled step and CUDA graph on a GPU); print
        the text, time to first token and tokens/s (compile and capture time reported apart)."""
        import json

        from gac.errors import GacError
        from gac.eval.generate import generate
        from gac.models import load_model
        from gac.utils import console, out_console, resolve_device_dtype

        if max_new_tokens < 1:
            raise GacError(f"--max-new-tokens must be positive, got {max_new_tokens}")
        dev, dt = resolve_device_dtype(device, dtype)
        lm = load_model(model, dtype=dt, device=dev)
        tok = lm.tokenizer if tokenizer is None else load_model(tokenizer, device="cpu").tokenizer
        if tok is None:
            raise GacError(f"{model} has no tokenizer; pass --tokenizer with the base model")
        g = generate(
            lm.model,
            tok,
            prompt,
            max_new_tokens,
            fast=fast,
        )
        if json_out:
            out_console.print_json(json.dumps({"model": model, **g.to_dict()}))
            return
        out_console.print(prompt + g.text, markup=False, highlight=False, soft_wrap=True)
        console.print(
            f"{g.new_tokens} tokens on {g.device}: time to first token {g.ttft_s * 1e3:.1f} ms "
            f"({g.prompt_tokens} prompt tokens), {g.tokens_per_s:.1f} tokens/s after it"
            + (f"; compile + graph capture {g.setup_s:.1f} s (not in the latency)" if g.setup_s else "")
            + f" [compiled={g.compiled}, graphs={g.graphs}]",
            markup=False,
            highlight=False,
        )
