"""``gac repair MODEL --strategy S --out DIR``: zero-pad misaligned dims without changing outputs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from gac.commands import options as o


def register(app: typer.Typer) -> None:
    @app.command("repair")
    def repair_cmd(
        model: o.MODEL,
        out: Annotated[Path, o.OUT()],
        strategy: Annotated[str, o.STRATEGY()] = "minimal",
        profile: Annotated[str, o.PROFILE()] = "auto",
        overwrite: Annotated[bool, o.OVERWRITE()] = False,
        dtype: Annotated[str, o.DTYPE()] = "float32",
        trust_remote_code: Annotated[bool, o.TRUST_REMOTE_CODE()] = False,
    ) -> None:
        """Pad misaligned dims with zeros (exact: same logits) and save the repaired model to the
        --out directory, in --dtype."""
        from rich.table import Table

        from gac.errors import GacError
        from gac.guard import check_out
        from gac.hardware.profile import load_profile
        from gac.models import load_model
        from gac.surgery.repair import STRATEGIES, repair_, save_repaired
        from gac.utils import console, parse_dtype

        if strategy not in STRATEGIES:
            raise GacError(f"unknown repair strategy {strategy!r}; choose one of: {', '.join(STRATEGIES)}")
        check_out(out, overwrite)
        prof = load_profile(profile)
        console.print(
            f"profile: {prof.id} ({'measured' if prof.measured else 'NOT measured'}) - {prof.label}"
        )
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
