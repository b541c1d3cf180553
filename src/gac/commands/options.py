"""The CLI's one vocabulary of short flags: each means the same long option in every command.

A command that takes one of these long options may offer the short flag; no command gives the
short flag another meaning (``tests/test_cli_vocabulary.py`` walks every command to check).
"""

from __future__ import annotations

SHORT_FLAGS: dict[str, str] = {
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
