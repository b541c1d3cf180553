"""``python -m gac.llm_run``: inference speed of a variant next to its dense baseline.

    python -m gac.llm_run --variant baseline|DIR|SPEC --suite infer_sweep \\
        --baseline-model-id MODEL --out DIR [--no-fuse] [--no-compile] [--no-graphs] ...

The dense baseline is built, timed and freed first, then the variant, in the same process
(see :mod:`gac.eval.infer`).  The fast path is the default, for both: q/k/v and gate/up fused
into one GEMM each (exact; the factors' first stages for a compressed model), every prefill
and decode step compiled by ``torch.compile`` at its static shape and replayed as a CUDA
graph.  Compile and capture time is reported apart (``setup_s``), never in the latency.
On CPU, compile and graphs fall back to eager with a one-line notice.  Writes ``DIR/infer.json``, ``DIR/infer.csv`` and plots.
The same command is ``gac eval infer``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from gac.errors import GacError
from gac.runtime.fastpath import INFER, FastPath, add_arguments, from_namespace

SUITES = ("infer_sweep",)


def _ints(s: str | tuple[int, ...]) -> tuple[int, ...]:
    if isinstance(s, tuple):
        return s
    try:
        vals = tuple(int(x) for x in str(s).split(",") if x.strip())
    except ValueError:
        raise GacError(f"expected comma-separated integers, got {s!r}") from None
    if not vals or any(v < 1 for v in vals):
        raise GacError(f"expected positive integers, got {s!r}")
    return vals


def run(
    variant: str,
    baseline_model_id: str | None,
    out: str | Path,
    *,
    suite: str = "infer_sweep",
    prefill_batches: str | tuple[int, ...] = (1, 8),
    prefill_seqs: str | tuple[int, ...] = (128, 512, 1024, 2048),
    decode_batches: str | tuple[int, ...] = (1, 16, 64),
    decode_kv: str | tuple[int, ...] = (512, 4096),
    prefill_reps: int = 10,
    decode_reps: int = 30,
    capacity_context: int | None = None,
    memory_budget: float | None = None,
    device: str = "auto",
    dtype: str = "auto",
    overwrite: bool = False,
    plots: bool = True,
    fast: FastPath | None = None,
    **switches: Any,
) -> dict[str, Any]:
    """Time the baseline and ``variant`` on the fast path (fused, compiled, graphs) and write the results.

    ``fast`` holds the switches (:class:`gac.runtime.FastPath`; default: the default path), and a
    switch may also be given by name (``gemv=False``).  ``graphs`` and ``compile`` default to on
    where CUDA is; ``fuse`` applies to the baseline and the variant alike, so the speedup
    compares like with like.
    """
    from gac.eval.infer import SweepConfig, Variant, run_sweep, write_results
    from gac.plans.variants import load_variant, parse_variant
    from gac.utils import resolve_device_dtype

    fast = FastPath.of(fast, **switches)
    fuse, triton = fast.fuse, fast.triton
    if suite not in SUITES:
        raise GacError(f"unknown suite {suite!r}; choose one of: {', '.join(SUITES)}")
    spec = parse_variant(variant)
    out = Path(out)
    if (out / "infer.json").exists() and not overwrite:
        raise GacError(f"{out / 'infer.json'} already exists (pass --overwrite to replace it)")
    from gac.guard import check_out

    if out.exists() and not out.is_dir():
        raise GacError(f"--out {out} is a file, not a directory")
    check_out(out / "infer.json", overwrite=True, kind="file")  # /proc, unwritable parents: now
    dev, dt = resolve_device_dtype(device, dtype)
    if triton and not dev.startswith("cuda"):
        raise GacError("the Triton low-rank kernel runs on CUDA only; drop --triton or use a GPU")
    cfg = SweepConfig(
        prefill_batches=_ints(prefill_batches),
        prefill_seqs=_ints(prefill_seqs),
        decode_batches=_ints(decode_batches),
        decode_kv=_ints(decode_kv),
        prefill_reps=prefill_reps,
        decode_reps=decode_reps,
        **fast.to_dict(),
        capacity_context=capacity_context,
        capacity_budget_gib=memory_budget,
    )
    if min(cfg.decode_kv) < cfg.decode_warmup + cfg.decode_reps:
        raise GacError(
            f"decode KV lengths must be >= warm-up + reps ({cfg.decode_warmup + cfg.decode_reps}); got {min(cfg.decode_kv)}"
        )
    infos: dict[str, dict[str, Any]] = {}

    def builder(s, transform: bool, triton: bool = triton):
        def build():
            lv = load_variant(s, baseline_model_id, dtype=dt, device=dev)
            infos[name_of(s, transform, triton)] = {k: v for k, v in lv.info.items() if k != "compression"}
            if transform:
                _transform(lv.model, fuse, triton)
            return lv.model

        return build

    def name_of(s, transform: bool, triton: bool = triton) -> str:
        # how a model ran (fused, compiled, graphs) is in res["options"]; the name says what it is
        tags = ["triton"] if triton and transform else []
        return "+".join([s.name, *tags])

    base = parse_variant("baseline")
    # the dense baseline first, on the same fast path (fusion is exact for dense layers too)
    variants = [Variant(name_of(base, fuse, False), builder(base, fuse, triton=False))]
    if spec.kind != "baseline" or triton:
        variants.append(Variant(name_of(spec, True), builder(spec, True)))
    res = run_sweep(variants, cfg, dev)
    res["command"] = " ".join(sys.argv)
    res["options"] = fast.only(INFER)
    for name, info in infos.items():
        if name in res["variants"]:
            res["variants"][name]["meta"] = info
    write_results(res, out, plots=plots)
    points = [
        x
        for v in res.get("variants", {}).values()
        for x in (v.get("prefill") or []) + (v.get("decode") or [])
    ]
    if points and not any(x.get("status") == "ok" for x in points):
        bad = sorted({str(x.get("status")) for x in points})
        raise GacError(
            f"every point of the sweep failed ({', '.join(bad)}); the errors are recorded in {out / 'infer.json'}"
        )
    return res


def _transform(model, fuse: bool, triton: bool) -> None:
    if triton:
        from gac.kernels.lowrank_gemv import use_triton_lowrank_

        use_triton_lowrank_(model)
    if fuse:
        from gac.kernels.fusion import fuse_projections_

        fuse_projections_(model)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m gac.llm_run", description=__doc__.splitlines()[0])
    ap.add_argument("--variant", required=True, help="baseline | a model directory | SPEC (asvd:0.85:gac)")
    ap.add_argument("--suite", default="infer_sweep", choices=SUITES)
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
    a = build_parser().parse_args(argv)
    from gac.guard import run_main

    return run_main(
        lambda: run(
            a.variant,
            a.baseline_model_id,
            a.out,
            suite=a.suite,
            prefill_batches=a.prefill_batches,
            prefill_seqs=a.prefill_seqs,
            decode_batches=a.decode_batches,
            decode_kv=a.decode_kv,
            fast=from_namespace(a, INFER),
            prefill_reps=a.prefill_reps,
            decode_reps=a.decode_reps,
            device=a.device,
            dtype=a.dtype,
            overwrite=a.overwrite,
        )
    )


if __name__ == "__main__":
    sys.exit(main())
