"""``gac report``: the report of a plan directory (per-model tables, speed-vs-quality frontiers) and
the dispatch to :mod:`gac.plans.results` for any other directory of results (:func:`report`).

Reads ``plan.json`` and ``cells/**.json`` (written by ``gac run``); writes ``report.md``, one
``frontier_<model>_<profile>.png`` per model and GPU profile: quality (perplexity) against the
speedup predicted from that GPU's profile, the Pareto frontier drawn through the best cells; one
``speedup_<model>.png`` per model with ``infer`` results: each compressed cell's measured speedup over
dense at every grid point, its ideal and the latency model's prediction beside it, 1.0 marked; and one
``serving_<model>.png`` per model with serving shapes and a ``ppl`` eval: perplexity against the worst
serving-shape speedup.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gac.errors import GacError
from gac.guard import atomic_savefig
from gac.plans.schema import BASE, slug
from gac.plans.store import is_plan_dir, plan_from_dir, read_cell

#: A cell of the plan and its record (None: not run).
CellRecord = tuple[Any, dict[str, Any] | None]


def report(results_dir: str | Path, out: str | Path | None = None) -> Path:
    """``gac report``: a plan directory's report (:func:`render_plan`) or, for any other directory of
    results, :func:`gac.plans.results.render` of what :func:`gac.plans.results.collect` finds; the
    Markdown path. Raises :class:`GacError` when nothing usable is found."""
    root = Path(results_dir)
    if not root.is_dir():
        raise GacError(f"{root} is not a directory of gac results")
    if is_plan_dir(root):  # written by `gac run PLAN.toml`
        return render_plan(root, Path(out) if out else None)
    from gac.plans.results import collect, render

    rows = collect(root)
    if not rows:
        raise GacError(f"no gac results (infer.json, lm_eval.json, ppl.json, variant.json) under {root}")
    o = Path(out) if out else root
    o.mkdir(parents=True, exist_ok=True)
    return render(rows, o, root)


def _f(x: Any, fmt: str) -> str:
    return "–" if x is None else format(x, fmt)


def frontier(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The Pareto-optimal points (higher speedup, lower perplexity), by increasing speedup.

    >>> frontier([(1.0, 10.0), (1.2, 11.0), (1.1, 12.0), (1.3, 10.5)])
    [(1.0, 10.0), (1.3, 10.5)]
    """
    best: list[tuple[float, float]] = []
    for s, q in sorted(points, key=lambda p: (-p[0], p[1])):
        if not best or q < best[-1][1]:
            best.append((s, q))
    return sorted(best)


def point_key(r: dict[str, Any]) -> str:
    """``prefill_b8_s2048`` / ``decode_b1_kv512``: the name of one inference grid point."""
    if r["phase"] == "prefill":
        return f"prefill_b{r['batch']}_s{r['seq']}"
    return f"decode_b{r['batch']}_kv{r['kv']}"


def infer_speedups(cells: list[tuple[Any, dict[str, Any] | None]]) -> dict[str, dict[str, Any]]:
    """Per cell id: speedup over its model's ``base`` cell at every grid point of the ``infer`` eval.

    Also ``ideal_<point>``: the bytes-ideal (decode: weights + KV cache moved) or FLOP-ideal
    (prefill: :func:`gac.eval.infer.prefill_flops`; the parameter ratio for cells recorded without
    FLOPs) speedup beside it.
    """
    from gac.eval.infer import add_speedups

    out: dict[str, dict[str, Any]] = {}
    by_model: dict[str, list[tuple[Any, dict[str, Any]]]] = {}
    for c, d in cells:
        inf = (
            ((d or {}).get("results") or {}).get("evals", {}).get("infer")
            if d and d.get("status") == "ok"
            else None
        )
        if inf and c.bench is None:
            by_model.setdefault(c.model, []).append((c, d))
    for rows in by_model.values():
        base = next(((c, d) for c, d in rows if c.compressor == BASE), None)
        if base is None:
            continue
        res = {"variants": {base[0].id: json.loads(json.dumps(base[1]["results"]["evals"]["infer"]))}}
        for c, d in rows:
            if c.compressor != BASE:
                res["variants"][c.id] = json.loads(json.dumps(d["results"]["evals"]["infer"]))
        add_speedups(res, baseline=base[0].id)
        bparams = base[1]["results"].get("params")
        base_fb = {point_key(r): r.get("fallback") for r in base[1]["results"]["evals"]["infer"]["prefill"]
                   + base[1]["results"]["evals"]["infer"]["decode"] if r.get("fallback")}  # fmt: skip
        for c, d in rows:
            v = res["variants"][c.id]
            sp: dict[str, Any] = {}
            for r in v["prefill"] + v["decode"]:
                k = point_key(r)
                sp[k] = r.get("speedup")
                fb = r.get("fallback") or base_fb.get(k)
                if fb:  # this point did not run the default (compiled, graphed) path: the table says so
                    sp[f"fallback_{k}"] = fb
                ideal = r.get("bytes_ideal_speedup") or r.get("flop_ideal_speedup")
                if ideal is None and r["phase"] == "prefill" and bparams and d["results"].get("params"):
                    ideal = bparams / d["results"]["params"]  # cells written before FLOPs were recorded
                sp[f"ideal_{k}"] = ideal
            out[c.id] = sp
    return out


def infer_predictions(cells: list[tuple[Any, dict[str, Any] | None]]) -> dict[str, dict[str, Any]]:
    """Per model: the latency model's predicted speedup beside the measured one at every grid point.

    Each cell with an ``infer`` eval is compared with its model's ``base`` cell by
    :func:`gac.runtime.cells.compare_cells` (the cell's structure rebuilt on the meta device
    from its model spec and kept dims). Returns ``{model: {cell id: {"profile", "rows", "worst"}
    or {"error"}}}``.
    """
    from gac.hardware.latency import infer_of
    from gac.runtime.cells import compare_cells

    out: dict[str, dict[str, Any]] = {}
    by_model: dict[str, list[tuple[Any, dict[str, Any]]]] = {}
    for c, d in cells:
        if d is not None and c.bench is None and infer_of(d) is not None:
            by_model.setdefault(c.model, []).append((c, d))
    for model, rows in by_model.items():
        base = next((d for c, d in rows if c.compressor == BASE), None)
        if base is None:
            continue
        try:
            res = compare_cells(base, [d for c, d in rows if c.compressor != BASE])
        except (GacError, OSError, ValueError) as e:
            res = {"*": {"error": str(e), "rows": []}}
        if res:
            out[model] = res
    return out


def prediction_lines(model: str, pred: dict[str, Any]) -> list[str]:
    """Markdown: predicted / measured speedup (and their ratio) per cell and point, and the worst."""
    from gac.hardware.latency import worst

    ok = {cid: r for cid, r in pred.items() if r.get("rows")}
    lines: list[str] = []
    if ok:
        pts = list(dict.fromkeys(row["point"] for r in ok.values() for row in r["rows"]))
        profs = ", ".join(sorted({str(r.get("profile")) for r in ok.values()}))
        lines += [f"Predicted against measured speedup ({model}; latency model `gac.hardware.latency`, "
                  f"profile {profs}): predicted / measured (predicted ÷ measured):", "",
                  "| cell | " + " | ".join(pts) + " |", "|" + "---|" * (len(pts) + 1)]  # fmt: skip
        for cid, r in ok.items():
            by = {row["point"]: row for row in r["rows"]}
            cells = [
                f"{by[p]['predicted_speedup']:.3f} / {by[p]['measured_speedup']:.3f} ({by[p]['ratio']:.2f})"
                if p in by
                else "–"
                for p in pts
            ]
            lines.append(f"| {cid} | " + " | ".join(cells) + " |")
        allrows = [dict(row, cell=cid) for cid, r in ok.items() for row in r["rows"]]
        w = worst(allrows)
        if w is not None:
            lines += ["", f"Worst disagreement over the grid: {w['cell']} at {w['point']}, predicted "
                      f"{w['predicted_speedup']:.3f} against measured {w['measured_speedup']:.3f} "
                      f"({abs(w['ratio'] - 1):.1%} off)."]  # fmt: skip
        notes = sorted({str(r["note"]) for r in ok.values() if r.get("note")})
        lines += [f"Note: {n}" for n in notes]
        lines.append("")
    for cid, r in pred.items():
        if r.get("error"):
            lines += [f"No prediction for {cid}: {r['error']}", ""]
    return lines


def bandwidth_line(infer: dict[str, Any] | None) -> str | None:
    """How close a (dense) cell's decode steps come to the GPU's copy bandwidth, as one report line.

    Each decode point's weight bytes over its step time, as a share of the copy bandwidth measured in
    the same run (``weight_bw_frac`` of :func:`gac.eval.infer.sweep_model`); None without such points.
    """
    pts = [r for r in (infer or {}).get("decode") or [] if r.get("weight_bw_frac")]
    gbps = ((infer or {}).get("copy_bandwidth") or {}).get("gbps")
    if not pts or not gbps:
        return None
    shares = ", ".join(f"B{r['batch']} KV{r['kv']} {100 * r['weight_bw_frac']:.1f}%" for r in pts)
    return f"Dense decode moves its weights at this share of the copy bandwidth measured in the run ({gbps:.0f} GB/s): {shares}."


def speed_plot(
    plt: Any, model: str, mspeed: list[tuple[Any, dict[str, Any]]], pred: dict[str, Any] | None, path: Path
) -> bool:
    """``speedup_<model>.png``: measured speedup (bars), ideal (–) and predicted (x) per grid point.

    One bar per compressed cell at every point of the ``infer`` grid; the dense base (1.0 everywhere)
    is the horizontal line. Returns False (nothing written) when no compressed cell was measured.
    """
    cells = [(c, sp) for c, sp in mspeed if c.compressor != BASE]
    if not cells:
        return False
    pts = point_keys(cells[0][1])
    n = len(cells)
    width = 0.8 / n
    fig, ax = plt.subplots(figsize=(max(6.4, 0.75 * len(pts) + 1.5), 4.2))
    for i, (c, sp) in enumerate(cells):
        xs = [j - 0.4 + width * (i + 0.5) for j in range(len(pts))]
        ax.bar(xs, [sp.get(k) or 0.0 for k in pts], width * 0.9, color=f"C{i}", label=c.id.split("/")[-1])
        ideal = [(x, sp.get(f"ideal_{k}")) for x, k in zip(xs, pts, strict=True) if sp.get(f"ideal_{k}")]
        ax.scatter([x for x, _ in ideal], [y for _, y in ideal], marker="_", s=120, color="k", zorder=3,
                   label="ideal" if i == 0 else None)  # fmt: skip
        rows = {r["point"]: r for r in ((pred or {}).get(c.id) or {}).get("rows") or []}
        got = [(x, rows[k]["predicted_speedup"]) for x, k in zip(xs, pts, strict=True) if k in rows]
        ax.scatter([x for x, _ in got], [y for _, y in got], marker="x", s=30, color="0.3", zorder=4,
                   label="predicted" if i == 0 and got else None)  # fmt: skip
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks(range(len(pts)))
    ax.set_xticklabels([k.replace("prefill_", "pre ").replace("decode_", "dec ") for k in pts], rotation=45,
                       ha="right", fontsize=8)  # fmt: skip
    lo = min([sp.get(k) or 1.0 for _, sp in cells for k in pts] + [1.0])
    ax.set_ylim(max(0.0, lo - 0.1), None)
    ax.set_ylabel("speedup over dense (x)")
    ax.set_title(f"{model}: measured speedup (infer eval), ideal and predicted", fontsize=10)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    atomic_savefig(fig, path, dpi=110)
    plt.close(fig)
    return True


def lookup(results: dict[str, Any], field: str, where: dict[str, Any] | None = None) -> Any:
    """A value of a cell's results by dotted ``field``; a list on the way is filtered by ``where``.

    >>> lookup({"summary": [{"group": "a", "x": 1}, {"group": "b", "x": 2}]}, "summary.x", {"group": "b"})
    2
    """
    cur: Any = results
    for part in field.split("."):
        if isinstance(cur, list):
            rows = [r for r in cur if all(r.get(k) == v for k, v in (where or {}).items())]
            if len(rows) != 1:
                return None
            cur = rows[0]
        if not isinstance(cur, dict) or part not in cur:
            return None
        cur = cur[part]
    return cur


def published_rows(published: dict[str, Any], results: dict[str, dict[str, Any]]) -> list[str]:
    """Markdown rows ``table | quantity | published | ours | ours / published | source``.

    Each ``[published.<table>]`` may list ``[[published.<table>.compare]]`` entries:
    ``label``, ``value`` (the published number), ``cell`` (a cell id), ``field`` (dotted path into
    that cell's results, or ``speedup.<point>`` for an inference speedup), optional ``where`` (filters
    a list on the path) and optional ``over = {field, where}``: ours is then the ratio of the two
    values of the same cell (e.g. the latency at D=107 over the latency at D=96).
    """
    rows = []
    for table, t in published.items():
        if not isinstance(t, dict):
            continue
        for e in t.get("compare", []) or []:
            r = results.get(str(e.get("cell")))
            ours = None if r is None else lookup(r, str(e.get("field", "")), e.get("where"))
            over = e.get("over")
            if isinstance(over, dict) and isinstance(ours, (int, float)):
                den = lookup(r, str(over.get("field", e.get("field", ""))), over.get("where"))
                ours = ours / den if isinstance(den, (int, float)) and den else None
            pub = e.get("value")
            ratio = (
                ours / pub
                if isinstance(ours, (int, float)) and isinstance(pub, (int, float)) and pub
                else None
            )
            rows.append("| " + " | ".join([
                table, str(e.get("label", e.get("field"))), _f(pub, ".3g") if isinstance(pub, (int, float)) else str(pub),
                _f(ours, ".3g") if isinstance(ours, (int, float)) else
                ("not run" if r is None else "no such value" if ours is None else str(ours)),
                _f(ratio, ".2f"), str(t.get("source", "")).replace("|", "/"),
            ]) + " |")  # fmt: skip
    return rows


def worst_serving(cell: dict[str, Any], measured: dict[str, Any] | None) -> tuple[float, str, str] | None:
    """A cell's worst speedup over dense across its serving shapes: ``(speedup, shape, source)``,
    measured (the ``infer`` eval's speedups at the serving shapes it timed) where every serving shape
    was timed, else predicted (the allocation's per-shape prediction); None without serving shapes."""
    r = (cell or {}).get("results") or {}
    pred = r.get("predicted_serve") or {}
    if not pred:
        return None
    if measured and all(measured.get(k) for k in pred):
        k = min(pred, key=lambda k: measured[k])
        return (
            float(measured[k]),
            k,
            "measured" + (" († not the default path)" if measured.get(f"fallback_{k}") else ""),
        )
    k = min(pred, key=lambda k: pred[k])
    return float(pred[k]), k, "predicted"


#: One marker per compressor in the plots of cells (colour: the align strategy).
MARKERS = "osD^v<>P*X"


def _cells_figure(plt: Any, pts: list[tuple[Any, ...]], hollow_predicted: bool = False) -> tuple[Any, ...]:
    """A figure with one point ``(x, y)`` = ``p[2], p[3]`` per (compressor ``p[0]``, align ``p[1]``)
    cell; with ``hollow_predicted``, points whose ``p[4]`` is ``predicted`` are drawn hollow.
    Returns ``(fig, ax, compressors, aligns)``."""
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    comps = sorted({p[0] for p in pts})
    aligns = sorted({p[1] for p in pts})
    for p in pts:
        kw = {"facecolors": "none" if p[4] == "predicted" else None} if hollow_predicted else {}
        ax.scatter(p[2], p[3], marker=MARKERS[comps.index(p[0]) % len(MARKERS)],
                   color=f"C{aligns.index(p[1])}", s=40, **kw)  # fmt: skip
    return fig, ax, comps, aligns


def _save_cells_figure(plt: Any, fig: Any, ax: Any, comps: list[str], aligns: list[str], xlabel: str,
                       ylabel: str, title: str, path: Path) -> None:  # fmt: skip
    """Legend entries per compressor (marker) and align strategy (colour), labels, then save."""
    for i, c in enumerate(comps):
        ax.scatter([], [], marker=MARKERS[i % len(MARKERS)], color="gray", label=c)
    for i, a in enumerate(aligns):
        ax.scatter([], [], marker="s", color=f"C{i}", label=f"align {a}")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7)
    fig.tight_layout()
    atomic_savefig(fig, path, dpi=110)
    plt.close(fig)


def serving_plot(plt: Any, model: str, pts: list[tuple[str, str, float, float, str]], base_ppl: float | None,
                 ylabel: str, path: Path) -> None:  # fmt: skip
    """``serving_<model>.png``: perplexity against the worst serving-shape speedup, one point per
    (compressor, align) cell, dense at 1.0, the 1.00x line marked: what the latency guard costs."""
    fig, ax, comps, aligns = _cells_figure(plt, pts, hollow_predicted=True)
    if base_ppl:
        ax.scatter([1.0], [base_ppl], marker="*", color="k", s=80, label="dense")
    ax.axvline(1.0, color="gray", lw=0.8, ls=":")
    src = {p[4] for p in pts}
    how = "filled: measured, hollow: predicted" if len(src) > 1 else src.pop()
    _save_cells_figure(plt, fig, ax, comps, aligns, f"worst speedup over dense across the serving shapes ({how})",
                       ylabel, f"{model}: quality vs worst serving-shape speed", path)  # fmt: skip


def frontier_plot(plt: Any, model: str, prof: str, pts: list[tuple[str, str, float, float]],
                  ylabel: str, path: Path) -> None:  # fmt: skip
    """``frontier_<model>_<profile>.png``: perplexity (log) against the speedup predicted from ``prof``,
    one marker per compressor, one colour per align strategy, the Pareto frontier dashed."""
    fig, ax, comps, aligns = _cells_figure(plt, pts)
    fr = frontier([(p[2], p[3]) for p in pts])
    ax.plot([x for x, _ in fr], [y for _, y in fr], "k--", lw=0.8, label="frontier")
    ax.set_yscale("log")
    _save_cells_figure(plt, fig, ax, comps, aligns, f"predicted speedup ({prof})", ylabel,
                       f"{model}: speed vs quality", path)  # fmt: skip


def render_plan(root: Path, out: Path | None = None) -> Path:
    """Write ``report.md`` (+ frontier PNGs) for the plan in ``root``; return the Markdown path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from gac.utils import atomic_write_text

    out = out or root
    out.mkdir(parents=True, exist_ok=True)
    plan = plan_from_dir(root)
    cells = [(c, read_cell(root, c)) for c in plan.cells()]
    n_ok = sum(d is not None and d.get("status") == "ok" for _, d in cells)
    n_failed = sum(d is not None and d.get("status") == "failed" for _, d in cells)
    srcs = [f"ppl:{e.get('source', 'britannica')}" for e in plan.evals if e["kind"] == "ppl"]
    lines = [
        f"# gac plan report: {plan.name}",
        "",
        f"Plan hash `{plan.hash}`, {len(cells)} cells: {n_ok} done, {n_failed} failed, "
        f"{len(cells) - n_ok - n_failed} not run. Results under `{root}`.",
        "",
    ]
    speed = infer_speedups(cells)
    preds = infer_predictions(cells)
    lines += bench_lines(root, [(c, d) for c, d in cells if c.bench is not None])
    for model in plan.models:
        mcells = [(c, d) for c, d in cells if c.model == model]
        lines += model_lines(plt, model, mcells, srcs, speed, preds.get(model), out)
    if plan.published:
        lines += _published_lines(plan.published, cells, speed)
    md = out / "report.md"
    atomic_write_text(md, "\n".join(lines) + "\n")
    return md


def bench_lines(root: Path, benches: list[CellRecord]) -> list[str]:
    """Markdown: one section per ``[[benches]]`` cell, its summary table and plot."""
    if not benches:
        return []
    lines = ["## Kernel-level experiments", ""]
    for c, d in benches:
        if d is None or d.get("status") != "ok":
            st = "not run" if d is None else f"failed: {d.get('error')}"
            lines += [f"### {c.bench}: {st}", ""]
            continue
        r = d["results"]
        summ = r.get("summary") or []
        cols = [k for k in (summ[0] if summ else {}) if k not in ("auto_backends",)]
        lines += [f"### {c.bench} (`gac bench -e {r['experiment']}`, {r.get('device_label')}, {r.get('dtype')}; "
                  f"{r.get('points_ok')}/{r.get('points')} points; raw: `{r.get('raw_dir')}/`)", "",
                  "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]  # fmt: skip
        for row in summ:
            vals = [_f(row.get(k), ".3g") if isinstance(row.get(k), float) else str(row.get(k)) for k in cols]
            lines.append("| " + " | ".join(vals) + " |")
        png = next(iter(sorted((root / str(r.get("raw_dir", ""))).glob("*.png"))), None)
        if png is not None:
            lines += ["", f"![{c.bench}]({png.relative_to(root)})"]
        lines.append("")
    return lines


def model_lines(plt: Any, model: str, mcells: list[CellRecord], srcs: list[str], speed: dict[str, Any],
                pred: dict[str, Any] | None, out: Path) -> list[str]:  # fmt: skip
    """Markdown (and PNGs under ``out``): one model's section of the plan report."""
    base = next((d for c, d in mcells if c.compressor == BASE and d and d.get("status") == "ok"), None)
    bppl = {s: base["results"]["evals"].get(s, {}).get("ppl") for s in srcs} if base else {}
    lines, profiles = _cell_table(model, mcells, srcs, bppl)
    mspeed = [(c, speed[c.id]) for c, _ in mcells if c.id in speed]
    if mspeed:
        lines += _measured_lines(model, mspeed, base)
        lines += other_card_lines(base, [d for c, d in mcells if c.id in speed and c.compressor != BASE])
    if pred is not None:
        lines += prediction_lines(model, pred)
    lines += memory_lines(model, mcells)
    lines += _serving_lines(plt, model, mcells, srcs, speed, bppl, out)
    name = f"speedup_{slug(model)}.png"
    if mspeed and speed_plot(plt, model, mspeed, pred, out / name):
        lines += [f"![{name}]({name})", ""]
    for prof, pts in profiles.items():
        name = f"frontier_{slug(model)}_{slug(prof)}.png"
        ylabel = f"perplexity ({srcs[0]}, log)" if srcs else "perplexity"
        frontier_plot(plt, model, prof, pts, ylabel, out / name)
        lines += [f"![{name}]({name})", ""]
    return lines


def memory_lines(model: str, mcells: list[CellRecord]) -> list[str]:
    """Markdown: each decode point's peak GPU memory beside the dense base's, and the capacity point (the largest
    batch that fit the budget at its context, its tokens/s, each against the base's), where the ``infer`` eval
    recorded them."""
    from gac.hardware.latency import infer_of

    rows = [(c, inf) for c, d in mcells if (inf := infer_of(d))]
    base = next((inf for c, inf in rows if c.compressor == BASE), None)
    rows = [(c.id, inf) for c, inf in rows]
    lines: list[str] = []

    def peaks(inf: dict[str, Any], key: str) -> dict[str, float]:
        return {point_key(r): r[key] for r in inf.get("decode") or [] if r.get(key)}

    titles = {
        "peak_mem_gib": "Peak GPU memory per decode point, GiB",
        # recorded since the point's setup and its timed steps were read apart (gac.eval.infer._peak_gib)
        "steady_peak_mem_gib": "Peak GPU memory of each decode point's timed steps alone (its compile and graph "
        "capture apart), GiB",
    }
    for key, title in titles.items():
        bpk = peaks(base, key) if base else {}
        pts = [k for k in bpk if any(k in peaks(inf, key) for cid, inf in rows if inf is not base)]
        if not pts:
            continue
        lines += [f"{title} ({model}; the dense base's in brackets):", "",
                  "| cell | " + " | ".join(pts) + " |", "|" + "---|" * (len(pts) + 1)]  # fmt: skip
        for cid, inf in rows:
            pk = peaks(inf, key)
            lines.append(f"| {cid} | " + " | ".join(
                f"{_f(pk.get(k), '.2f')} ({bpk[k]:.2f})" if inf is not base else f"{bpk[k]:.2f}" for k in pts
            ) + " |")  # fmt: skip
        lines.append("")
    caps = [(cid, inf["capacity"]) for cid, inf in rows if inf.get("capacity")]
    if caps:
        bcap = (base or {}).get("capacity") or {}
        lines += [f"Capacity ({model}): the largest decode batch whose weights, KV cache and workspace fit the "
                  "memory budget at the context, searched and run (`capacity_context`); the ratio to the dense "
                  "base's in brackets:", "",
                  "| cell | context | budget GiB | KV bytes/token | max batch | tokens/s | ms/step | peak GiB | tries |",
                  "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
        for cid, cp in caps:
            rel = cp is not bcap and bcap.get("max_batch") and bcap.get("tokens_per_s")

            def vs(k: str, fmt: str, cp: dict[str, Any] = cp, rel: Any = rel) -> str:
                v = _f(cp.get(k), fmt)
                return f"{v} ({cp[k] / bcap[k]:.2f}×)" if rel and cp.get(k) else v

            tries = ", ".join(f"{t['batch']} {t['status']}" for t in cp.get("tries") or [])
            lines.append(f"| {cid} | {cp.get('context')} | {_f(cp.get('budget_gib'), '.1f')} | "
                         f"{_f(cp.get('kv_bytes_per_token'), ',')} | {vs('max_batch', 'd')} | "
                         f"{vs('tokens_per_s', ',.0f')} | {_f(cp.get('ms_per_token'), '.1f')} | "
                         f"{_f(cp.get('peak_mem_gib'), '.1f')} | {tries} |")  # fmt: skip
        lines.append("")
    return lines


def point_keys(sp: dict[str, Any]) -> list[str]:
    """The grid points of a cell's speedups (without their ``ideal_``/``fallback_`` companions)."""
    return [k for k in sp if not k.startswith(("ideal_", "fallback_"))]


def other_card_lines(base: dict[str, Any] | None, cells: list[dict[str, Any] | None]) -> list[str]:
    """A note naming the cells timed on another GPU than their dense base (``env.gpu_uuid``; cells
    recorded before the uuid was kept say nothing): their speedups compare two cards of one kind."""
    ref = ((base or {}).get("env") or {}).get("gpu_uuid")
    other = [
        str(d.get("id")) for d in cells if d and ref and ((d.get("env") or {}).get("gpu_uuid") or ref) != ref
    ]
    if not other:
        return []
    return [f"Timed on another GPU than the dense base (same kind, {((base or {}).get('env') or {}).get('gpu')}): "
            + ", ".join(other) + ". Their speedups include the difference between two cards.", ""]  # fmt: skip


def _cell_table(model: str, mcells: list[CellRecord], srcs: list[str], bppl: dict[str, Any]
                ) -> tuple[list[str], dict[str, list[tuple[str, str, float, float]]]]:  # fmt: skip
    """One row per cell (params, alignment, predicted speedup, perplexities, status), and per profile
    the (compressor, align, predicted speedup, perplexity) points of its frontier plot."""
    head = ["compressor", "ratio", "align", "params", "aligned %", "pred. speedup", *srcs,
            *(f"{s} / base" for s in srcs), "status"]  # fmt: skip
    lines = [f"## {model}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    profiles: dict[str, list[tuple[str, str, float, float]]] = {}
    for c, d in mcells:
        r = (d or {}).get("results") or {}
        ev = r.get("evals") or {}
        pr = ev.get("predict") or {}
        ppls = [ev.get(s, {}).get("ppl") for s in srcs]
        rel = [p / bppl[s] if p and bppl.get(s) else None for p, s in zip(ppls, srcs, strict=True)]
        st = "not run" if d is None else d["status"] + (f": {d['error']}" if d.get("error") else "")
        lines.append("| " + " | ".join([
            c.compressor, "1" if c.compressor == BASE else f"{c.ratio:g}", c.align,
            _f(r.get("params"), ","), _f(r.get("pct_aligned"), ".1f"),
            _f(pr.get("predicted_speedup"), ".3f"), *[_f(p, ".3f") for p in ppls],
            *[_f(x, ".4f") for x in rel], st.replace("|", "/")[:120],
        ]) + " |")  # fmt: skip
        sp = pr.get("predicted_speedup")
        if sp and ppls and ppls[0]:
            profiles.setdefault(str(pr.get("profile")), []).append((c.compressor, c.align, sp, ppls[0]))
    lines.append("")
    return lines, profiles


def _measured_lines(
    model: str, mspeed: list[tuple[Any, dict[str, Any]]], base: dict[str, Any] | None
) -> list[str]:
    """The measured speedup table (ideal in brackets) and the dense base's bandwidth line."""
    pts = point_keys(mspeed[0][1])
    head = ["cell", *(f"{k} (ideal)" for k in pts)]
    lines = [f"Measured speedup over the dense base ({model}, `infer` eval: the default "
             "`gac eval infer` path), ideal in brackets (prefill: FLOPs, or the parameter ratio where no "
             "FLOPs were recorded; decode: bytes moved):",
             "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]  # fmt: skip
    fell = []
    for c, sp in mspeed:
        lines.append("| " + " | ".join([c.id, *(
            f"{_f(sp.get(k), '.3f')}{' †' if sp.get('fallback_' + k) else ''} ({_f(sp.get('ideal_' + k), '.3f')})"
            for k in pts)]) + " |")  # fmt: skip
        fell += [f"{c.id} at {k}: {str(sp['fallback_' + k])[:160]}" for k in pts if sp.get("fallback_" + k)]
    lines.append("")
    if fell:
        lines += ["† Not the default path: the point (or its dense base) fell back; the speedup is not the "
                  "default path's. " + "; ".join(fell), ""]  # fmt: skip
    bw = bandwidth_line(((base or {}).get("results") or {}).get("evals", {}).get("infer"))
    if bw:
        lines += [bw, ""]
    return lines


def _serving_lines(plt: Any, model: str, mcells: list[CellRecord], srcs: list[str], speed: dict[str, Any],
                   bppl: dict[str, Any], out: Path) -> list[str]:  # fmt: skip
    """Each compressed cell's worst serving-shape speedup (and its guard), with ``serving_<model>.png``."""
    serving = []
    for c, d in mcells:
        w = worst_serving(d, speed.get(c.id)) if c.compressor != BASE else None
        if w is not None:
            evals = ((d or {}).get("results") or {}).get("evals") or {}
            serving.append((c, d, w, evals.get(srcs[0], {}).get("ppl") if srcs else None))
    if not serving:
        return []
    lines = [f"Worst serving-shape speedup over dense ({model}; measured where the `infer` eval timed "
             "every serving shape, else predicted by the profile's latency model):", "",
             "| cell | worst speedup | at | source | guard |", "|---|---|---|---|---|"]  # fmt: skip
    for c, d, w, _ in serving:
        g = ((d or {}).get("results") or {}).get("guard") or {}
        how = "guarded" if g.get("guarded") and not g.get("off") else "not guarded"
        lines.append(f"| {c.id} | {w[0]:.3f} | {w[1]} | {w[2]} | {how} |")
    lines.append("")
    qual = [(c.compressor, c.align, w[0], q, w[2]) for c, _, w, q in serving if q]
    if qual:
        name = f"serving_{slug(model)}.png"
        serving_plot(plt, model, qual, bppl.get(srcs[0]), f"perplexity ({srcs[0]})", out / name)
        lines += [f"![{name}]({name})", ""]
    return lines


def _published_lines(published: dict[str, Any], cells: list[CellRecord], speed: dict[str, Any]) -> list[str]:
    """Ours beside the plan's published values, then the published values themselves."""
    results = {c.id: {**((d or {}).get("results") or {}), "speedup": speed.get(c.id, {})}
               for c, d in cells if d is not None and d.get("status") == "ok"}  # fmt: skip
    rows = published_rows(published, results)
    lines = []
    if rows:
        lines += ["## Ours beside the published values", "",
                  "| table | quantity | published | ours | ours / published | source |",
                  "|---|---|---|---|---|---|", *rows, ""]  # fmt: skip
    lines += ["## Published values (from the plan)", "", "```json",
              json.dumps(published, indent=1), "```", ""]  # fmt: skip
    return lines
