"""The one exception type that the CLI turns into a clear one-line message."""

from __future__ import annotations


class GacError(Exception):
    """A user-facing error: bad input, an unsupported model, an unmet budget.

    The CLI prints ``error: <message>`` on one line and exits with status 2; no traceback.
    Keep messages to one line and say what to do about it where possible.
    """
