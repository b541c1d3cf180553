"""Decode-speed module transforms: horizontal fusion (pure PyTorch) and a fused Triton low-rank GEMV."""

from gac.kernels.fusion import FusedInputProjection, FusedSlice, fuse_projections_, unfuse_projections_

__all__ = ["FusedInputProjection", "FusedSlice", "fuse_projections_", "unfuse_projections_"]
