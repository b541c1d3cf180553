"""How a dispatch table is read: which row class serves an input of ``rows`` token rows.

A dispatch (:mod:`gac.runtime.dispatch`) measures a kernel against the existing path once per machine,
per site shape and *row class*, and gives each switched module its row of the table as an attribute
(``gemv_table``, ``lowrank_table``, ``branch_table``): ``{row class: decision}``, with every row class
of its kernel present (None where the existing path runs).  An input of ``rows`` token rows takes
the decision of the smallest class ``>= rows`` (:func:`row_class`); more rows than the largest class
take the existing path.  The modules the runtime swaps in, the kernels (their tile configurations
per row class) and the latency model (:mod:`gac.hardware.latency`, which prices a switched site from
its table) all read a table this one way.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def row_class(rows: int, classes: Iterable[int]) -> int | None:
    """The smallest of ``classes`` that is at least ``rows`` (None: no rows, or more than every class).

    >>> [row_class(r, (1, 16)) for r in (0, 1, 2, 16, 17)]
    [None, 1, 16, 16, None]
    >>> row_class(40, {1: "a", 16: None, 64: "b"})
    64
    """
    for c in sorted(classes):
        if 0 < rows <= c:
            return c
    return None


def rows_of(x: Any) -> int:
    """Token rows of an input ``[..., features]`` (every leading dim together)."""
    return x.numel() // x.shape[-1] if x.shape[-1] else 0


def choice(table: dict[int, Any] | None, rows: int) -> Any:
    """The decision of ``table`` (row class -> decision) for ``rows`` token rows, None for the existing path.

    >>> table = {1: [4, 512, 4, 3], 16: None}
    >>> choice(table, 1), choice(table, 8), choice(table, 17), choice(None, 1)
    ([4, 512, 4, 3], None, None, None)
    """
    if not table:
        return None
    c = row_class(rows, table)
    return table.get(c) if c is not None else None
