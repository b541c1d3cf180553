"""The report of a directory of results that gac's tools wrote (``gac report RESULTS_DIR``, not a plan).

Reads, recursively: ``demo.json`` (``gac.demo/1``), ``infer.json`` (``gac.infer/1``: prefill/decode sweeps), ``lm_eval.json``
(``gac.lm_eval/1``), ``ppl.json`` / any JSON with a ``ppl`` field, ``variant.json`` and
``gac_config.json`` (parameters, alignment).  Writes ``report.md`` and PNG plots
(``report_speedup.png``, ``report_quality.png``) into the results directory (or ``--out``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def _load(p: Path) -> dict[str, Any] | None:
    try:
        d = json.loads(p.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError, OSError):
        return None
    return d if isinstance(d, dict) else None


def _geo(xs: list[float]) -> float | None:
    import math

    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def collect(root: Path) -> dict[str, dict[str, Any]]:
    """Per variant: params, alignment, ppl, task accuracies, prefill/decode speedups."""
    rows: dict[str, dict[str, Any]] = {}

    def row(name: str) -> dict[str, Any]:
        return rows.setdefault(name, {"variant": name, "tasks": {}})

    for p in sorted(root.rglob("*.json")):
        d = _load(p)
        if d is None:
            continue
        schema = str(d.get("schema", ""))
        folder = p.parent.name
        if schema == "gac.infer/1":
            for name, v in d.get("variants", {}).items():
                r = row(name)
                r["params"] = r.get("params") or v.get("params")
                ok_p = [x for x in v.get("prefill", []) if x.get("status") == "ok" and "speedup" in x]
                ok_d = [x for x in v.get("decode", []) if x.get("status") == "ok" and "speedup" in x]
                if ok_p and name != d.get("baseline"):
                    r["prefill_speedup"] = _geo([x["speedup"] for x in ok_p])
                    r["prefill_speedup_max_s"] = max(ok_p, key=lambda x: (x["seq"], x["batch"]))["speedup"]
                if ok_d and name != d.get("baseline"):
                    r["decode_speedup"] = _geo([x["speedup"] for x in ok_d])
                    b1 = [x for x in ok_d if x["batch"] == min(y["batch"] for y in ok_d)]
                    r["decode_b1_speedup"] = b1[0]["speedup"]
                    r["decode_b1_ideal"] = b1[0].get("bytes_ideal_speedup")
                b1 = [x for x in v.get("decode", []) if x.get("status") == "ok" and x.get("weight_bw_frac")]
                if b1:
                    r["decode_bw_frac"] = b1[0]["weight_bw_frac"]
                r["oom_points"] = sum(
                    x.get("status") == "oom" for x in v.get("prefill", []) + v.get("decode", [])
                )
                alloc = (d.get("allocation") or {}).get(name.split("+")[0])
                if isinstance(alloc, dict) and alloc.get("pct_aligned") is not None:
                    r["pct_aligned"] = alloc["pct_aligned"]
                meta = v.get("meta") or {}
                if meta.get("pct_aligned") is not None:
                    r["pct_aligned"] = meta["pct_aligned"]
                r.setdefault("sources", []).append(str(p.relative_to(root)))
        elif schema == "gac.demo/1":  # `gac demo`'s demo.json: one row per variant
            for dr in d.get("rows") or []:
                if not isinstance(dr, dict) or not dr.get("variant"):
                    continue
                r = row(str(dr["variant"]))
                for k in ("params", "pct_aligned", "ppl", "predicted_speedup"):
                    if dr.get(k) is not None:
                        r[k] = dr[k]
                # measured on a GPU: prefill (older records: one key per point) and decode
                pre = [v for k, v in dr.items() if k.startswith("measured_speedup_b") and v]
                if dr.get("measured_prefill_speedup"):
                    r["prefill_speedup"] = dr["measured_prefill_speedup"]
                elif pre:
                    r["prefill_speedup"] = _geo(pre)
                if dr.get("measured_decode_speedup"):
                    r["decode_speedup"] = dr["measured_decode_speedup"]
                if dr.get("targeted_ratio") is not None:
                    r["param_ratio"] = dr["targeted_ratio"]
                r.setdefault("sources", []).append(str(p.relative_to(root)))
        elif schema == "gac.lm_eval/1":
            name = (d.get("meta") or {}).get("variant") or folder
            r = row(name)
            for t, m in d.get("tasks", {}).items():
                r["tasks"][t] = m.get("value")
            r.setdefault("sources", []).append(str(p.relative_to(root)))
        elif "ppl" in d and isinstance(d.get("ppl"), (int, float)):
            name = (d.get("meta") or {}).get("variant") or d.get("model") or folder
            r = row(str(name))
            r["ppl"] = d["ppl"]
            r["ppl_dataset"] = d.get("dataset")
            r.setdefault("sources", []).append(str(p.relative_to(root)))
        elif p.name in ("variant.json",) and "variant" in d:
            r = row(d["variant"])
            for k in ("params", "pct_aligned", "param_ratio", "predicted_speedup"):
                if d.get(k) is not None:
                    r[k] = d[k]
        elif p.name == "gac_config.json":
            r = row(folder)
            if d.get("pct_aligned") is not None:
                r["pct_aligned"] = d["pct_aligned"]
            if d.get("model_ratio") is not None:
                r["param_ratio"] = d["model_ratio"]
    return rows


def _f(x: Any, fmt: str) -> str:
    return "–" if x is None else format(x, fmt)


def render(rows: dict[str, dict[str, Any]], out: Path, root: Path | None = None) -> Path:
    """Write ``report.md`` and the plots; return the Markdown path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from gac.guard import atomic_savefig
    from gac.utils import atomic_write_text

    names = list(rows)
    tasks = sorted({t for r in rows.values() for t in r["tasks"]})
    base_params = next(
        (r.get("params") for r in rows.values() if r["variant"] in ("baseline", "dense")), None
    )
    for r in rows.values():
        if r.get("param_ratio") is None and base_params and r.get("params"):
            r["param_ratio"] = r["params"] / base_params
    head = ["variant", "params", "param ratio", "aligned %", "ppl", *tasks, "mean acc",
            "predicted ×", "prefill ×", "decode ×", "decode B=1 × (ideal)", "decode BW"]  # fmt: skip
    lines = ["# gac report", "", f"Results under `{root or out}`.", "", "| " + " | ".join(head) + " |",
             "|" + "---|" * len(head)]  # fmt: skip
    for n in names:
        r = rows[n]
        accs = [r["tasks"].get(t) for t in tasks]
        vals = [a for a in accs if a is not None]
        ideal = r.get("decode_b1_ideal")
        cells = [
            n,
            _f(r.get("params") and r["params"] / 1e6, ",.1f") + ("M" if r.get("params") else ""),
            _f(r.get("param_ratio"), ".3f"),
            _f(r.get("pct_aligned"), ".1f"),
            _f(r.get("ppl"), ".3f"),
            *[_f(a, ".4f") for a in accs],
            _f(sum(vals) / len(vals) if vals else None, ".4f"),
            _f(r.get("predicted_speedup"), ".2f"),
            _f(r.get("prefill_speedup"), ".2f"),
            _f(r.get("decode_speedup"), ".2f"),
            _f(r.get("decode_b1_speedup"), ".2f") + (f" ({ideal:.2f})" if ideal else ""),
            _f(r.get("decode_bw_frac") and 100 * r["decode_bw_frac"], ".0f")
            + ("%" if r.get("decode_bw_frac") else ""),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        "predicted ×: the latency model's speedup over dense from the profile (not measured); "
        "prefill × / decode ×: measured, geometric mean over the sweep's points of the baseline's median time "
        "over the variant's; decode B=1 × (ideal): the smallest batch and KV point, with the weight+KV "
        "bytes ratio in brackets; decode BW: weight bytes/s at that point over the measured copy bandwidth.",
        "",
    ]
    plots = []
    sp = [(n, rows[n].get("prefill_speedup"), rows[n].get("decode_speedup")) for n in names]
    sp = [s for s in sp if s[1] or s[2]]
    if sp:
        fig, ax = plt.subplots(figsize=(6.4, 3.8))
        x = range(len(sp))
        ax.bar([i - 0.2 for i in x], [s[1] or 0 for s in sp], 0.4, label="prefill")
        ax.bar([i + 0.2 for i in x], [s[2] or 0 for s in sp], 0.4, label="decode")
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_xticks(list(x))
        ax.set_xticklabels([s[0] for s in sp], rotation=20, fontsize=8)
        ax.set_ylabel("speedup over baseline (geo. mean)")
        ax.legend()
        fig.tight_layout()
        atomic_savefig(fig, out / "report_speedup.png", dpi=120)
        plt.close(fig)
        plots.append("report_speedup.png")
    q = [(n, rows[n].get("ppl"), rows[n]["tasks"]) for n in names if rows[n].get("ppl") or rows[n]["tasks"]]
    if q:
        fig, axes = plt.subplots(1, 2, figsize=(9, 3.8))
        axes[0].bar([s[0] for s in q], [s[1] or 0 for s in q])
        axes[0].set_ylabel("perplexity")
        for i, t in enumerate(tasks):
            axes[1].bar([j + i * 0.8 / max(len(tasks), 1) for j in range(len(q))], [s[2].get(t) or 0 for s in q],
                        0.8 / max(len(tasks), 1), label=t)  # fmt: skip
        axes[1].set_xticks(range(len(q)))
        axes[1].set_xticklabels([s[0] for s in q], rotation=20, fontsize=8)
        axes[1].set_ylabel("accuracy")
        if tasks:
            axes[1].legend(fontsize=7)
        for a in axes:
            a.tick_params(axis="x", labelrotation=20, labelsize=8)
        fig.tight_layout()
        atomic_savefig(fig, out / "report_quality.png", dpi=120)
        plt.close(fig)
        plots.append("report_quality.png")
    lines += [f"![{p}]({p})" for p in plots]
    md = out / "report.md"
    atomic_write_text(md, "\n".join(lines) + "\n")
    return md
