"""``python -m gac.llm_eval``: quality of a variant (perplexity or lm-eval tasks).

    python -m gac.llm_eval --variant baseline|DIR|SPEC --suite ppl|lm_eval \\
        --baseline-model-id MODEL --out DIR [--tasks piqa,hellaswag] [--limit N]

``SPEC`` (e.g. ``asvd:0.85:gac``) compresses the baseline on the fly.  Results go to
``DIR/ppl.json`` or ``DIR/lm_eval.json`` (plus ``DIR/variant.json``: parameters, alignment),
which ``gac report`` reads.  The same command is ``gac eval lm_eval``: both call
:func:`gac.plans.suites.evaluate`.
"""

from __future__ import annotations

import argparse
import sys

from gac.plans.suites import QUALITY_SUITES, evaluate, parse_limit


def _tasks(s: str) -> list[str] | None:
    return [t.strip() for t in s.split(",") if t.strip()] or None


def build_parser() -> argparse.ArgumentParser:
    """The seed's command line; each option is a keyword of :func:`gac.plans.suites.evaluate`."""
    ap = argparse.ArgumentParser(prog="python -m gac.llm_eval", description=__doc__.splitlines()[0])
    ap.add_argument("--variant", required=True, help="baseline | a model directory | SPEC (asvd:0.85:gac)")
    ap.add_argument("--suite", required=True, choices=QUALITY_SUITES)
    ap.add_argument("--baseline-model-id", default=None, help="base model: alias, HF id, directory or GGUF")
    ap.add_argument("--out", required=True, help="results directory")
    ap.add_argument(
        "--tasks", type=_tasks, default=None, help="lm-eval tasks, comma separated (default: the five)"
    )
    ap.add_argument("--limit", type=float, default=None, help="examples per task (default: full sets)")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--num-fewshot", type=int, default=None)
    ap.add_argument(
        "--include-path", action="append", default=None, help="folder of local lm-eval task YAMLs"
    )
    ap.add_argument("--dataset", default="britannica", help="ppl: wikitext2 | c4 | britannica | text:PATH")
    ap.add_argument(
        "--allow-overlap", action="store_true", help="ppl: evaluate even on the calibration text (recorded)"
    )
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--max-windows", type=int, default=None)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--overwrite", action="store_true")
    return ap


def main(argv: list[str] | None = None) -> int:
    from gac.guard import run_main

    kw = vars(build_parser().parse_args(argv))
    kw["limit"] = parse_limit(kw["limit"])
    return run_main(lambda: evaluate(**kw))


if __name__ == "__main__":
    sys.exit(main())
