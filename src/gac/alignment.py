"""Alignment arithmetic, in one place.

Every other module asks these helpers (or a :class:`gac.hardware.profile.Profile`, which
uses them) whether a dim is aligned and which aligned dims lie near it.
"""

from __future__ import annotations


def round_up(d: int, m: int) -> int:
    """Smallest multiple of ``m`` that is >= ``d``.

    >>> round_up(107, 8), round_up(112, 8), round_up(0, 8)
    (112, 112, 0)
    """
    if m <= 0:
        raise ValueError(f"modulus must be positive, got {m}")
    return -(-d // m) * m


def round_down(d: int, m: int) -> int:
    """Largest multiple of ``m`` that is <= ``d``.

    >>> round_down(107, 8), round_down(7, 8)
    (104, 0)
    """
    if m <= 0:
        raise ValueError(f"modulus must be positive, got {m}")
    return (d // m) * m


def round_nearest(d: int, m: int) -> int:
    """Nearest multiple of ``m`` (ties go up), never below ``m``.

    >>> round_nearest(107, 8), round_nearest(100, 8), round_nearest(3, 8)
    (104, 104, 8)
    """
    lo, hi = round_down(d, m), round_up(d, m)
    best = hi if (hi - d) <= (d - lo) else lo
    return max(best, m)


def pow2_class(d: int, cap: int = 128) -> int:
    """Largest power of two dividing ``d``, capped at ``cap`` (the alignment class).

    >>> pow2_class(107), pow2_class(112), pow2_class(1024), pow2_class(96, cap=16)
    (1, 16, 128, 16)
    """
    if d <= 0:
        return cap
    c = 1
    while c < cap and d % (2 * c) == 0:
        c *= 2
    return c


def next_pow2(n: int, lo: int = 16) -> int:
    """The smallest power of two >= ``n``, at least ``lo`` (a kernel's padded tile of ``n`` columns or rows).

    >>> next_pow2(7), next_pow2(232), next_pow2(256), next_pow2(3, lo=2)
    (16, 256, 256, 4)
    """
    return max(lo, 1 << (int(n) - 1).bit_length())


def is_aligned(d: int, m: int) -> bool:
    """``d`` is a positive multiple of ``m``.

    >>> is_aligned(112, 16), is_aligned(120, 16)
    (True, False)
    """
    return d > 0 and d % m == 0


def aligned_candidates(d: int, m: int, lo: int = 1, hi: int | None = None, window: int = 4) -> list[int]:
    """Multiples of ``m`` around ``d``: ``window`` below and ``window`` above, clipped to [lo, hi].

    >>> aligned_candidates(107, 8, window=2)
    [96, 104, 112, 120]
    >>> aligned_candidates(10, 8, lo=1, hi=20, window=3)
    [8, 16]
    """
    base = round_down(d, m)
    out = []
    for k in range(-window + 1, window + 1):
        c = base + k * m
        if c >= max(lo, 1) and (hi is None or c <= hi) and c > 0:
            out.append(c)
    return sorted(set(out))


def vector_align(*values: int) -> int:
    """The largest of 8, 4, 2, 1 that divides every value (element counts: sizes, offsets, row strides).

    Triton proves a runtime integer a multiple of 16 or nothing, so a ``K`` of ``8 mod 16`` (1736, 2872,
    1512: gac's multiples of 8) left every load of the weight a scalar 2-byte one, not pipelined
    (``ld.global.b16`` against ``cp.async`` of 16 bytes in the PTX for ``sm_90``), and those shapes ran at
    half the bandwidth of their neighbours at 16 rows.  The kernels here and in
    :mod:`gac.kernels.latent_attention` (and :mod:`gac.kernels.gemv`) take such values divided by this and multiply them back, which
    the compiler reads as "a multiple of it".

    >>> vector_align(1736, 1736, 1736), vector_align(4096, 4096), vector_align(1037, 4096), vector_align(0, 244)
    (8, 8, 1, 4)
    """
    a = 8
    while a > 1 and any(int(v) % a for v in values):
        a //= 2
    return a
