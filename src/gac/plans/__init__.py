"""Declarative experiment plans (``gac run PLAN.toml``, ``gac report PLAN_DIR``) and the seed's suites.

* :mod:`gac.plans.schema`: the plan format (parse, validate, expand into cells and groups);
* :mod:`gac.plans.store`: the plan directory (``plan.json``, one ``cells/<id>.json`` per cell);
* :mod:`gac.plans.cells`: running a group of cells in this process, one calibration per group;
* :mod:`gac.plans.executors`: where cells run, ``local`` or ``slurm`` (submitit), and
  :func:`~gac.plans.executors.run_plan` (``gac run``);
* :mod:`gac.plans.report`: ``gac report`` of a plan directory; :mod:`gac.plans.results` of any
  directory of results;
* :mod:`gac.plans.suites`: one variant through one suite (``gac eval lm_eval|infer``,
  ``python -m gac.llm_eval|llm_run``).

Each finished cell is one JSON file written atomically with its environment, its command and the
hash of its inputs: a re-run skips finished cells and re-runs failed or missing ones, a killed run
loses at most the cell in progress, and the cells of one (model, compressor, ratio) share one
calibration.
"""

from gac.plans.executors import EXECUTORS, execute, run_local, run_plan
from gac.plans.report import render_plan, report
from gac.plans.schema import Cell, ExperimentPlan, load_plan, parse_plan
from gac.plans.store import open_plan_dir, plan_from_dir

__all__ = [
    "EXECUTORS",
    "Cell",
    "ExperimentPlan",
    "execute",
    "load_plan",
    "open_plan_dir",
    "parse_plan",
    "plan_from_dir",
    "render_plan",
    "report",
    "run_local",
    "run_plan",
]
