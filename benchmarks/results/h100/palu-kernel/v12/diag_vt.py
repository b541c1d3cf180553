"""Which GPU test case crashed in call 41 (V_T and the value descriptor at 64-token tiles, bf16): the GPU test's
cases in order, with VALUE_T_TILE patched back to 64 (argv[1] == "nodesc": no value descriptor either)."""
import sys

import torch
import triton.language as tl

sys.path.insert(0, "tests/kernels")
sys.path.insert(0, ".")
from tests.kernels.test_latent_decode import CASES, KERNEL_SCRIPT  # noqa: E402

ns: dict = {}
exec(KERNEL_SCRIPT, ns)
kl = ns["kl"]
kl.VALUE_T_TILE = 64
kl._VT_TILE = tl.constexpr(64)
if len(sys.argv) > 1 and sys.argv[1] == "nodesc":
    kl.value_descriptor = lambda *a, **k: None
big = [(3, 32, 8, 128, g, 4, 1100, 1037, False, False, "64,64,4,2,0") for g in (1, 2, 4)]
big += [(2, 28, 4, 128, g, 2, 700, 689, True, g == 2, "32,64,4,2,0") for g in (1, 2, 4)]
big += [(3, 32, 8, 128, 4, 4, 1100, 1037, False, False, "64,128,8,3,0,2,1")]
big += [(2, 28, 4, 128, 4, 2, 700, 689, True, True, "64,128,8,2,0,2,1")]
big += [(3, 32, 8, 128, 4, 4, 1100, 1037, False, False, f"32,{br},4,2,0,2,0,{sub}") for br, sub in ((64, 2), (256, 1))]
big += [(1, 28, 4, 128, 4, 4, 700, 689, True, True, "32,64,4,3,0,2,0,1")]
big += [(1, 32, 8, 128, 1, 2, 32800, 32768, False, False, "32,64,4,3,1")]
big += [(3, 32, 8, 128, 4, 4, 1100, 1037, False, False, "64,64,4,2,0", True)]
big += [(2, 28, 4, 128, 4, 4, 700, 689, True, False, "64,64,4,2,0,2,0,1", True)]
big += [(1, 8, 4, 128, 4, 4, 70, 65, True, False, "64,16,4,1,2", False, ([64], [296]))]
big += [(1, 28, 4, 32, 4, 4, 140, 130, True, False, "64,16,4,1,2,1,0,2", False, ([40], [48]))]
big += [(2, 8, 4, 32, 2, 4, 75, 70, False, True, "64,16,4,1,2", False, ([16, 24], [40]))]
ns["run"](CASES + big, "cuda", torch.bfloat16, 2e-2, 7)
torch.cuda.synchronize()
print("no crash", flush=True)
