"""Running a plan's cells in this process: one group at a time, one calibration per group.

The cells of one (model, compressor, ratio) form a *group* whose one calibration / sensitivity pass
(:func:`gac.api.plan`) serves every align strategy, each applied to a deep copy of the calibrated
model, as ``gac demo`` does. Each cell's evals (``ppl``, ``predict``, ``infer``) run on its model and
its record is written by :func:`gac.plans.store.write_cell`; a failing cell is recorded as failed and
the others go on. ``[[benches]]`` cells run one ``gac bench`` experiment each.
"""

from __future__ import annotations

import shlex
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from gac.errors import GacError
from gac.plans.schema import ALIGN_VARIANTS, BASE, BENCH, TINY, Cell, ExperimentPlan
from gac.plans.store import cell_state, write_cell
from gac.runtime import fastpath
from gac.runtime.fastpath import FastPath


def _load(spec: str, dtype: Any, device: str) -> tuple[Any, Any]:
    m = TINY.match(spec)
    if m:
        from gac.testing import char_tokenizer, tiny_model

        model = tiny_model(m.group(1), dtype=dtype).to(device)
        return model, char_tokenizer()
    from gac.models import load_model

    lm = load_model(spec, dtype=dtype, device=device)
    return lm.model, lm.tokenizer


def _infer(model: Any, e: dict[str, Any], label: str) -> dict[str, Any]:
    """The ``infer`` eval: the default ``gac eval infer`` path — q/k/v and gate/up fused (exact, in
    place: later evals see the same function), then :func:`gac.eval.infer.sweep_model` (compile +
    CUDA graphs on CUDA). ``fuse``, ``compile``, ``graphs`` = false turn each off."""
    from gac.eval.infer import SweepConfig, copy_bandwidth, model_device, sweep_model

    fast = FastPath(**{k: e[k] for k in fastpath.plan_keys() if k in e})
    fused = []
    if fast.fuse:
        from gac.nn.fused import fuse_projections_

        fused = fuse_projections_(model)

    grid = {
        k: tuple(e[k]) for k in ("prefill_batches", "prefill_seqs", "decode_batches", "decode_kv") if k in e
    }
    reps = {k: e[k] for k in ("prefill_reps", "decode_reps") if k in e}
    cfg = SweepConfig(
        **grid,
        **reps,
        **fast.to_dict(),
        capacity_context=e.get("capacity_context"),
        capacity_budget_gib=e.get("memory_budget_gib"),
        profile_kernels=False,
    )
    dev = model_device(model)
    cb = copy_bandwidth(dev, cfg.copy_bytes) if dev.type == "cuda" else {}
    rec = sweep_model(model, cfg, cb.get("gbps"), label=label)
    return {"config": cfg.to_dict(), "fused": len(fused), "copy_bandwidth": cb, **rec}


def _evaluate(
    plan: ExperimentPlan, cell: Cell, model: Any, tok: Any, report: Any, prof: Any
) -> dict[str, Any]:
    from gac.data import load_part
    from gac.eval.ppl import check_calibration_overlap, perplexity

    out: dict[str, Any] = {}
    for e in plan.evals:
        if e.get("models") is not None and cell.model not in e["models"]:
            continue
        if e["kind"] == "infer":
            out["infer"] = _infer(model, e, cell.id)
        elif e["kind"] == "ppl":
            src = e.get("source", "britannica")
            part = load_part(src, "test")
            split = check_calibration_overlap(report.calibration if report is not None else None, part)
            r = perplexity(
                model, tok, part.text, seq_len=e.get("seq_len", 512),
                batch_size=e.get("batch_size", 1), max_windows=e.get("windows"),
            )  # fmt: skip
            keep = ("ppl", "nll", "n_predicted", "seq_len", "n_windows", "tokens")
            out[f"ppl:{src}"] = {**{k: r[k] for k in keep}, "split": split}
        elif e["kind"] == "predict":
            a = report.allocation if report is not None else None
            out["predict"] = {
                "profile": prof.id if prof is not None else None,
                "predicted_speedup": 1.0 if a is None else a.get("predicted_speedup"),
                "pct_aligned": None if a is None else a.get("pct_aligned"),
            }
    return out


def _failed(
    plan: ExperimentPlan, plan_dir: Path, cell: Cell, e: BaseException, timings: dict[str, float]
) -> str:
    """Record ``cell`` as failed with ``e`` (called inside the ``except`` that caught it); ``failed``."""
    from gac.utils import console

    err = str(e) if isinstance(e, GacError) else f"{type(e).__name__}: {e}"
    write_cell(plan, plan_dir, cell, "failed", {}, timings, err, traceback.format_exc()[-2000:])
    console.print(f"[red]failed[/red] {cell.id}: {err}")
    return "failed"


def _prepare(
    plan: ExperimentPlan, first: Cell, dtype: Any, device: str, timings: dict[str, float]
) -> tuple[Any, ...]:
    """The group's shared work: load the model, then calibrate (a compressed group) or pick the
    profile (``base``). Returns ``(model, tokenizer, plan or None, profile)``; fills ``timings``."""
    t0 = time.perf_counter()
    base, tok = _load(first.model, dtype, device)
    timings["load_s"] = time.perf_counter() - t0
    if first.compressor == BASE:
        from gac.api import profile_for

        return base, tok, None, profile_for(base, plan.compress.get("profile"), None)
    from gac.api import plan as make_plan

    t0 = time.perf_counter()
    p = make_plan(base, plan.compress_config(first), tokenizer=tok)
    timings["plan_s"] = time.perf_counter() - t0
    return base, tok, p, p.profile


def _allocation_results(report: Any, alloc: Any) -> dict[str, Any]:
    """A compressed cell's deterministic results: parameters, budget, alignment, predictions, dims."""
    a = report.allocation
    return {
        "params": report.model_params_after,
        "targeted_ratio": report.targeted_ratio,
        "budget": report.budget,
        "cost": a.get("cost"),
        "pct_aligned": a.get("pct_aligned"),
        "predicted_speedup": a.get("predicted_speedup"),
        "dims": {k: int(v) for k, v in alloc.dims.items()},
        # the compressor's options as it ran (PaLU's: its group sizes and the rank caps with where they came from)
        "options": report.compressor_options,
        "serve": report.config.get("serve"),
        "guard": a.get("guard"),
        "predicted_serve": {r["point"]: r["speedup"] for r in a.get("serve") or []},
    }


def run_group(plan: ExperimentPlan, plan_dir: str | Path, group: str, force: bool = False) -> dict[str, str]:
    """Run the unfinished cells of ``group``: one load, one calibration, one apply per align.

    A failing cell is recorded as ``failed`` with its error; the group's other cells go on
    (a failure of the shared calibration fails every pending cell of the group).

    Returns:
        cell id -> ``done`` (skipped), ``ok`` or ``failed``.
    """
    import copy

    import torch

    from gac.utils import console, resolve_device_dtype

    plan_dir = Path(plan_dir)
    cells = plan.groups()[group]
    if cells[0].bench is not None:
        return {cells[0].id: run_bench_cell(plan, plan_dir, cells[0], force)}
    states = {c.id: cell_state(plan, plan_dir, c) for c in cells}
    todo = [c for c in cells if force or states[c.id] != "done"]
    out = {c.id: "done" for c in cells if c not in todo}
    if not todo:
        return out
    dev, dt = resolve_device_dtype(plan.device, plan.dtype)
    torch.manual_seed(0)
    shared: dict[str, float] = {}
    try:
        base, tok, p, prof = _prepare(plan, todo[0], dt, dev, shared)
    except Exception as e:  # noqa: BLE001 - recorded per cell, the plan goes on
        for c in todo:
            out[c.id] = _failed(plan, plan_dir, c, e, shared)
        return out
    for c in todo:
        t0 = time.perf_counter()
        try:
            if p is None:
                model, report = base, None
                results: dict[str, Any] = {"params": sum(q.numel() for q in base.parameters())}
            else:
                from gac.api import apply_

                model = copy.deepcopy(base)
                align, kw = ALIGN_VARIANTS.get(c.align, (c.align, {}))
                alloc = p.allocation(align, **kw)
                report = apply_(model, p, alloc)
                # the group's last cell: its evals need neither the plan nor the dense model
                if c is todo[-1]:
                    p = base = None
                    _release_memory()
                results = _allocation_results(report, alloc)
            with torch.no_grad():
                results["evals"] = _evaluate(plan, c, model, tok, report, prof)
            timings = {**shared, "cell_s": time.perf_counter() - t0}
            write_cell(plan, plan_dir, c, "ok", results, timings)
            out[c.id] = "ok"
            console.print(f"[green]done[/green] {c.id} ({timings['cell_s']:.1f} s)")
        except Exception as e:  # noqa: BLE001 - recorded, the rest go on
            out[c.id] = _failed(plan, plan_dir, c, e, {"cell_s": time.perf_counter() - t0})
    return out


def _release_memory() -> None:
    """Free what the dropped references held (a calibrated plan holds GiB of state on the GPU)."""
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


#: The per-point fields of a bench record kept in the cell (the full records stay in its raw_dir).
BENCH_POINT_KEYS = (
    "group",
    "series",
    "variant",
    "dim",
    "status",
    "median_ms",
    "tflops",
    "backend",
    "auto_backend",
)


def run_bench_cell(plan: ExperimentPlan, plan_dir: Path, cell: Cell, force: bool = False) -> str:
    """Run one ``[[benches]]`` experiment; raw points, CSV and plot under ``PLAN_DIR/kernels/<name>/``."""
    from gac.hardware.sweeps import Config, parse_dims, run_experiment
    from gac.hardware.timing import resolve_device
    from gac.utils import console

    if not force and cell_state(plan, plan_dir, cell) == "done":
        return "done"
    b = plan.cell_inputs(cell)["bench"]
    t0 = time.perf_counter()
    try:
        dev = resolve_device(plan.run_device())
        dtype = plan.dtype if plan.dtype != "auto" else ("bfloat16" if dev.type == "cuda" else "float32")
        cfg = Config.default_for(dev)
        for key, attr in (("batch", "batch"), ("seq_len", "seq"), ("heads", "heads"), ("m", "m"), ("k", "k"),
                          ("n", "n"), ("half_window", "half_window")):  # fmt: skip
            if key in b:
                setattr(cfg, attr, b[key])
        if "dims" in b:
            cfg.dims = parse_dims(str(b["dims"]))
        raw = plan_dir / BENCH / cell.bench
        rec = run_experiment(b["experiment"], dtype=dtype, out=raw, config=cfg, device=dev, show=False,
                             command=" ".join(shlex.quote(a) for a in sys.argv))  # fmt: skip
        points = rec.get("records", [])
        ok = sum(r.get("status") == "ok" for r in points)
        if not ok:
            raise GacError(f"{b['experiment']}: no point measured ({len(points)} failed)")
        results = {
            "experiment": b["experiment"],
            "dtype": rec.get("dtype"),
            "device_label": rec.get("device_label"),
            "config": rec.get("config"),
            "summary": rec.get("summary"),
            # every point, compact: what published values are compared with
            "records": [{k: r.get(k) for k in BENCH_POINT_KEYS if r.get(k) is not None} for r in points],
            "points_ok": ok,
            "points": len(points),
            "raw_dir": str(Path(BENCH) / cell.bench),
        }
        write_cell(plan, plan_dir, cell, "ok", results, {"cell_s": time.perf_counter() - t0})
        console.print(f"[green]done[/green] {cell.id} ({time.perf_counter() - t0:.1f} s)")
        return "ok"
    except Exception as e:  # noqa: BLE001 - recorded, the rest go on
        return _failed(plan, plan_dir, cell, e, {"cell_s": time.perf_counter() - t0})
