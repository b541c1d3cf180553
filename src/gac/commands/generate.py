"""``gac generate MODEL --prompt TEXT``: greedy generation on the fast path, with its speed."""

from __future__ import annotations

from typing import Annotated

import typer

from gac.commands import options as o
from gac.runtime.fastpath import GENERATE, FastPath, typer_options


def register(app: typer.Typer) -> None:
    @app.command("generate")
    @typer_options(GENERATE, panel="Fast path")
    def generate_cmd(
        model: o.MODEL,
        prompt: str = typer.Option(..., "--prompt", help="The text to continue."),
        max_new_tokens: Annotated[int, o.MAX_NEW_TOKENS()] = 32,
        device: Annotated[str, o.DEVICE()] = "auto",
        dtype: Annotated[str, o.DTYPE()] = "auto",
        fast: FastPath = None,  # type: ignore[assignment]  # one option per switch: gac.runtime.fastpath
        tokenizer: Annotated[str | None, o.TOKENIZER()] = None,
        json_out: Annotated[bool, o.JSON()] = False,
    ) -> None:
        """Greedy-decode after PROMPT (static cache; compiled steps and CUDA graphs on a GPU); print
        the text, the steady time to first token and decode tokens/s (one-time compile and capture
        costs reported apart), the paths that ran and the KV bytes per token (all in --json)."""
        import json

        from gac.errors import GacError
        from gac.eval.generate import generate
        from gac.models import load_model
        from gac.utils import console, out_console, resolve_device_dtype

        if not prompt.strip():
            raise GacError("the prompt is empty; give --prompt the text to continue")
        if max_new_tokens < 1:
            raise GacError(f"--max-new-tokens must be at least 1, got {max_new_tokens}")
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
        from gac.nn.latent import latent_attention_paths

        if json_out:
            # PaLU: which decode path each latent-attention layer took (None for other models)
            paths = {"latent_attention_path": latent_attention_paths(lm.model)}
            out_console.print_json(json.dumps({"model": model, **g.to_dict(), **paths}))
            return
        out_console.print(prompt + g.text, markup=False, highlight=False, soft_wrap=True)
        kernels = [k for k, v in g.paths["kernels"].items() if v.get("modules")]
        console.print(
            f"{g.new_tokens} tokens on {g.device}: time to first token {g.ttft_s * 1e3:.1f} ms "
            f"(steady prefill of {g.prompt_tokens} prompt tokens), {g.tokens_per_s:.1f} tokens/s "
            f"steady decode; one-time costs apart: first prefill {g.first_prefill_s:.2f} s, "
            f"decode step setup {g.decode_setup_s:.2f} s\n"
            f"path: compiled={g.compiled}, graphs={g.graphs}, attention={g.paths['attention']}"
            + (
                f", latent attention in {g.paths['latent_attention']} layers"
                if g.paths["latent_attention"]
                else ""
            )
            + f", decode kernels: {', '.join(kernels) or 'none'}; "
            f"KV cache {g.kv_bytes_per_token['cache']:,} bytes/token (dense {g.kv_bytes_per_token['dense']:,})",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
