"""``gac report PLAN_DIR`` for an experiment plan: per-model tables and speed-vs-quality frontiers.

Reads ``plan.json`` and ``cells/**.json`` (written by ``gac run``); writes ``report.md`` and one
``frontier_<model>_<profile>.png`` per model and GPU profile: quality (perplexity) against the
speedup predicted from that GPU's profile, the Pareto frontier drawn through the best cells.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gac.experiments import BASE, PLAN_SCHEMA, plan_from_dir, read_cell, slug


def is_plan_dir(root: Path) -> bool:
    try:
        return json.loads((root / "plan.json").read_text()).get("schema") == PLAN_SCHEMA
    except (OSError, json.JSONDecodeError, UnicodeDecodeError, AttributeError):
        return False


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
    plots = []
    for model in plan.models:
        mcells = [(c, d) for c, d in cells if c.model == model]
        base = next((d for c, d in mcells if c.compressor == BASE and d and d.get("status") == "ok"), None)
        bppl = {s: base["results"]["evals"].get(s, {}).get("ppl") for s in srcs} if base else {}
        head = ["compressor", "ratio", "align", "params", "aligned %", "pred. speedup", *srcs,
                *(f"{s} / base" for s in srcs), "status"]  # fmt: skip
        lines += [f"## {model}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
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
        for prof, pts in profiles.items():
            fig, ax = plt.subplots(figsize=(6.4, 4.2))
            comps = sorted({p[0] for p in pts})
            aligns = sorted({p[1] for p in pts})
            markers = "osD^v<>P*X"
            for p in pts:
                ax.scatter(p[2], p[3], marker=markers[comps.index(p[0]) % len(markers)],
                           color=f"C{aligns.index(p[1])}", s=40)  # fmt: skip
            fr = frontier([(p[2], p[3]) for p in pts])
            ax.plot([x for x, _ in fr], [y for _, y in fr], "k--", lw=0.8, label="frontier")
            for i, c in enumerate(comps):
                ax.scatter([], [], marker=markers[i % len(markers)], color="gray", label=c)
            for i, a in enumerate(aligns):
                ax.scatter([], [], marker="s", color=f"C{i}", label=f"align {a}")
            ax.set_yscale("log")
            ax.set_xlabel(f"predicted speedup ({prof})")
            ax.set_ylabel(f"perplexity ({srcs[0]}, log)" if srcs else "perplexity")
            ax.set_title(f"{model}: speed vs quality", fontsize=10)
            ax.legend(fontsize=7)
            fig.tight_layout()
            name = f"frontier_{slug(model)}_{slug(prof)}.png"
            fig.savefig(out / name, dpi=110)
            plt.close(fig)
            plots.append(name)
            lines += [f"![{name}]({name})", ""]
    if plan.published:
        lines += ["## Published values (from the plan)", "", "```json",
                  json.dumps(plan.published, indent=1), "```", ""]  # fmt: skip
    md = out / "report.md"
    atomic_write_text(md, "\n".join(lines) + "\n")
    return md
