"""``gac generate MODEL --prompt TEXT``: greedy generation on the fast path, with its speed."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    @app.command("generate")
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
        no_compile: bool = typer.Option(False, "--no-compile", help="Do not torch.compile the decode step."),
        no_graphs: bool = typer.Option(
            False, "--no-graphs", help="Do not capture the decode step as a CUDA graph."
        ),
        no_gqa_decode: bool = typer.Option(
            False, "--no-gqa-decode", help="Keep transformers' sdpa (repeat_kv) for decode attention."
        ),
        no_gemv: bool = typer.Option(
            False, "--no-gemv", help="cuBLAS for every decode GEMV (no Triton-GEMV dispatch)."
        ),
        no_fused_lowrank: bool = typer.Option(
            False,
            "--no-fused-lowrank",
            help="Keep each factorized site's two GEMVs (no one-launch Triton kernel where measured faster).",
        ),
        no_branches: bool = typer.Option(
            False,
            "--no-branches",
            help="Second stages of fused q/k/v and gate/up one after the other (no parallel CUDA streams).",
        ),
        no_combo_kernels: bool = typer.Option(
            False,
            "--no-combo-kernels",
            help="Compile the decode step without Inductor's combo kernels (independent kernels launched together).",
        ),
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
            compile=False if no_compile else None,
            graphs=False if no_graphs else None,
            gqa_decode=not no_gqa_decode,
            gemv=not no_gemv,
            fused_lowrank=not no_fused_lowrank,
            branches=not no_branches,
            combo_kernels=not no_combo_kernels,
        )
        from gac.surgery.latent_attention import kv_bytes_per_token

        kvb = kv_bytes_per_token(lm.model)
        if json_out:
            out_console.print_json(
                json.dumps(
                    {
                        "model": model,
                        **g.to_dict(),
                        "kv_bytes_per_token": kvb["cache"],
                        "kv_bytes_per_token_dense": kvb["dense"],
                    }
                )
            )
            return
        out_console.print(prompt + g.text, markup=False, highlight=False, soft_wrap=True)
        console.print(
            f"{g.new_tokens} tokens on {g.device}: time to first token {g.ttft_s * 1e3:.1f} ms "
            f"({g.prompt_tokens} prompt tokens), {g.tokens_per_s:.1f} tokens/s after it"
            + (f"; compile + graph capture {g.setup_s:.1f} s (not in the latency)" if g.setup_s else "")
            + f"; KV cache {kvb['cache']:,} bytes/token (dense {kvb['dense']:,})"
            + f" [compiled={g.compiled}, graphs={g.graphs}]",
            markup=False,
            highlight=False,
        )
