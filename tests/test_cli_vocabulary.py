"""One CLI vocabulary: every short flag names the same long option in every command, and every long
option that several commands take is spelled, flagged and explained one way (gac.commands.options)."""

from __future__ import annotations

import pytest
import typer
from typer.testing import CliRunner

from gac.cli import app
from gac.commands.options import SHARED, SHORT_FLAGS
from gac.runtime.fastpath import flag, switches


def _commands(cmd, path):
    if hasattr(cmd, "commands"):  # a group
        for name, sub in cmd.commands.items():
            yield from _commands(sub, (*path, name))
    else:
        yield " ".join(path), cmd


def _short_flags():
    """(command, short flag, long names) for every option that has a short flag."""
    for where, cmd in _commands(typer.main.get_command(app), ("gac",)):
        for p in cmd.params:
            if p.param_type_name != "option":
                continue
            names = [*p.opts, *p.secondary_opts]
            longs = tuple(sorted(n for n in names if n.startswith("--")))
            for short in (n for n in names if not n.startswith("--")):
                yield where, short, longs


def _options():
    """(command, option) for every visible option of every command."""
    for where, cmd in _commands(typer.main.get_command(app), ("gac",)):
        for p in cmd.params:
            if p.param_type_name == "option" and not p.hidden:
                yield where, p


def _long(p) -> str:
    return next(n for n in p.opts if n.startswith("--"))


def _meaning(p) -> tuple:
    """What a user sees of an option: its long names, whether it is a flag, its help (a command may
    leave the short flag out, never give it another meaning: the short-flag tests)."""
    longs = [n for n in (*p.opts, *p.secondary_opts) if n.startswith("--")]
    return tuple(sorted(longs)), p.is_flag, p.help


def test_walk_sees_the_known_short_flags():
    seen = {(where, short) for where, short, _ in _short_flags()}
    # guards the walk itself: an empty walk would pass every check below
    assert {
        ("gac compress", "-O"),
        ("gac repair", "-o"),
        ("gac compress", "-p"),
        ("gac eval ppl", "-d"),
    } <= seen


def test_each_short_flag_means_one_long_option_everywhere():
    meanings: dict[str, set[tuple[str, ...]]] = {}
    for where, short, longs in _short_flags():
        meanings.setdefault(short, set()).add(longs)
        assert short in SHORT_FLAGS, f"{where}: {short} is not in gac.commands.options.SHORT_FLAGS"
        assert SHORT_FLAGS[short] in longs, f"{where}: {short} means {longs}, not {SHORT_FLAGS[short]}"
    clashes = {s: m for s, m in meanings.items() if len(m) > 1}
    assert not clashes, f"short flags with several meanings: {clashes}"


def test_vocabulary_long_names_are_unique():
    assert len(set(SHORT_FLAGS.values())) == len(SHORT_FLAGS)


def test_old_short_flags_are_refused_not_misread():
    """`-o KEY=VALUE` (compress) and `-p TEXT` (generate) were renamed: refused before any work."""
    r = CliRunner().invoke(app, ["compress", "smollm2", "-o", "rank=1", "--out", "/nonexistent/x"])
    assert r.exit_code == 2 and "-o" in r.output
    r = CliRunner().invoke(app, ["generate", "smollm2", "-p", "Hi"])
    assert r.exit_code == 2 and "-p" in r.output


def test_a_long_option_means_one_thing_in_every_command():
    """Two commands with the same long option give it the same short flag, kind and help."""
    seen: dict[str, dict[tuple, list[str]]] = {}
    for where, p in _options():
        seen.setdefault(_long(p), {}).setdefault(_meaning(p), []).append(where)
    clashes = {name: m for name, m in seen.items() if len(m) > 1}
    assert not clashes, f"long options defined two ways: {clashes}"


def test_recurring_options_are_declared_once_in_the_options_module():
    """A long option several commands take comes from gac.commands.options (or FastPath's switches)."""
    fast = {flag(f.name) for f in switches()}
    users: dict[str, set[str]] = {}
    for where, p in _options():
        users.setdefault(_long(p), set()).add(where)
        if _long(p) in SHARED:
            o = SHARED[_long(p)]
            assert set(p.opts) <= set(o.names) and p.help == o.help, f"{where}: {_long(p)} is not options.{o}"
    recurring = {name for name, w in users.items() if len(w) > 1}
    assert recurring - fast <= set(SHARED), (
        f"declare in gac.commands.options: {recurring - fast - set(SHARED)}"
    )
    # guards the walk: these recur today
    assert {
        "--out",
        "--device",
        "--dtype",
        "--profile",
        "--seq-len",
        "--overwrite",
        "--max-gpu-memory",
    } <= recurring


def test_the_model_argument_is_explained_once():
    helps = {
        p.help
        for _, cmd in _commands(typer.main.get_command(app), ("gac",))
        for p in cmd.params
        if p.param_type_name == "argument" and p.name == "model"
    }
    assert len(helps) == 1, helps


def test_the_short_flags_are_the_documented_ten():
    """A new short flag is a deliberate change to the vocabulary (README, docs/architecture.md)."""
    assert SHORT_FLAGS == {
        "-a": "--align",
        "-c": "--compressor",
        "-d": "--dataset",
        "-e": "--experiment",
        "-n": "--max-new-tokens",
        "-o": "--out",
        "-O": "--option",
        "-p": "--profile",
        "-r": "--param-ratio",
        "-s": "--strategy",
    }


def test_renamed_options_still_work_hidden_and_the_new_spelling_wins(tmp_path):
    """profile --results / --refine-tolerance and eval infer --memory-budget: hidden, with a notice."""
    from gac.commands import options as o
    from gac.errors import GacError

    assert o.renamed(None, "--old", 3.0, "--new") == 3.0
    assert o.renamed(2.0, "--old", None, "--new") == 2.0
    assert o.renamed(0.2, "--old", 0.1, "--new", new_default=0.1) == 0.2
    with pytest.raises(GacError, match="--old is the old spelling of --new; give only --new"):
        o.renamed(2.0, "--old", 3.0, "--new")
    hidden = {
        (where, n)
        for where, cmd in _commands(typer.main.get_command(app), ("gac",))
        for p in cmd.params
        if p.param_type_name == "option" and p.hidden
        for n in p.opts
    }
    assert {("gac profile", "--results"), ("gac profile", "--refine-tolerance")} <= hidden
    assert ("gac eval infer", "--memory-budget") in hidden
    r = CliRunner().invoke(
        app, ["eval", "infer", "--out", str(tmp_path), "--memory-budget", "1", "--max-gpu-memory", "2"]
    )
    assert r.exit_code != 0 and "give only --max-gpu-memory" in str(r.exception)


def test_help_shows_what_a_user_needs_first():
    """compress and eval infer: the rarely used options sit in panels below the main ones."""
    cmds = dict(_commands(typer.main.get_command(app), ("gac",)))
    for where, first in (
        ("gac compress", {"--compressor", "--param-ratio", "--align", "--out", "--profile", "--serve"}),
        ("gac eval infer", {"--variant", "--baseline-model-id", "--out", "--overwrite"}),
    ):
        top = {
            _long(p) for p in cmds[where].params if p.param_type_name == "option" and not p.rich_help_panel
        }
        assert first <= top and len(top) <= 10, (where, top)
    r = CliRunner().invoke(app, ["compress", "--help"], env={"COLUMNS": "200"})
    assert r.exit_code == 0
    for panel in ("Calibration", "Allocation", "Recovery", "Machine"):
        assert panel in r.output


def test_profile_takes_its_old_raw_dir_spelling_with_a_notice(tmp_path, monkeypatch):
    """`gac profile --results DIR` (committed GPU scripts used it) is --raw-dir DIR, with a notice."""
    import gac.hardware.profiler as profiler
    from gac.hardware.profile import default_profile

    seen = {}

    def fake_build(dtype, quick, device, results_dir, tolerance):
        seen["raw"] = results_dir
        return default_profile(dtype)

    monkeypatch.setattr(profiler, "build_profile", fake_build)
    monkeypatch.setattr(profiler, "write_profile_outputs", lambda prof, out, raw: prof.save(out))
    argv = ["profile", "--quick", "--device", "cpu", "--out", str(tmp_path / "p.json")]
    r = CliRunner().invoke(app, [*argv, "--results", str(tmp_path / "raw")])
    assert r.exit_code == 0, r.output
    assert seen["raw"] == tmp_path / "raw" and "--results is now --raw-dir" in r.output
    r = CliRunner().invoke(app, [*argv, "--overwrite", "--results", "a", "--raw-dir", "b"])
    assert r.exit_code != 0 and "give only --raw-dir" in str(r.exception)


@pytest.mark.parametrize(
    ("command", "library", "cli_only"),
    [
        # options the command parses or uses itself; every other one reaches the library by its name
        ("gac eval lm_eval", "gac.llm_eval:evaluate", set()),
        (
            "gac eval infer",
            "gac.llm_run:run",
            {
                "max_gpu_memory",
                "compile",
                "graphs",
                "compile_mode",
                "fuse",
                "triton",
                "gqa_decode",
                "gemv",
                "fused_lowrank",
                "branches",
                "combo_kernels",
            },
        ),  # fmt: skip
        (
            "gac compress",
            "gac.api:CompressConfig",
            {"model", "option", "latency_tokens", "out", "overwrite", "device", "dtype", "rows"},
        ),  # fmt: skip
    ],
)
def test_commands_name_their_options_after_the_library_arguments(command, library, cli_only):
    """options.call passes a command's options on by name: an option the library does not take
    would be dropped silently, so each one is either an argument of the library or listed here."""
    import importlib
    import inspect

    mod, name = library.split(":")
    takes = set(inspect.signature(getattr(importlib.import_module(mod), name)).parameters)
    cmd = dict(_commands(typer.main.get_command(app), ("gac",)))[command]
    params = {p.name for p in cmd.params if not getattr(p, "hidden", False)}
    assert params - takes == cli_only
