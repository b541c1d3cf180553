"""A plan directory: ``plan.json`` (the plan that owns it) and one ``cells/<id>.json`` per finished cell.

Each cell file is written atomically with its environment, its command and the hash of its inputs,
so a re-run skips finished cells (same input hash) and re-runs failed, stale or missing ones, and a
killed run loses at most the cell in progress. A directory written by another plan (another plan
hash) is refused.
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Any

from gac.errors import GacError
from gac.plans.schema import CELL_SCHEMA, PLAN_SCHEMA, Cell, ExperimentPlan, digest, parse_plan


def cell_path(plan_dir: Path, cell: Cell) -> Path:
    return plan_dir / "cells" / f"{cell.id}.json"


def read_cell(plan_dir: Path, cell: Cell) -> dict[str, Any] | None:
    p = cell_path(plan_dir, cell)
    try:
        d = json.loads(p.read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        return None
    return d if isinstance(d, dict) and d.get("schema") == CELL_SCHEMA else None


def cell_state(plan: ExperimentPlan, plan_dir: Path, cell: Cell) -> str:
    """``done`` (ok, same inputs), ``failed``, ``stale`` (other inputs) or ``pending``."""
    d = read_cell(plan_dir, cell)
    if d is None:
        return "pending"
    if d.get("input_hash") != digest(plan.cell_inputs(cell)):
        return "stale"
    return "done" if d.get("status") == "ok" else "failed"


def open_plan_dir(plan: ExperimentPlan, plan_dir: str | Path, create: bool = True) -> Path:
    """Check (and create) ``plan_dir``; refuse one written by another plan (hash mismatch)."""
    from gac.utils import atomic_write_text

    d = Path(plan_dir)
    meta = d / "plan.json"
    if meta.exists():
        try:
            old = json.loads(meta.read_text())
        except (OSError, json.JSONDecodeError, UnicodeDecodeError):
            raise GacError(f"{meta} is not a gac plan record; choose another --out") from None
        if old.get("schema") != PLAN_SCHEMA or old.get("plan_hash") != plan.hash:
            raise GacError(
                f"{d} holds the results of another plan (hash {old.get('plan_hash')}, this plan "
                f"{plan.hash}); choose another --out"
            )
        return d
    if d.exists() and any(d.iterdir()):
        raise GacError(f"{d} exists and is not a plan directory (no plan.json); choose another --out")
    if create:
        d.mkdir(parents=True, exist_ok=True)
        rec = {"schema": PLAN_SCHEMA, "plan_hash": plan.hash, "source": plan.source, "plan": plan.to_dict(),
               "published": plan.published, "slurm": plan.slurm}  # fmt: skip
        atomic_write_text(meta, json.dumps(rec, indent=1, default=str))
    return d


def plan_from_dir(plan_dir: str | Path) -> ExperimentPlan:
    """The plan recorded in ``plan_dir/plan.json`` (used by Slurm jobs and ``gac report``)."""
    meta = Path(plan_dir) / "plan.json"
    try:
        rec = json.loads(meta.read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        raise GacError(f"{plan_dir} is not a plan directory (no readable plan.json)") from None
    p = rec["plan"]
    data = {
        "plan": {"name": p["name"], "device": p["device"], "dtype": p["dtype"]},
        "axes": {
            "models": p["models"],
            "compressors": p["compressors"],
            "ratios": p["ratios"],
            "align": p["aligns"],
        },
        "compress": {**p["compress"], **({"options": p["options"]} if p["options"] else {})},
        "evals": p["evals"],
        **({"benches": p["benches"]} if p.get("benches") else {}),
        "slurm": rec.get("slurm") or {},
        "published": rec.get("published") or {},
    }
    return parse_plan(data, rec.get("source", ""))


def is_plan_dir(root: Path) -> bool:
    """Whether ``root`` holds a ``plan.json`` written by ``gac run``."""
    try:
        return json.loads((root / "plan.json").read_text()).get("schema") == PLAN_SCHEMA
    except (OSError, json.JSONDecodeError, UnicodeDecodeError, AttributeError):
        return False


def write_cell(plan: ExperimentPlan, plan_dir: Path, cell: Cell, status: str, results: dict[str, Any],
               timings: dict[str, float], error: str | None = None, log: str | None = None) -> None:  # fmt: skip
    """Write ``cell``'s record (``gac.cell/1``) atomically: its status, results, timings, inputs and env."""
    from gac.hardware.timing import environment
    from gac.utils import atomic_write_text

    rec = {
        "schema": CELL_SCHEMA,
        "cell": cell.to_dict(),
        "id": cell.id,
        "status": status,
        "error": error,
        "input_hash": digest(plan.cell_inputs(cell)),
        "plan_hash": plan.hash,
        "inputs": plan.cell_inputs(cell),
        "results": results,
        "timings": timings,
        "command": " ".join(shlex.quote(a) for a in sys.argv),
        "env": environment(plan.run_device()),
    }
    if log:
        rec["log_tail"] = log
    p = cell_path(plan_dir, cell)
    p.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(p, json.dumps(rec, indent=1, default=str))


def status_table(
    plan: ExperimentPlan, plan_dir: Path, only: list[str] | None = None
) -> list[tuple[str, str, str]]:
    """(group, cell id, state) for every cell (``gac run --dry-run``)."""
    return [(g, c.id, cell_state(plan, plan_dir, c)) for g, cells in plan.groups(only).items() for c in cells]
