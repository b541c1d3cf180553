"""The fast path's runtime: the switches users flip (:class:`FastPath`), declared once."""

from gac.runtime.fastpath import FastPath

__all__ = ["FastPath"]
