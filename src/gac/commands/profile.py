"""``gac profile``: measure this GPU's shape penalties and distil a profile JSON."""

from __future__ import annotations

from pathlib import Path

import typer

from gac.errors import GacError


def register(app: typer.Typer) -> None:
    @app.command("profile")
    def profile(
        out: Path = typer.Option(..., "--out", "-o", help="where to write the profile JSON"),
        dtype: str = typer.Option("bfloat16", "--dtype", help="float16 or bfloat16 (float32 also accepted)"),
        quick: bool = typer.Option(False, "--quick", help="smaller sweeps (< 60 s on an H100/H200)"),
        device: str | None = typer.Option(None, "--device", help="cuda or cpu (default: cuda if available)"),
        raw_dir: Path | None = typer.Option(
            None,
            "--raw-dir",
            "--results",
            help="raw points, timing and plot dir (default: <out stem>-raw/ beside --out)",
        ),
        overwrite: bool = typer.Option(False, "--overwrite", help="replace an existing --out file"),
        tolerance: float = typer.Option(
            0.05, "--tolerance", help="rule tolerance: within 5%% of the best nearby"
        ),
        refine: str | None = typer.Option(
            None,
            "--refine",
            metavar="MODEL",
            help="refine --profile against MODEL (alias, path, gac dir or tiny:<family>) instead of sweeping",
        ),
        base: str | None = typer.Option(
            None,
            "--profile",
            "-p",
            help="with --refine: the measured profile to refine (JSON or shipped id; default: this GPU's)",
        ),
        tokens: int = typer.Option(2048, "--tokens", help="with --refine: prefill tokens (M of every GEMM)"),
        top: int = typer.Option(4, "--top", help="with --refine: worst GEMMs refined per round"),
        half_window: int = typer.Option(
            8, "--half-window", help="with --refine: measure stride 1 over [d - H, d + H]"
        ),
        rounds: int = typer.Option(2, "--rounds", help="with --refine: most rounds"),
        tolerance_refine: float = typer.Option(
            0.1,
            "--tolerance-refine",
            "--refine-tolerance",
            help="with --refine: |log error| after removing the global scale",
        ),
    ) -> None:
        """Sweep GEMM K/N, GEMV, SDPA head_dim and low-rank r; write the discovered rules.

        With --refine MODEL --profile P: re-measure P around the dims where its prediction and
        MODEL's measured GEMMs disagree most, and write the refined profile to --out.
        """
        from rich.console import Console
        from rich.table import Table

        from gac.guard import check_out

        if refine is not None:
            if quick:
                raise GacError(
                    "--refine and --quick do not go together: --refine measures only what it needs"
                )
            _refine(
                refine,
                base,
                out,
                dtype,
                tokens,
                top,
                half_window,
                rounds,
                tolerance_refine,
                device,
                overwrite,
            )
            return
        if base is not None:
            raise GacError("--profile is only used with --refine MODEL")
        from gac.hardware.profiler import build_profile, write_profile_outputs
        from gac.hardware.timing import resolve_device

        if not 0.0 < tolerance < 1.0:
            raise GacError(f"--tolerance must be in (0, 1), got {tolerance}")
        if out.exists() and out.is_dir():
            raise GacError(f"--out {out} is a directory; give a .json file path")
        check_out(out, overwrite, kind="file")
        # Raw sweeps go where the user pointed: beside --out, never into the current directory.
        rdir = raw_dir if raw_dir is not None else out.parent / f"{out.stem}-raw"
        check_out(rdir, overwrite=True)
        dev = resolve_device(device)
        prof = build_profile(dtype=dtype, quick=quick, device=dev, results_dir=rdir, tolerance=tolerance)
        write_profile_outputs(prof, out, rdir)
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
        typer.echo(f"profile written to {out} (id {prof.id})")


def _refine(
    spec: str,
    base: str | None,
    out: Path,
    dtype: str,
    tokens: int,
    top: int,
    half_window: int,
    rounds: int,
    tol: float,
    device: str | None,
    overwrite: bool,
) -> None:
    """``gac profile --refine MODEL --profile P --out NEW.json``."""
    from rich.console import Console
    from rich.table import Table

    from gac.guard import check_out
    from gac.hardware import refine as rf
    from gac.hardware.profile import load_profile
    from gac.hardware.profiler import plot_profile
    from gac.hardware.timing import resolve_device, resolve_dtype

    for name, v, lo in (("--top", top, 1), ("--half-window", half_window, 0), ("--rounds", rounds, 1)):
        if v < lo:
            raise GacError(f"{name} must be at least {lo}, got {v}")
    if tokens < 1:
        raise GacError(f"--tokens must be a positive integer, got {tokens}")
    if not tol > 0:
        raise GacError(f"--tolerance-refine must be positive, got {tol}")
    if out.exists() and out.is_dir():
        raise GacError(f"--out {out} is a directory; give a .json file path")
    check_out(out, overwrite, kind="file")
    plot = out.with_suffix(".png")
    check_out(plot, overwrite, kind="file")
    prof = load_profile(base, dtype=dtype)  # None: this GPU's shipped profile for --dtype
    if not prof.measured:
        raise GacError(
            f"profile {prof.id!r} is not measured (the built-in default has no curves to refine); "
            "measure one with gac profile --out P.json first"
        )
    dev = resolve_device(device)
    rf.check_device(prof, dev)
    dt = resolve_dtype(prof.dtype, dev)
    model = rf.load_refine_model(spec)
    con = Console(width=160, emoji=False)
    con.print(f"refining {prof.id} against {spec} ({tokens} tokens) on {dev.type}")
    res = rf.refine_profile(
        prof,
        model,
        tokens,
        rf.real_measure_gemm(dev, dt),
        rf.real_measure_point(prof, dev, dt),
        top=top,
        half_window=half_window,
        rounds=rounds,
        tol=tol,
        model_spec=spec,
        on_round=lambda r: con.print(
            f"round {r['round']}: {r['op']} around {r['dim']} {r['window']}: "
            f"{len(r['points_added'])} points measured, rule modulus {r['rule']['modulus']}"
            + (" [red](round rejected: fits the model worse; points dropped)[/red]" if r["rejected"] else "")
        ),
    )
    t = Table(title=f"{spec}: predicted vs measured GEMMs ({res.stopped})")
    for c in (
        "GEMM m x k x n",
        "role",
        "n",
        "op",
        "dim",
        "predicted ms (x scale)",
        "measured ms",
        "score before -> after",
    ):
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
    con.print(t)
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
