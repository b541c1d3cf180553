"""``python -m gac.llm_eval``: quality of a variant (perplexity or lm-eval tasks).

    python -m gac.llm_eval --variant baseline|DIR|SPEC --suite ppl|lm_eval \\
        --baseline-model-id MODEL --out DIR [--tasks piqa,hellaswag] [--limit N]

``SPEC`` (e.g. ``asvd:0.85:gac``) compresses the baseline on the fly.  Results go to
``DIR/ppl.json`` or ``DIR/lm_eval.json`` (plus ``DIR/variant.json``: parameters, alignment),
which ``gac report`` reads.  The same command is ``gac eval lm_eval``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from gac.errors import GacError
from gac.utils import resolve_device_dtype

SUITES = ("ppl", "lm_eval")


def _target(out: Path, name: str, overwrite: bool) -> Path:
    p = out / name
    if p.exists() and not overwrite:
        raise GacError(f"{p} already exists (pass --overwrite to replace it)")
    return p


def evaluate(
    variant: str,
    suite: str,
    baseline_model_id: str | None,
    out: str | Path,
    *,
    tasks: list[str] | None = None,
    limit: float | None = None,
    batch_size: int = 8,
    num_fewshot: int | None = None,
    include_path: list[str] | None = None,
    dataset: str = "britannica",
    allow_overlap: bool = False,
    seq_len: int = 2048,
    max_windows: int | None = None,
    device: str = "auto",
    dtype: str = "auto",
    overwrite: bool = False,
) -> dict[str, Any]:
    """Load (or compress) ``variant`` and run ``suite``; write the results under ``out``."""
    from gac.plans.variants import load_variant, parse_variant
    from gac.utils import atomic_write_text, console

    if suite not in SUITES:
        raise GacError(f"unknown suite {suite!r}; choose one of: {', '.join(SUITES)}")
    spec = parse_variant(variant)  # bad variants fail before anything loads
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise GacError(f"--out {out} is a file, not a directory")
    target = _target(out, f"{suite}.json", overwrite)
    from gac.guard import check_out

    check_out(target, overwrite=True, kind="file")  # /proc, unwritable parents: before any work
    dev, dt = resolve_device_dtype(device, dtype)
    lm_tasks: list[str] = []
    if suite == "lm_eval":
        from gac.eval.lm_eval_bridge import DEFAULT_TASKS, check_tasks, task_manager

        lm_tasks = list(tasks or DEFAULT_TASKS)
        check_tasks(lm_tasks, task_manager(include_path))  # before the model loads
    part = split = None
    if suite == "ppl":
        from gac.data import load_part
        from gac.eval.ppl import check_calibration_overlap, saved_calibration

        part = load_part(dataset, "test")
        if spec.kind == "dir" and spec.path is not None:
            split = check_calibration_overlap(saved_calibration(spec.path), part, allow_overlap)
    lv = load_variant(spec, baseline_model_id, dtype=dt, device=dev)
    info = {**lv.info, "device": dev, "dtype": str(dt).removeprefix("torch.")}
    info_lite = {k: v for k, v in info.items() if k != "compression"}
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "variant.json", json.dumps(info, indent=1, default=str))
    if suite == "ppl":
        from gac.eval.ppl import perplexity

        if lv.tokenizer is None:
            raise GacError(
                f"variant {variant} has no tokenizer; pass --baseline-model-id with its base model"
            )
        from gac.data import check_split_windows

        if split is None:  # a SPEC compressed just now: its calibration record is in the report
            calib = (info.get("compression") or {}).get("calibration")
            split = check_calibration_overlap(calib, part, allow_overlap)
        check_split_windows(lv.tokenizer, dataset, seq_len)
        res = perplexity(
            lv.model, lv.tokenizer, part.text, seq_len=seq_len, batch_size=batch_size, max_windows=max_windows
        )
        res = {"schema": "gac.ppl/1", "dataset": dataset, "meta": info_lite, **res, "split": split}
        atomic_write_text(target, json.dumps(res, indent=1, default=str))
        console.print(f"{spec.name}: ppl {res['ppl']:.4f} on {dataset} -> {target}")
        return res
    from gac.eval.lm_eval_bridge import run_lm_eval

    res = run_lm_eval(
        lv.model,
        lv.tokenizer,
        lm_tasks,
        limit=limit,
        batch_size=batch_size,
        num_fewshot=num_fewshot,
        include_path=include_path,
        out_json=target,
        meta=info_lite,
    )
    for name, t in res["tasks"].items():
        console.print(f"{spec.name}: {name} {t['metric']} {t['value']:.4f}")
    failed = sorted(res.get("errors") or {})
    if failed:
        what = "every lm-eval task" if not res["tasks"] else f"{len(failed)} of {len(lm_tasks)} lm-eval tasks"
        raise GacError(f"{what} failed ({', '.join(failed)}); the errors are recorded in {target}")
    return res


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m gac.llm_eval", description=__doc__.splitlines()[0])
    ap.add_argument("--variant", required=True, help="baseline | a model directory | SPEC (asvd:0.85:gac)")
    ap.add_argument("--suite", required=True, choices=SUITES)
    ap.add_argument("--baseline-model-id", default=None, help="base model: alias, HF id, directory or GGUF")
    ap.add_argument("--out", required=True, help="results directory")
    ap.add_argument("--tasks", default=None, help="lm-eval tasks, comma separated (default: the five)")
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


def parse_limit(x: float | None) -> float | int | None:
    return None if x is None else (int(x) if float(x).is_integer() and x >= 1 else float(x))


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    from gac.guard import run_main

    return run_main(
        lambda: evaluate(
            a.variant,
            a.suite,
            a.baseline_model_id,
            a.out,
            tasks=[t.strip() for t in a.tasks.split(",") if t.strip()] if a.tasks else None,
            limit=parse_limit(a.limit),
            batch_size=a.batch_size,
            num_fewshot=a.num_fewshot,
            include_path=a.include_path,
            dataset=a.dataset,
            allow_overlap=a.allow_overlap,
            seq_len=a.seq_len,
            max_windows=a.max_windows,
            device=a.device,
            dtype=a.dtype,
            overwrite=a.overwrite,
        )
    )


if __name__ == "__main__":
    sys.exit(main())
