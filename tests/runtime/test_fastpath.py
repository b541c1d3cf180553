"""Each fast-path switch is declared once (gac.runtime.FastPath); every surface is generated from it.

The typer options of ``gac eval infer`` and ``gac generate``, the ``python -m gac.llm_run``
parser, :class:`gac.eval.infer.SweepConfig` and a plan's infer keys must agree with it on names,
defaults and polarity, and every flag spelling users may have scripted must still parse.
"""

from __future__ import annotations

import pytest
import typer
from typer.main import get_command
from typer.testing import CliRunner

from gac.errors import GacError
from gac.eval.infer import SweepConfig
from gac.llm_run import build_parser
from gac.plans.schema import EVAL_KINDS, parse_plan
from gac.runtime.fastpath import GENERATE, INFER, PLAN, FastPath, flag, is_bool, switches, typer_options

PLAN_AXES = {"axes": {"models": ["tiny:llama"], "compressors": ["svd"], "ratios": [0.5]}}

#: The spellings each command accepted before FastPath (scripts may use any of them).
LEGACY = {
    INFER: [
        "--graphs", "--no-graphs", "--compile", "--no-compile", "--fuse", "--no-fuse", "--triton",
        "--gqa-decode", "--no-gqa-decode", "--gemv", "--no-gemv", "--fused-lowrank",
        "--no-fused-lowrank", "--branches", "--no-branches", "--combo-kernels", "--no-combo-kernels",
    ],
    GENERATE: [
        "--no-compile", "--no-graphs", "--no-gqa-decode", "--no-gemv", "--no-fused-lowrank",
        "--no-branches", "--no-combo-kernels",
    ],
}  # fmt: skip


def _command(*path: str):
    from gac.cli import app

    cmd = get_command(app)
    for name in path:
        cmd = cmd.commands[name]  # type: ignore[attr-defined]
    return cmd


def _options(cmd) -> dict:
    return {p.name: p for p in cmd.params if p.param_type_name == "option"}


def _parse(cmd, args: list[str]) -> dict:
    with cmd.make_context(cmd.name, args, resilient_parsing=False) as ctx:
        return dict(ctx.params)


@pytest.mark.parametrize(("surface", "path"), [(INFER, ("eval", "infer")), (GENERATE, ("generate",))])
def test_typer_options_are_generated_from_fastpath(surface, path):
    opts = _options(_command(*path))
    for f in switches(surface):
        o = opts[f.name]
        assert o.default == f.default, f.name
        assert o.help == f.metadata["help"]
        if is_bool(f):  # one polarity: --x/--no-x
            assert o.opts == [flag(f.name)] and o.secondary_opts == [flag("no_" + f.name)]
        else:
            assert o.opts == [flag(f.name)]
    hidden = {f.name for f in switches()} - {f.name for f in switches(surface)}
    assert not hidden & set(opts), "a switch this surface does not take is exposed"


def test_llm_run_parser_and_plan_and_sweep_agree_with_fastpath():
    d = vars(build_parser().parse_args(["--variant", "baseline", "--out", "x"]))
    for f in switches(INFER):
        assert d[f.name] == f.default, f.name
        if is_bool(f):
            on = build_parser().parse_args(["--variant", "b", "--out", "x", flag(f.name)])
            off = build_parser().parse_args(["--variant", "b", "--out", "x", flag("no_" + f.name)])
            assert getattr(on, f.name) is True and getattr(off, f.name) is False
            with pytest.raises(SystemExit):  # mutually exclusive
                build_parser().parse_args(
                    ["--variant", "b", "--out", "x", flag(f.name), flag("no_" + f.name)]
                )
    assert {f.name for f in switches(PLAN)} <= EVAL_KINDS["infer"]
    for f in switches(PLAN):
        assert is_bool(f)
        got = parse_plan({**PLAN_AXES, "evals": [{"kind": "infer", f.name: not f.default}]})
        assert got.evals[0][f.name] is (not f.default)
        with pytest.raises(GacError, match=f"{f.name} must be true or false"):
            parse_plan({**PLAN_AXES, "evals": [{"kind": "infer", f.name: "no"}]})
    for k in {f.name for f in switches()} - {f.name for f in switches(PLAN)}:
        with pytest.raises(GacError, match=f"unknown key {k!r}"):
            parse_plan({**PLAN_AXES, "evals": [{"kind": "infer", k: True}]})
    sweep = SweepConfig()
    for f in switches():
        assert getattr(sweep, f.name) == f.default == getattr(FastPath(), f.name)


@pytest.mark.parametrize(("surface", "path"), [(INFER, ("eval", "infer")), (GENERATE, ("generate",))])
def test_every_scripted_flag_spelling_still_parses(surface, path):
    cmd = _command(*path)
    base = ["--out", "x"] if surface == INFER else ["smollm2", "--prompt", "hi"]
    for spelling in LEGACY[surface]:
        name = spelling.removeprefix("--").removeprefix("no-").replace("-", "_")
        got = _parse(cmd, [*base, spelling])
        assert got[name] is (not spelling.startswith("--no-")), spelling
    for spelling in LEGACY[INFER] if surface == INFER else []:
        a = build_parser().parse_args(["--variant", "b", "--out", "x", spelling])
        name = spelling.removeprefix("--").removeprefix("no-").replace("-", "_")
        assert getattr(a, name) is (not spelling.startswith("--no-")), spelling
    if surface == INFER:
        assert _parse(cmd, [*base, "--compile-mode", "max-autotune-no-cudagraphs"])["compile_mode"] == (
            "max-autotune-no-cudagraphs"
        )


def test_a_decorated_command_receives_one_fastpath():
    app = typer.Typer()
    got: list[FastPath] = []

    @app.command()
    @typer_options(GENERATE)
    def cmd(model: str = typer.Argument(...), fast: FastPath = None, n: int = typer.Option(1, "-n")):  # type: ignore[assignment]
        got.append(fast)
        assert n == 3 and model == "m"

    r = CliRunner().invoke(app, ["m", "--no-gemv", "--graphs", "-n", "3", "--no-combo-kernels"])
    assert r.exit_code == 0, r.output
    assert got == [FastPath(gemv=False, graphs=True, combo_kernels=False)]
    r = CliRunner().invoke(app, ["m", "--no-fuse"])  # generate does not fuse: no such option
    assert r.exit_code != 0


def test_gac_eval_infer_hands_the_switches_to_llm_run(monkeypatch):
    import gac.plans.suites

    seen = {}
    monkeypatch.setattr(gac.plans.suites, "run", lambda *a, **kw: seen.update(kw))
    from gac.cli import app

    r = CliRunner().invoke(app, ["eval", "infer", "--out", "x", "--no-fuse", "--no-branches", "--triton"])
    assert r.exit_code == 0, r.output
    assert seen["fast"] == FastPath(fuse=False, branches=False, triton=True)


def test_fastpath_of_overrides_and_refuses_unknown_switches():
    assert FastPath.of(None, gemv=False) == FastPath(gemv=False)
    assert FastPath.of(FastPath(fuse=False), gemv=False) == FastPath(fuse=False, gemv=False)
    with pytest.raises(TypeError):
        FastPath.of(None, gemm=False)
