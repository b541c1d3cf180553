"""The module types of compressed models, low in the house: they import nothing above them.

* :class:`FactorizedLinear`: ``y = u(v(x))``, the low-rank layer every factorizing compressor writes;
* :func:`replace_module` / :func:`get_submodule_parent`: swap a module by its fully qualified name;
* :mod:`gac.nn.latent`: PaLU's latent attention (``LatentProjection``, ``LatentAttention``,
  ``LatentCache``, the RoPE helpers), imported on its own (it imports transformers).
"""

from gac.nn.factorized import FactorizedLinear
from gac.nn.tree import get_submodule_parent, replace_module

__all__ = ["FactorizedLinear", "get_submodule_parent", "replace_module"]
