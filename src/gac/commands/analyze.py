"""``gac analyze MODEL``: every dim that reaches a kernel, judged against a GPU profile."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from gac.commands import options as o


def render_analysis(an, console) -> None:
    """Print the grouped table and the misaligned dims of an :class:`~gac.models.inventory.Analysis`."""
    from rich.table import Table

    from gac.sites import short_name

    t = Table(title=f"{an.family} dims under {an.profile['id']}", show_lines=False)
    for col, just in (
        ("kind", "left"),
        ("op class", "left"),
        ("count", "right"),
        ("values", "left"),
        ("aligned", "right"),
        ("worst penalty", "right"),
    ):
        t.add_column(col, justify=just)
    for g in an.groups():
        vals = g["values"]
        shown = ", ".join(map(str, vals[:6])) + (f" (+{len(vals) - 6} more)" if len(vals) > 6 else "")
        if g["pct_aligned"] is None:
            al, pen = "-", "-"
        else:
            colour = "green" if g["pct_aligned"] == 100 else ("yellow" if g["pct_aligned"] > 0 else "red")
            al = f"[{colour}]{g['pct_aligned']:.0f}%[/{colour}]"
            pen = f"{g['worst_penalty']:.2f}x"
        t.add_row(g["kind"], g["op"] or "(info)", str(g["count"]), shown, al, pen)
    console.print(t)
    bad = an.misaligned
    if bad:
        # one row per distinct (kind, value): the penalty is a function of those two
        seen: dict[tuple[str, int], list] = {}
        for d in bad:
            seen.setdefault((d.kind, d.value), []).append(d)
        mt = Table(title="misaligned dims: predicted latency penalty from the profile")
        for col in ("kind", "dim", "op class", "penalty", "pad to", "where (first)", "n"):
            mt.add_column(col, justify="right" if col in ("dim", "penalty", "pad to", "n") else "left")
        for (kind, value), ds in sorted(seen.items(), key=lambda kv: -kv[1][0].penalty):
            d = ds[0]
            mt.add_row(
                kind, str(value), d.op, f"{d.penalty:.2f}x", str(d.target), short_name(d.where), str(len(ds))
            )
        console.print(mt)
    n = len(an.judged)
    console.print(
        f"[bold]{an.pct_aligned:.1f}%[/bold] of {n} kernel dims aligned "
        f"({len(bad)} misaligned) under profile [bold]{an.profile['id']}[/bold]: {an.profile['label']}"
    )


def serving_of(model: str) -> dict | None:
    """A gac-compressed dir's serving shapes, latency guard and predicted speedups (None otherwise)."""
    from gac import io

    if not io.is_gac_dir(model):
        return None
    cfg = io.read_gac_config(model)
    if not cfg.get("serve"):
        return None
    return {k: cfg.get(k) for k in ("align", "serve", "guard", "predicted_serve")}


def serving_line(s: dict) -> str:
    """One line: the shapes it was compressed for, whether guarded, the predicted speedup per shape."""
    g = s.get("guard") or {}
    if s.get("align") != "gac":
        how = f"not guarded (--align {s.get('align')})"
    elif g.get("off"):
        how = "not guarded: " + g["off"]
    elif g.get("allow_slower"):
        how = "not guarded (--allow-slower)"
    elif g.get("margin"):
        how = (
            f"guarded (every shape predicted at least {1 + g['margin']:.3f}x dense: margin {g['margin']:.3f})"
        )
    else:
        how = "guarded (none predicted slower than dense)"
    pred = ", ".join(f"{k} {v:.3f}x" for k, v in (s.get("predicted_serve") or {}).items())
    return f"serving shapes: {s['serve']}; {how}" + (f"; predicted vs dense: {pred}" if pred else "")


def structure_notes(model) -> dict:
    """Sliding-window layers and tied embeddings of ``model``: both change what compression can reach.

    Returns:
        ``{"sliding_window": W or None, "sliding_layers": [...], "n_layers": N,
        "tied_embeddings": bool}``.
    """
    cfg = getattr(model, "config", None)
    cfg = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    n = int(getattr(cfg, "num_hidden_layers", 0) or 0)
    window = getattr(cfg, "sliding_window", None)
    types = list(getattr(cfg, "layer_types", None) or [])
    if types:
        sliding = [i for i, t in enumerate(types) if "sliding" in str(t)]
    elif window and getattr(cfg, "use_sliding_window", True):
        first = getattr(cfg, "max_window_layers", None) if hasattr(cfg, "use_sliding_window") else None
        sliding = list(range(int(first or 0), n)) if first is not None else list(range(n))
    else:
        sliding = []
    emb, head = model.get_input_embeddings(), model.get_output_embeddings()
    tied = emb is not None and head is not None and head.weight is emb.weight
    return {
        "sliding_window": int(window) if window and sliding else None,
        "sliding_layers": sliding,
        "n_layers": n,
        "tied_embeddings": bool(tied),
    }


def render_notes(notes: dict, console) -> None:
    """One line each for the sliding-window layers and the embeddings."""
    sl = notes["sliding_layers"]
    if sl:
        shown = ", ".join(map(str, sl[:12])) + (f" (+{len(sl) - 12} more)" if len(sl) > 12 else "")
        console.print(
            f"sliding-window attention (window {notes['sliding_window']}): {len(sl)} of "
            f"{notes['n_layers']} layers ({shown}); their KV cache stops growing at the window",
            markup=False,
            soft_wrap=True,
        )
    else:
        console.print(
            f"sliding-window attention: none (all {notes['n_layers']} layers attend to the full context)"
        )
    if notes["tied_embeddings"]:
        console.print(
            "tied embeddings: lm_head is the input embedding matrix (one tensor, its parameters "
            "counted once; padding the hidden dim pads both)",
            markup=False,
            soft_wrap=True,
        )
    else:
        console.print("tied embeddings: no (lm_head has its own weights)")


def register(app: typer.Typer) -> None:
    @app.command("analyze")
    def analyze_cmd(
        model: o.MODEL,
        profile: Annotated[str, o.PROFILE()] = "auto",
        out: Annotated[Path | None, o.OUT()] = None,
        plot: Path | None = typer.Option(None, "--plot", help="Write the dimension histogram PNG."),
        dtype: Annotated[str, o.DTYPE()] = "float32",
        trust_remote_code: Annotated[bool, o.TRUST_REMOTE_CODE()] = False,
    ) -> None:
        """Inventory every dim that reaches a GPU kernel and judge it against a profile; --out FILE
        writes the full analysis as JSON."""
        from rich.console import Console

        from gac.guard import check_out
        from gac.hardware.profile import load_profile
        from gac.models import load_model
        from gac.models.inventory import analyze, plot_histogram
        from gac.utils import atomic_write_text, console, parse_dtype

        if out is not None:
            check_out(out, overwrite=True, kind="file")  # an unwritable --out fails before any work
        prof = load_profile(profile)
        console.print(
            f"profile: {prof.id} ({'measured' if prof.measured else 'NOT measured'}) - {prof.label}"
        )
        if prof.measured:
            from gac.allocation import resolve_margin

            m, src = resolve_margin(prof)
            console.print(
                f"latency guard margin: {m:.3f} (--align gac needs {1 + m:.3f}x dense; {src})", markup=False
            )
        lm = load_model(model, dtype=parse_dtype(dtype), trust_remote_code=trust_remote_code)
        an = analyze(lm.model, prof)
        render_analysis(an, Console())
        serving = serving_of(model)
        if serving:
            Console().print(serving_line(serving), markup=False)
        notes = structure_notes(lm.model)
        render_notes(notes, Console())
        if out is not None:
            doc = an.to_dict()
            doc["model"] = lm.source
            doc["structure"] = notes
            if serving:
                doc["serving"] = serving
            atomic_write_text(out, json.dumps(doc, indent=1))
            console.print(f"wrote {out}")
        if plot is not None:
            plot_histogram(an, plot, title=f"dimension distribution: {model}")
            console.print(f"wrote {plot}")
