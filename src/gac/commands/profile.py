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
            help="MODEL: re-measure --profile around the dims where it mispredicts "
            "this model's GEMMs most, and write the refined profile to --out",
        ),
        base_profile: str | None = typer.Option(
            None, "--profile", help="the profile to refine (path or shipped id; default: this GPU's)"
        ),
        tokens: int = typer.Option(2048, "--tokens", help="--refine: rows of the model's GEMMs (1 = decode)"),
        top: int = typer.Option(4, "--top", help="--refine: GEMMs re-measured around per round"),
        half_window: int = typer.Option(8, "--half-window", help="--refine: stride-1 sweep is dim ± this"),
        rounds: int = typer.Option(2, "--rounds", help="--refine: measure, re-distil, re-score rounds"),
        refine_tolerance: float = typer.Option(
            0.1, "--refine-tolerance", help="--refine: |log(measured/predicted)| a GEMM must exceed"
        ),
    ) -> None:
        """Sweep GEMM K/N, GEMV, SDPA head_dim and low-rank r; write the discovered rules (or --refine one)."""
        from rich.console import Console
        from rich.table import Table

        from gac.guard import check_out
        from gac.hardware.profiler import build_profile, write_profile_outputs
        from gac.hardware.timing import resolve_device

        if not 0.0 < tolerance < 1.0:
            raise GacError(f"--tolerance must be in (0, 1), got {tolerance}")
        if out.exists() and out.is_dir():
            raise GacError(f"--out {out} is a directory; give a .json file path")
        check_out(out, overwrite, kind="file")
        if refine is not None:
            if quick:
                raise GacError("--refine re-measures an existing profile; it does not take --quick")
            _refine(
                refine, base_profile, out, dtype, device, tokens, top, half_window, rounds, refine_tolerance
            )
            return
        if base_profile is not None:
            raise GacError("--profile names the profile to refine; use it with --refine MODEL")
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
    model_spec: str, base: str | None, out: Path, dtype: str, device: str | None, tokens: int,
    top: int, half_window: int, rounds: int, tolerance: float,
) -> None:  # fmt: skip
    """``gac profile --refine MODEL``: see :mod:`gac.hardware.refine`."""
    from rich.console import Console
    from rich.table import Table

    from gac.hardware.profile import load_profile
    from gac.hardware.profiler import plot_profile
    from gac.hardware.refine import model_gemms, real_measures, refine_profile
    from gac.hardware.timing import resolve_device, resolve_dtype
    from gac.models import load_model
    from gac.utils import progress

    for name, v, lo in (("--tokens", tokens, 1), ("--top", top, 1), ("--half-window", half_window, 0),
                        ("--rounds", rounds, 1)):  # fmt: skip
        if v < lo:
            raise GacError(f"{name} must be >= {lo}, got {v}")
    if not tolerance > 0:
        raise GacError(f"--refine-tolerance must be > 0, got {tolerance}")
    prof = load_profile(base, dtype=dtype)
    if not prof.measured:
        raise GacError(
            f"profile {prof.id!r} is not measured (the built-in default): refine a measured profile"
        )
    dev = resolve_device(device)
    dt = resolve_dtype(dtype, dev)
    model = load_model(
        model_spec, dtype=dt, device="meta" if model_spec.startswith("shape:") else "cpu"
    ).model
    gemm, point = real_measures(prof, dev, dt)
    n = len(model_gemms(model, tokens))
    with progress() as bar:
        task = bar.add_task(
            f"refine {prof.id} against {model_spec}", total=n + rounds * top * (2 * half_window + 1)
        )
        new, hist = refine_profile(
            prof, model, gemm, point, tokens=tokens, top=top, half_window=half_window, rounds=rounds,
            tolerance=tolerance, model_spec=model_spec, on_progress=lambda _: bar.advance(task),
        )  # fmt: skip
    t = Table(title=f"{new.id}: worst GEMMs of {model_spec} at {tokens} rows")
    for c in ("round", "GEMM m×k×n", "priced as", "dim", "predicted ms", "measured ms", "score", "after"):
        t.add_column(c)
    for h in hist:
        for w in h["worst"]:
            t.add_row(str(h["round"]), f"{w['m']}×{w['k']}×{w['n']}", w["op"], f"{w['dim_op']} {w['dim']}",
                      f"{w['predicted_ms']:.4f}", f"{w['measured_ms']:.4f}", f"{w['score']:.3f}",
                      (f"{w['score_after']:.3f}" if "score_after" in w else "") + (
                          f" ({h['stopped']})" if h.get("stopped") else ""))  # fmt: skip
    Console(width=160, stderr=True).print(t)
    new.save(out)
    plot_profile(new, out.with_suffix(".png"))
    rec = new.env["refinements"][-1]
    why = next((h["stopped"] for h in reversed(hist) if h.get("stopped")), None)
    typer.echo(
        f"profile written to {out} (id {new.id}); largest disagreement over the model's GEMMs "
        f"{rec['max_score_before']:.3f} -> {rec['max_score_after']:.3f}"
        + (f"; stopped: {why}" if why else "")
    )
