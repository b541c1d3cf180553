# one Gluon and one Triton launch of the latent kernel at Llama-3-8B B=64 x 32k, key/value rank 128/232 (for ncu)
import importlib.util
import torch
import gac.kernels.latent_attention as kl
from gac.testing import latent_decode_inputs
spec = importlib.util.spec_from_file_location("lg", "benchmarks/experiments/latent_gluon.py")
lg = importlib.util.module_from_spec(spec); spec.loader.exec_module(lg)
q, zk, zv, pack, inv = latent_decode_inputs(64, 32, 8, 128, 32768, 4, 4, [128, 128], [232, 232], dtype=torch.bfloat16,
                                            device="cuda", theta=500000.0)
n = torch.tensor([32768], device="cuda")
for k in ("gluon", "triton", "gluon", "triton"):
    if k == "gluon":
        print(lg.decode(q, zk, zv, pack, n, inv, 128**-0.5)[1])
    else:
        kl.latent_decode_attention(q, zk, zv, pack, n, inv, 128**-0.5)
torch.cuda.synchronize()
