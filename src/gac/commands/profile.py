"""``gac profile``: measure this GPU's shape penalties and distil a profile JSON."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

from gac.commands import options as o
from gac.errors import GacError

#: The panel of the options that only ``--refine MODEL`` reads.
REFINE = "Refine (--refine MODEL)"


@dataclass
class RefineSettings:
    """How ``gac profile --refine`` searches (its options)."""

    tokens: int = 2048
    top: int = 4
    half_window: int = 8
    rounds: int = 2
    tol: float = 0.1

    def check(self) -> None:
        for name, v, lo in (("--top", self.top, 1), ("--half-window", self.half_window, 0), ("--rounds", self.rounds, 1)):  # fmt: skip
            if v < lo:
                raise GacError(f"{name} must be at least {lo}, got {v}")
        if self.tokens < 1:
            raise GacError(f"--tokens must be a positive integer, got {self.tokens}")
        if not self.tol > 0:
            raise GacError(f"--tolerance-refine must be positive, got {self.tol}")


def profile_cmd(
    out: Annotated[Path, o.OUT()],
    dtype: Annotated[str, o.DTYPE()] = "bfloat16",
    quick: bool = typer.Option(
        False,
        "--quick",
        help="smaller sweeps: the shape sweep under 60 s on an H100/H200, then the latency fields (the latent class cut to 20 s)",
    ),
    device: Annotated[str, o.DEVICE()] = "auto",
    raw_dir: Path | None = typer.Option(
        None, "--raw-dir", help="raw points, timing and plot dir (default: <out stem>-raw/ beside --out)"
    ),
    overwrite: Annotated[bool, o.OVERWRITE()] = False,
    tolerance: float = typer.Option(0.05, "--tolerance", help="rule tolerance: within 5% of the best nearby"),
    refine: str | None = typer.Option(
        None,
        "--refine",
        metavar="MODEL",
        help="refine --profile against MODEL (alias, path, gac dir or tiny:<family>) instead of sweeping",
        rich_help_panel=REFINE,
    ),
    base: Annotated[str | None, o.PROFILE(panel=REFINE, shown_default="this GPU's")] = None,
    tokens: int = typer.Option(
        2048, "--tokens", help="prefill tokens (M of every GEMM)", rich_help_panel=REFINE
    ),
    top: int = typer.Option(4, "--top", help="worst GEMMs refined per round", rich_help_panel=REFINE),
    half_window: Annotated[int, o.HALF_WINDOW(panel=REFINE)] = 8,
    rounds: int = typer.Option(2, "--rounds", help="most rounds", rich_help_panel=REFINE),
    tolerance_refine: float = typer.Option(
        0.1, "--tolerance-refine", help="|log error| after removing the global scale", rich_help_panel=REFINE
    ),
    results: Path | None = typer.Option(None, "--results", hidden=True),  # the old --raw-dir
    refine_tolerance: float | None = typer.Option(None, "--refine-tolerance", hidden=True),
) -> None:
    """Sweep GEMM K/N, GEMV, SDPA head_dim and low-rank r; write the discovered rules to --out
    (a .json file). On CUDA also measure the latency model's fields: launch constants, the fused
    low-rank kernel, the latent_attention class (PaLU's decode kernel, about a minute), the Triton
    decode GEMV's fit and prefill attention as the compiled step runs it.

    With --refine MODEL --profile P: re-measure P around the dims where its prediction and
    MODEL's measured GEMMs disagree most, and write the refined profile to --out.
    """
    from gac.hardware.timing import dtype_name, resolve_device
    from gac.utils import parse_dtype

    raw_dir = o.renamed(results, "--results", raw_dir, "--raw-dir")
    tolerance_refine = o.renamed(
        refine_tolerance, "--refine-tolerance", tolerance_refine, "--tolerance-refine", 0.1
    )
    dev = resolve_device(device)
    dtype = dtype_name(parse_dtype(dtype, dev.type))
    if refine is not None:
        if quick:
            raise GacError("--refine and --quick do not go together: --refine measures only what it needs")
        settings = RefineSettings(tokens, top, half_window, rounds, tolerance_refine)
        _refine(refine, base, out, dtype, settings, dev, overwrite)
        return
    if base is not None:
        raise GacError("--profile is only used with --refine MODEL")
    _sweep(out, dtype, quick, dev, raw_dir, overwrite, tolerance)


def register(app: typer.Typer) -> None:
    app.command("profile")(profile_cmd)


def _check_json_out(out: Path, overwrite: bool) -> None:
    from gac.guard import check_out

    if out.exists() and out.is_dir():
        raise GacError(f"--out {out} is a directory; give a .json file path")
    check_out(out, overwrite, kind="file")


def _sweep(
    out: Path, dtype: str, quick: bool, dev: Any, raw_dir: Path | None, overwrite: bool, tolerance: float
) -> None:
    """``gac profile --out P.json``: the sweeps, the rules, the table."""
    from gac.guard import check_out
    from gac.hardware.profiler import build_profile, write_profile_outputs

    if not 0.0 < tolerance < 1.0:
        raise GacError(f"--tolerance must be in (0, 1), got {tolerance}")
    _check_json_out(out, overwrite)
    # Raw sweeps go where the user pointed: beside --out, never into the current directory.
    rdir = raw_dir if raw_dir is not None else out.parent / f"{out.stem}-raw"
    check_out(rdir, overwrite=True)
    prof = build_profile(dtype=dtype, quick=quick, device=dev, results_dir=rdir, tolerance=tolerance)
    write_profile_outputs(prof, out, rdir)
    _print_rules(prof)
    _print_latent(prof)
    typer.echo(f"profile written to {out} (id {prof.id})")


def _print_latent(prof: Any) -> None:
    """One line per key group size of the profile's latent_attention class (nothing where it has none)."""
    for g, r in ((prof.latent_attention or {}).get("groups") or {}).items():
        rate = f"at {r['tflops']:g} TFLOP/s" if r.get("tflops") else "not limiting"
        typer.echo(
            f"latent_attention G={g}: {r['launch_us']:g} us + latent bytes at {r['gbps']:g} GB/s + key rebuild "
            f"{rate} (rank tile {r['block_r']}; fit within {100 * r['max_abs_rel_err']:.0f}% over "
            f"{r['points']} calls)"
        )


def _print_rules(prof: Any) -> None:
    """One row per op: its modulus, preferred step, efficiencies, cliffs and points."""
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"{prof.label}  [{prof.env.get('profile_elapsed_s')} s]")
    for c in ("op", "modulus", "prefer", "eff odd", "eff %8", "alignment cliffs", "boundaries", "points"):
        t.add_column(c)
    for op, r in prof.ops.items():
        t.add_row(
            op,
            str(r.modulus),
            str(r.prefer),
            f"{r.class_efficiency.get('1', float('nan')):.2f}",
            f"{r.class_efficiency.get('8', float('nan')):.2f}",
            str(sum(c.get("kind") == "alignment" for c in r.cliffs)),
            str(sum(c.get("kind") == "boundary" for c in r.cliffs)),
            str(len(r.curve.get("dims", []))),
        )
    Console(width=160).print(t)


def _refine(
    spec: str, base: str | None, out: Path, dtype: str, s: RefineSettings, dev: Any, overwrite: bool
) -> None:
    """``gac profile --refine MODEL --profile P --out NEW.json``."""
    from rich.console import Console

    from gac.guard import check_out
    from gac.hardware import refine as rf
    from gac.hardware.profile import load_profile
    from gac.hardware.profiler import plot_profile
    from gac.hardware.timing import resolve_dtype

    s.check()
    _check_json_out(out, overwrite)
    plot = out.with_suffix(".png")
    check_out(plot, overwrite, kind="file")
    prof = load_profile(base, dtype=dtype)  # None: this GPU's shipped profile for --dtype
    if not prof.measured:
        raise GacError(
            f"profile {prof.id!r} is not measured (the built-in default has no curves to refine); "
            "measure one with gac profile --out P.json first"
        )
    rf.check_device(prof, dev)
    dt = resolve_dtype(prof.dtype, dev)
    model = rf.load_refine_model(spec)
    con = Console(width=160, emoji=False)
    con.print(f"refining {prof.id} against {spec} ({s.tokens} tokens) on {dev.type}")
    res = rf.refine_profile(
        prof,
        model,
        s.tokens,
        rf.real_measure_gemm(dev, dt),
        rf.real_measure_point(prof, dev, dt),
        top=s.top,
        half_window=s.half_window,
        rounds=s.rounds,
        tol=s.tol,
        model_spec=spec,
        on_round=lambda r: con.print(
            f"round {r['round']}: {r['op']} around {r['dim']} {r['window']}: "
            f"{len(r['points_added'])} points measured, rule modulus {r['rule']['modulus']}"
            + (" [red](round rejected: fits the model worse; points dropped)[/red]" if r["rejected"] else "")
        ),
    )
    con.print(_refine_table(res, spec, s.tol))
    con.print(
        f"model total: measured {res.after['measured_total_ms']:.4g} ms, predicted "
        f"{res.before['scaled_predicted_total_ms']:.4g} ms before, "
        f"{res.after['scaled_predicted_total_ms']:.4g} ms after (predictions x the median measured/predicted)"
    )
    res.profile.save(out)
    plot_profile(res.profile, plot)
    n_new = sum(len(r["points_added"]) for r in res.rounds if not r["rejected"])
    what = f"{n_new} points added" if n_new else f"unchanged: {res.stopped}"
    typer.echo(f"profile written to {out} (id {res.profile.id}, {what}); plot {plot}")


def _refine_table(res: Any, spec: str, tol: float) -> Any:
    """The 20 worst GEMMs before refining: predicted vs measured, and their scores before -> after."""
    from rich.table import Table

    from gac.hardware import refine as rf

    t = Table(title=f"{spec}: predicted vs measured GEMMs ({res.stopped})")
    for c in ("GEMM m x k x n", "role", "n", "op", "dim", "predicted ms (x scale)", "measured ms", "score before -> after"):  # fmt: skip
        t.add_column(c, justify="left" if c in ("GEMM m x k x n", "role", "op") else "right")
    after = {id(r["gemm"]): r for r in res.after["rows"]}
    for r in sorted(res.before["rows"], key=lambda r: -r["score"])[:20]:
        g = r["gemm"]
        op, d = rf.target_dim(res.profile, g)
        a = after[id(g)]
        colour = "green" if a["score"] <= tol else "red"
        t.add_row(
            g.label(),
            g.role,
            str(r["count"]),
            op,
            f"{'K' if op == 'gemm_k' else 'N'}={d}",
            f"{a['predicted_ms'] * res.after['scale']:.4g}",
            f"{a['measured_ms']:.4g}",
            f"{r['score']:.3f} -> [{colour}]{a['score']:.3f}[/{colour}]",
        )
    return t
