"""``gac repair MODEL --strategy S --out DIR``: zero-pad misaligned dims without changing outputs."""

from __future__ import annotations

import json
from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    @app.command("repair")
    def repair_cmd(
        model: str = typer.Argument(
            ..., help="alias (smollm2), HF dir or hub id, .gguf file, or gac-saved dir"
        ),
        out: Path = typer.Option(..., "--out", "-o", help="output directory (written atomically)"),
        strategy: str = typer.Option(
            "minimal", "--strategy", "-s", help="minimal (x8), optimal (x16) or profile (the profile's rules)"
        ),
        profile: str = typer.Option(
            "auto", "--profile", "-p", help="profile JSON, shipped profile id, 'default' or 'auto'"
        ),
        overwrite: bool = typer.Option(False, "--overwrite", help="replace an existing output directory"),
        dtype: str = typer.Option("float32", "--dtype", help="dtype to load (and save) the model in"),
        trust_remote_code: bool = typer.Option(
            False, "--trust-remote-code", help="allow the model's own Python code (off by default)"
        ),
    ) -> None:
        """Pad misaligned dims with zeros (exact: same logits) and save the repaired model."""
        from rich.table import Table

        from gac.errors import GacError
        from gac.guard import check_out
        from gac.hardware.profile import load_profile
        from gac.models import load_model
        from gac.surgery.repair import STRATEGIES, repair_, save_repaired
        from gac.utils import console

        if strategy not in STRATEGIES:
            raise GacError(f"unknown repair strategy {strategy!r}; choose one of: {', '.join(STRATEGIES)}")
        check_out(out, overwrite)
        prof = load_profile(profile)
        console.print(
            f"profile: {prof.id} ({'measured' if prof.measured else 'NOT measured'}) - {prof.label}"
        )
        from gac.commands.analyze import parse_dtype

        lm = load_model(model, dtype=parse_dtype(dtype), trust_remote_code=trust_remote_code)
        report = repair_(lm.model, strategy=strategy, profile=prof)
        for s in report.skipped:
            console.print(f"[yellow]not padded:[/yellow] {s}")
        if report.noop:
            console.print(f"{report.summary()}; nothing written to {out}")
            return
        t = Table(title=f"repair ({strategy})")
        for col in ("kind", "where", "before", "after"):
            t.add_column(col, justify="right" if col in ("before", "after") else "left")
        grouped: dict[tuple[str, int, int], list[str]] = {}
        for c in report.changes:
            grouped.setdefault((c.kind, c.before, c.after), []).append(c.where)
        for (kind, b, a), wheres in grouped.items():
            where = wheres[0] if len(wheres) == 1 else f"{wheres[0]} (+{len(wheres) - 1} more)"
            t.add_row(kind, where, str(b), str(a))
        console.print(t)
        source = dict(lm.source)
        gac_cfg = Path(source.get("path") or "") / "gac_config.json"
        if source.get("kind") == "gac" and gac_cfg.is_file():
            source["gac_config"] = json.loads(gac_cfg.read_text())  # how the input was compressed
        save_repaired(lm.model, out, report, tokenizer=lm.tokenizer, overwrite=overwrite, source=source)
        console.print(report.summary())
        doc = json.loads((Path(out) / "gac_repair.json").read_text())
        how = (
            "AutoModelForCausalLM.from_pretrained or gac.load"
            if doc.get("plain_transformers")
            else f"gac.load; plain transformers cannot: {doc.get('plain_transformers_why_not')}"
        )
        console.print(f"wrote {out} (load it with {how})")
        typer.echo(
            json.dumps({"out": str(out), **{k: v for k, v in report.to_dict().items() if k != "changes"}})
        )
