"""`gac generate`'s time to first token against the sweep's prefill at the same prompt length (GPU).

    PYTHONPATH=src python benchmarks/tools/gpu_generate_ttft.py --out $OUT/generate_ttft.json

SmolLM2-135M (the embedded model), bf16, the default path: ``gac.generate`` on a Britannica prompt,
then :func:`gac.eval.infer.sweep_model`'s prefill point at B=1 and S = the prompt's token count and its
decode point at B=1, KV = prompt + new tokens. Target: ``ttft_s`` within 2x of the sweep's prefill.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from gac.data import load_text
from gac.eval.generate import generate
from gac.eval.infer import SweepConfig, sweep_model
from gac.hardware.timing import environment
from gac.models import load_model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--words", type=int, default=16, help="prompt length in words of Britannica text")
    ap.add_argument("--new-tokens", type=int, default=64)
    a = ap.parse_args()
    lm = load_model("smollm2", dtype=torch.bfloat16, device="cuda")
    prompt = " ".join(load_text("britannica", "test").split()[: a.words])
    g = generate(lm.model, lm.tokenizer, prompt, max_new_tokens=a.new_tokens, stop_at_eos=False)
    cfg = SweepConfig(prefill_batches=(1,), prefill_seqs=(g.prompt_tokens,), decode_batches=(1,),
                      decode_kv=(max(64, g.prompt_tokens + a.new_tokens),), profile_kernels=False)  # fmt: skip
    sw = sweep_model(lm.model, cfg, label="smollm2")
    pre = sw["prefill"][0]["median_ms"]
    dec = sw["decode"][0]["median_ms"]
    rec = {
        "command": "PYTHONPATH=src python benchmarks/tools/gpu_generate_ttft.py --out ...",
        "generate": g.to_dict(),
        "sweep_prefill_ms": pre,
        "sweep_decode_ms": dec,
        "ttft_over_sweep_prefill": g.ttft_s * 1e3 / pre,
        "generate_decode_ms_per_token": 1e3 / g.tokens_per_s if g.tokens_per_s else None,
        "target_met": g.ttft_s * 1e3 <= 2 * pre,
        "env": environment("cuda"),
    }
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(rec, indent=1, default=str))
    print(json.dumps({k: rec[k] for k in ("sweep_prefill_ms", "ttft_over_sweep_prefill", "target_met")}))
    print(
        f"ttft {g.ttft_s * 1e3:.3f} ms (first prefill {g.first_prefill_s:.2f} s), decode {g.tokens_per_s:.0f} tok/s"
    )


if __name__ == "__main__":
    main()
