"""gpu_latent_kernel.py with latent_attention.VALUE_T_TILE at 64: 64-token tiles accumulate P·Z_v transposed, their
value latents through the tensor descriptor (an experiment: the shipped kernel keeps 128, see VALUE_T_TILE)."""
import runpy
import sys

import triton.language as tl

from gac.kernels import latent_attention as kl

kl.VALUE_T_TILE = 64
kl._VT_TILE = tl.constexpr(64)
sys.argv = ["gpu_latent_kernel.py", *sys.argv[1:]]
runpy.run_path("benchmarks/tools/gpu_latent_kernel.py", run_name="__main__")
