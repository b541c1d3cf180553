"""Moved to :mod:`gac.nn` (``FactorizedLinear``, ``replace_module``, ``get_submodule_parent``).

Kept as a re-export so code written against the old path (saved scripts, the PaLU modules until
they move) still imports.
"""

from gac.nn.factorized import FactorizedLinear
from gac.nn.tree import get_submodule_parent, replace_module

__all__ = ["FactorizedLinear", "get_submodule_parent", "replace_module"]
