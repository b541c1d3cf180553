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
    ) -> None:
        """Sweep GEMM K/N, GEMV, SDPA head_dim and low-rank r; write the discovered rules."""
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
