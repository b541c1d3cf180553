"""``python -m gac.llm_run``: inference speed of a variant next to its dense baseline.

    python -m gac.llm_run --variant baseline|DIR|SPEC --suite infer_sweep \\
        --baseline-model-id MODEL --out DIR [--no-fuse] [--no-compile] [--no-graphs] ...

The dense baseline is built, timed and freed first, then the variant, in the same process
(see :mod:`gac.eval.infer`).  The fast path is the default, for both: q/k/v and gate/up fused
into one GEMM each (exact; the factors' first stages for a compressed model), every prefill
and decode step compiled by ``torch.compile`` at its static shape and replayed as a CUDA
graph.  Compile and capture time is reported apart (``setup_s``), never in the latency.
On CPU, compile and graphs fall back to eager with a one-line notice.  Writes ``DIR/infer.json``, ``DIR/infer.csv`` and plots.
The same command is ``gac eval infer``: both call :func:`gac.plans.suites.run`.
"""

from __future__ import annotations

import argparse
import sys

from gac.plans.suites import SPEED_SUITES, run
from gac.runtime.fastpath import INFER, add_arguments


def build_parser() -> argparse.ArgumentParser:
    """The seed's command line; each option is a keyword of :func:`gac.plans.suites.run` (the
    fast-path switches from :class:`gac.runtime.FastPath`)."""
    ap = argparse.ArgumentParser(prog="python -m gac.llm_run", description=__doc__.splitlines()[0])
    ap.add_argument("--variant", required=True, help="baseline | a model directory | SPEC (asvd:0.85:gac)")
    ap.add_argument("--suite", default="infer_sweep", choices=SPEED_SUITES)
    ap.add_argument("--baseline-model-id", default=None)
    ap.add_argument("--out", required=True)
    ap.add_argument("--prefill-batches", default="1,8")
    ap.add_argument("--prefill-seqs", default="128,512,1024,2048")
    ap.add_argument("--decode-batches", default="1,16,64")
    ap.add_argument("--decode-kv", default="512,4096")
    add_arguments(ap, INFER)  # --graphs/--no-graphs, --no-fuse, --no-gemv, ...: gac.runtime.fastpath
    ap.add_argument("--prefill-reps", type=int, default=10)
    ap.add_argument("--decode-reps", type=int, default=30)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--overwrite", action="store_true")
    return ap


def main(argv: list[str] | None = None) -> int:
    from gac.guard import run_main

    kw = vars(build_parser().parse_args(argv))  # the switches go by name: run(..., gemv=False)
    return run_main(lambda: run(**kw))


if __name__ == "__main__":
    sys.exit(main())
