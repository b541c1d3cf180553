"""gac: GPU-Aligned Compression.

Measure a GPU's shape penalties (a *profile*), check a model's dimensions against it,
repair them exactly by zero-padding, and compress under a parameter budget with
aligned dimensions.
"""

from __future__ import annotations

__version__ = "0.1.0"

from gac.errors import GacError

__all__ = ["GacError", "__version__"]
