"""The one exception type that the CLI turns into a clear one-line message."""

from __future__ import annotations


class GacError(Exception):
    """A user-facing error: bad input, an unsupported model, an unmet budget.

    The CLI prints ``error: <message>`` on one line and exits with status 2; no traceback.
    Keep messages to one line and say what to do about it where possible.
    """


def check_schema(found: object, expected: str, where: object) -> None:
    """Refuse a gac file whose ``schema`` is not ``expected`` (``name/N``), naming both versions.

    >>> check_schema("gac.model/1", "gac.model/1", "x")
    >>> check_schema("gac.model/2", "gac.model/1", "x")
    Traceback (most recent call last):
    ...
    gac.errors.GacError: x was written by a newer gac (schema gac.model/2; this gac reads gac.model/1): upgrade gac
    """
    if found == expected:
        return
    name, _, ver = expected.rpartition("/")
    if isinstance(found, str) and found.startswith(name + "/"):
        try:
            newer = int(found.rpartition("/")[2]) > int(ver)
        except ValueError:
            newer = False
        if newer:
            raise GacError(
                f"{where} was written by a newer gac (schema {found}; this gac reads {expected}): upgrade gac"
            )
    raise GacError(f"{where} has schema {found!r}; this gac reads {expected!r}")
