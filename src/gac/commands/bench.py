"""``gac bench``: run a named shape experiment and write JSON, CSV, PNG (and JSONL as it goes)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from gac.commands import options as o
from gac.errors import GacError
from gac.utils import console


def register(app: typer.Typer) -> None:
    @app.command("bench")
    def bench(
        experiment: Annotated[str, o.EXPERIMENT()],
        dtype: Annotated[str, o.DTYPE()] = "bfloat16",
        out: Annotated[Path | None, o.OUT(shown_default="benchmarks/results/<gpu>/")] = None,
        device: Annotated[str, o.DEVICE()] = "auto",
        dims: str | None = typer.Option(
            None, "--dims", help="override swept dims, e.g. 64:256 or 107,112,128"
        ),
        batch: int | None = typer.Option(None, "--batch", help="SDPA batch (default 4; CPU 1)"),
        seq_len: Annotated[int | None, o.SEQ_LEN(shown_default="SDPA: 2048; CPU 64")] = None,
        heads: int | None = typer.Option(None, "--heads", help="SDPA heads (default 32; CPU 2)"),
        m: int | None = typer.Option(None, "--m", help="GEMM M for N/K sweeps (default 8192; CPU 64)"),
        k: int | None = typer.Option(None, "--k", help="GEMM K for N/M sweeps (default 4096; CPU 128)"),
        n: int | None = typer.Option(None, "--n", help="GEMM N for K/M sweeps (default 4096; CPU 128)"),
        half_window: Annotated[int | None, o.HALF_WINDOW(shown_default="per experiment")] = None,
        resume: bool = typer.Option(False, "--resume", help="keep and skip points already in the JSONL"),
    ) -> None:
        """Measure how GPU kernels' latency depends on tensor dims (staircase plots, console table);
        --out DIR gets the JSON, CSV, PNG and JSONL of each experiment."""
        from gac.hardware.sweeps import Config, parse_dims, run_experiment
        from gac.hardware.timing import resolve_device

        for name, v in (
            ("--batch", batch),
            ("--seq-len", seq_len),
            ("--heads", heads),
            ("--m", m),
            ("--k", k),
            ("--n", n),
        ):
            if v is not None and v < 1:
                raise GacError(f"{name} must be a positive integer, got {v}")
        if half_window is not None and half_window < 0:
            raise GacError(f"--half-window must be >= 0, got {half_window}")
        dev = resolve_device(device)
        cfg = Config.default_for(dev)
        for attr, v in (
            ("batch", batch),
            ("seq", seq_len),
            ("heads", heads),
            ("m", m),
            ("k", k),
            ("n", n),
            ("half_window", half_window),
        ):
            if v is not None:
                setattr(cfg, attr, v)
        if dims is not None:
            cfg.dims = parse_dims(dims)
        if experiment == "latent_attention":  # PaLU's decode kernel (the profile's latent_attention class)
            latent_bench(dev, dtype, out)
            return
        run_experiment(experiment, dtype=dtype, out=out, config=cfg, device=dev, resume=resume)
        if experiment == "all" and dev.type == "cuda":
            latent_bench(dev, dtype, out)


def latent_bench(dev, dtype: str, out: Path | None) -> None:
    """The latent attention kernel's calls, as ``gac profile`` times them for its class, written as
    JSON, CSV and PNG (:func:`gac.hardware.profiler.write_latent_bench`)."""
    from gac.hardware.profiler import measure_latent_class, write_latent_bench
    from gac.hardware.sweeps import default_out_dir
    from gac.hardware.timing import dtype_name, environment, resolve_dtype

    dt = resolve_dtype(dtype, dev)
    result = measure_latent_class(dev, dt, budget_s=600.0)  # with its wide rows, as gac profile measures it
    path = write_latent_bench(result, out or default_out_dir(dev), dtype_name(dt), environment(dev, dt))
    wide = (result.get("wide") or {}).get("fit", {}).get("calls", [])
    console.print(f"latent attention: {len(result['fit']['calls'])} calls and {len(wide)} wide, fit within "
                  f"{100 * result['fit']['max_abs_rel_err']:.0f}%: {path}")  # fmt: skip
