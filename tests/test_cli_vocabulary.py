"""One CLI vocabulary: every short flag names the same long option in every command."""

from __future__ import annotations

import typer
from typer.testing import CliRunner

from gac.cli import app
from gac.commands.options import SHORT_FLAGS


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
