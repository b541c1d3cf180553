"""Triton kernels of the decode path, their custom ops and their measurement (nothing that swaps modules).

The switches that put them into a model, where they were measured faster, are in :mod:`gac.runtime`.
"""
