"""The profile's ``latent_attention`` class is measured on the kernel the default decode path runs:
its measurement loop, run in Triton's CPU interpreter with a stand-in clock (the GPU timing is
``tests/hardware/test_latent_pricing.py``'s GPU test)."""

from __future__ import annotations

from .interp import needs_triton, run_interpreted


@needs_triton
def test_the_class_measurement_runs_the_decode_kernel_and_records_what_it_ran():
    run_interpreted(
        """
import torch
from gac.hardware.profiler import measure_latent_attention
from gac.kernels import latent_attention as kl

ran = []
times = iter([30.0, 50.0, 40.0, 90.0, 60.0, 200.0, 45.0])

def bench(fn):  # one real call of the kernel (interpreted), then a stand-in time
    out = fn(0)
    assert all(torch.isfinite(o).all() for o in out)
    ran.append(dict(kl.LAST_LAUNCH))
    return next(times)

shapes = [(1, 24, 1, 64), (2, 40, 1, 64), (1, 12, 2, 96), (2, 20, 2, 96), (1, 24, 2, 128), (2, 40, 2, 128),
          (1, 12, 2, 96, 36)]  # the last: values at their own rank (keys and values apart)
fit = measure_latent_attention(torch.device("cpu"), torch.float32, shapes=shapes, geometry=(4, 2, 32), bench=bench)
calls = fit["fit"]["calls"]
assert len(calls) == len(ran) == 7 and fit["fit"]["skipped_over_budget"] == 0
for (g, r, b, kv, *rest), c, launch in zip(shapes, calls, ran):
    rv = rest[0] if rest else r
    assert (c["key_group"], c["rank"], c["rank_v"], c["batch"], c["kv"]) == (g, r, rv, b, kv)
    assert c["bytes"] == b * kv * (2 // g) * (r + rv) * 4  # fp32 key and value latents
    assert c["block_r"] == launch["block_r"]
    assert c["rank_run"] % c["block_r"] == 0 and c["rank_run"] >= -(-r // 32) * 32
    assert c["flops"] == 2.0 * b * kv * 32 * 2 * c["rank_run"]
    assert c["gbps"] == round(c["bytes"] / c["us"] / 1e3, 1)
assert sorted(fit["groups"]) == ["1", "2"]
assert fit["groups"]["1"]["block_r"] == calls[0]["block_r"] and fit["groups"]["1"]["points"] == 4
try:
    measure_latent_attention(torch.device("cpu"), torch.float32)
    raise AssertionError("measured on the CPU without a stand-in clock")
except Exception as e:
    assert "CUDA only" in str(e)
print("ok")
"""
    )
