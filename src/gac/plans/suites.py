"""One variant through one suite, results written to a directory: what ``gac eval lm_eval`` /
``gac eval infer`` and their seed entry points ``python -m gac.llm_eval`` / ``python -m gac.llm_run`` call.

* :func:`evaluate`: quality, the ``ppl`` or ``lm_eval`` suite; ``DIR/ppl.json`` or ``DIR/lm_eval.json``
  plus ``DIR/variant.json`` (parameters, alignment).
* :func:`run`: speed, the ``infer_sweep`` suite; the dense baseline is built, timed and freed first,
  then the variant, in the same process (:mod:`gac.eval.infer`), on the fast path by default;
  ``DIR/infer.json``, ``DIR/infer.csv`` and plots.

A variant is ``baseline``, a model directory or a ``SPEC`` (``asvd:0.85:gac``: the baseline
compressed on the fly, :mod:`gac.plans.variants`). ``gac report`` reads what both write.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from gac.errors import GacError
from gac.runtime.fastpath import INFER, FastPath

#: The suites of :func:`evaluate` (quality) and :func:`run` (speed).
QUALITY_SUITES = ("ppl", "lm_eval")
SPEED_SUITES = ("infer_sweep",)


def parse_limit(x: float | None) -> float | int | None:
    """lm-eval's ``limit``: a whole number of examples (>= 1) or a fraction of each task."""
    return None if x is None else (int(x) if float(x).is_integer() and x >= 1 else float(x))


def _check_out_dir(out: Path, name: str, overwrite: bool) -> Path:
    """``out/name``, refused before any work when it exists (without ``overwrite``), when ``out`` is a
    file, or when it cannot be written (:func:`gac.guard.check_out`)."""
    from gac.guard import check_out

    target = out / name
    if target.exists() and not overwrite:
        raise GacError(f"{target} already exists (pass --overwrite to replace it)")
    if out.exists() and not out.is_dir():
        raise GacError(f"--out {out} is a file, not a directory")
    check_out(target, overwrite=True, kind="file")  # /proc, unwritable parents: before any work
    return target


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
    from gac.utils import atomic_write_text, resolve_device_dtype

    if suite not in QUALITY_SUITES:
        raise GacError(f"unknown suite {suite!r}; choose one of: {', '.join(QUALITY_SUITES)}")
    spec = parse_variant(variant)  # bad variants fail before anything loads
    out = Path(out)
    target = _check_out_dir(out, f"{suite}.json", overwrite)
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
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "variant.json", json.dumps(info, indent=1, default=str))
    if suite == "ppl":
        if lv.tokenizer is None:
            raise GacError(
                f"variant {variant} has no tokenizer; pass --baseline-model-id with its base model"
            )
        if split is None:  # a SPEC compressed just now: its calibration record is in the report
            from gac.eval.ppl import check_calibration_overlap

            calib = (info.get("compression") or {}).get("calibration")
            split = check_calibration_overlap(calib, part, allow_overlap)
        return _ppl_suite(lv, spec.name, info, part, split, target, dataset, seq_len, batch_size, max_windows)
    return _lm_eval_suite(
        lv, spec.name, info, lm_tasks, target,
        limit=limit, batch_size=batch_size, num_fewshot=num_fewshot, include_path=include_path,
    )  # fmt: skip


def _meta(info: dict[str, Any]) -> dict[str, Any]:
    """What a result file records of its variant (its compression report stays in variant.json)."""
    return {k: v for k, v in info.items() if k != "compression"}


def _ppl_suite(lv: Any, name: str, info: dict[str, Any], part: Any, split: Any, target: Path, dataset: str,
               seq_len: int, batch_size: int, max_windows: int | None) -> dict[str, Any]:  # fmt: skip
    from gac.data import check_split_windows
    from gac.eval.ppl import perplexity
    from gac.utils import atomic_write_text, console

    check_split_windows(lv.tokenizer, dataset, seq_len)
    res = perplexity(
        lv.model, lv.tokenizer, part.text, seq_len=seq_len, batch_size=batch_size, max_windows=max_windows
    )
    res = {"schema": "gac.ppl/1", "dataset": dataset, "meta": _meta(info), **res, "split": split}
    atomic_write_text(target, json.dumps(res, indent=1, default=str))
    console.print(f"{name}: ppl {res['ppl']:.4f} on {dataset} -> {target}")
    return res


def _lm_eval_suite(lv: Any, name: str, info: dict[str, Any], tasks: list[str], target: Path,
                   **kw: Any) -> dict[str, Any]:  # fmt: skip
    from gac.eval.lm_eval_bridge import run_lm_eval
    from gac.utils import console

    res = run_lm_eval(lv.model, lv.tokenizer, tasks, out_json=target, meta=_meta(info), **kw)
    for task, t in res["tasks"].items():
        console.print(f"{name}: {task} {t['metric']} {t['value']:.4f}")
    failed = sorted(res.get("errors") or {})
    if failed:
        what = "every lm-eval task" if not res["tasks"] else f"{len(failed)} of {len(tasks)} lm-eval tasks"
        raise GacError(f"{what} failed ({', '.join(failed)}); the errors are recorded in {target}")
    return res


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
    from gac.eval.infer import SweepConfig, run_sweep, write_results
    from gac.plans.variants import parse_variant
    from gac.utils import resolve_device_dtype

    fast = FastPath.of(fast, **switches)
    if suite not in SPEED_SUITES:
        raise GacError(f"unknown suite {suite!r}; choose one of: {', '.join(SPEED_SUITES)}")
    spec = parse_variant(variant)
    out = Path(out)
    _check_out_dir(out, "infer.json", overwrite)
    dev, dt = resolve_device_dtype(device, dtype)
    if fast.triton and not dev.startswith("cuda"):
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
    res = run_sweep(_sweep_variants(spec, baseline_model_id, dt, dev, fast, infos), cfg, dev)
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


def _sweep_variants(
    spec: Any,
    baseline_model_id: str | None,
    dt: Any,
    dev: str,
    fast: FastPath,
    infos: dict[str, dict[str, Any]],
) -> list[Any]:
    """The models :func:`run` times: the dense baseline first, on the same fast path (fusion is
    exact for dense layers too), then ``spec`` (unless it is the baseline without ``triton``). Each is
    built when its turn comes; its variant info lands in ``infos`` under its name."""
    from gac.eval.infer import Variant
    from gac.plans.variants import load_variant, parse_variant

    def name_of(s: Any, transform: bool, triton: bool) -> str:
        # how a model ran (fused, compiled, graphs) is in res["options"]; the name says what it is
        return "+".join([s.name, *(["triton"] if triton and transform else [])])

    def builder(s: Any, transform: bool, triton: bool) -> Any:
        def build() -> Any:
            lv = load_variant(s, baseline_model_id, dtype=dt, device=dev)
            infos[name_of(s, transform, triton)] = _meta(lv.info)
            if transform:
                _transform(lv.model, fast.fuse, triton)
            return lv.model

        return build

    base = parse_variant("baseline")
    variants = [Variant(name_of(base, fast.fuse, False), builder(base, fast.fuse, False))]
    if spec.kind != "baseline" or fast.triton:
        variants.append(Variant(name_of(spec, True, fast.triton), builder(spec, True, fast.triton)))
    return variants


def _transform(model: Any, fuse: bool, triton: bool) -> None:
    if triton:
        from gac.runtime.lowrank_gemv import use_triton_lowrank_

        use_triton_lowrank_(model)
    if fuse:
        from gac.nn.fused import fuse_projections_

        fuse_projections_(model)
