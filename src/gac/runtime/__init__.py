"""The fast path's runtime: the switches users flip (:class:`FastPath`), declared once, and the dispatches
that put the measured kernels into a model (:mod:`gac.runtime.dispatch`, one subclass per kernel:
:mod:`gac.runtime.gemv`, :mod:`gac.runtime.lowrank_fused`, :mod:`gac.runtime.branches`), and the
compiled step that the inference sweep and ``gac generate`` share (:mod:`gac.runtime.step`)."""

from gac.runtime.fastpath import FastPath

__all__ = ["FastPath"]
