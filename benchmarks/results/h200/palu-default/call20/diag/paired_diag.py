"""bf16 paired vs unpaired error against float64 over head_dim, warps, program heads (diagnosis of call 20's failure)."""
import itertools, json, os, sys
import torch
import gac.kernels.latent_attention as kl
from gac.testing import latent_decode_inputs

out = []
for hd, nw, (h, sub), bt, dt in itertools.product((32, 64, 128), (4, 8), ((28, 2), (16, 0)), (128, 16), (torch.bfloat16,)):
    if bt == 16 and nw == 8:
        continue
    if bt == 128 and nw == 4 and sub == 0:  # a whole group of 4 in 4 warps at 128-token tiles: illegal access, both ways
        continue
    kvh, gk = 4, 4
    rk, rv = 40 * hd // 32, 48 * hd // 32
    q, zk, zv, pack, inv = latent_decode_inputs(1, h, kvh, hd, 300, gk, gk, [rk], [rv], bias=True, dtype=dt, device="cuda", seed=3)
    ref = kl.reference_latent_decode(q, zk, zv, pack, 290, inv, hd**-0.5)
    n = torch.tensor([290], device="cuda")
    row = {"hd": hd, "warps": nw, "heads": h, "sub": sub, "block_t": bt, "dtype": str(dt)}
    for paired in (True, False):
        kl.PAIRED_KEYS = paired
        kl._ENV = f"{bt},16,{nw},1,2,1,0,{sub}"
        try:
            o = kl.latent_decode_attention(q, zk, zv, pack, n, inv, hd**-0.5)
            got = torch.cat([x.double() for x in o], 1)
            row["paired" if paired else "unpaired"] = ((got - ref).norm() / ref.norm()).item()
            row["ran_paired" if paired else "ran_unpaired"] = kl.LAST_LAUNCH.get("paired_keys")
        except Exception as e:  # noqa: BLE001
            row["paired" if paired else "unpaired"] = "error: " + str(e)[:150]
    print(row, flush=True)
    out.append(row)
json.dump(out, open(os.path.join(os.environ.get("OUT", "."), "paired_diag.json"), "w"), indent=1)
