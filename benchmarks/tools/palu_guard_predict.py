"""What the latency model predicts for PaLU at KV 0.5, by the guard's per-site sum and by the whole model.

CPU only, no weights: the model is a meta-device skeleton (``gac.hardware.latency.skeleton``), PaLU's sites
come from ``PaluCompressor.sites`` at each key group size, every group keeps half its dims (``G·head_dim/2``,
the uniform ranks of KV 0.5, not the Fisher search's), and the profile is a shipped one. Two predictions per
serving shape, each a speedup over dense:

* ``guard``: :func:`gac.allocation.serve_prediction` (the sites' ``site_ms``, with their cache share and key
  rebuild at decode, plus the dense model's launches outside the sites), what ``--align gac``'s guard compares;
* ``model``: :func:`gac.hardware.latency.predict` of the dense skeleton against the same skeleton with every
  attention a ``LatentAttention`` at those ranks (projections fused as the inference path fuses them).

Each record names how the profile priced the latent attention (its ``latent_attention`` class, else
``roofline (not profiled)``)::

    PYTHONPATH=src python benchmarks/tools/palu_guard_predict.py --profile h100-bfloat16 \\
        --out benchmarks/results/cpu/palu_guard_predict.json
"""

from __future__ import annotations

import argparse
import json
import sys

SERVE = (
    "decode:1,decode:16,decode:64,decode:1x16384,decode:16x16384,decode:64x16384,decode:64x32768,"
    "prefill:1x2048,prefill:8x2048"
)


def latent_skeleton(spec: str, group: int):
    """The skeleton of ``spec`` with every attention a LatentAttention keeping half of each group's dims."""
    import torch

    from gac.hardware.latency import skeleton
    from gac.models.adapters import get_adapter, model_rotary
    from gac.nn import replace_module
    from gac.nn.fused import fuse_projections_
    from gac.nn.latent import LatentAttention, LatentProjection

    m = skeleton(spec, fused=False)
    ad = get_adapter(m)
    rot = model_rotary(m)
    kvh, hd, heads, hid = ad.kv_heads, ad.head_dim, ad.heads, ad.hidden
    for i in range(ad.num_layers):
        a = m.get_submodule(ad.attention_fqn(i))
        bias = a.k_proj.bias is not None
        with torch.device("meta"):
            kp, vp = (LatentProjection(hid, [group * hd // 2] * (kvh // group), group * hd, bias=bias,
                                       dtype=torch.bfloat16) for _ in range(2))  # fmt: skip
        new = LatentAttention(a.q_proj, kp, vp, a.o_proj, heads, kvh, hd, i, m.config, a.scaling, rot)
        replace_module(m, ad.attention_fqn(i), new)
    fuse_projections_(m)
    return m


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="h100-bfloat16")
    ap.add_argument("--spec", default="shape:llama3-8b:8")
    ap.add_argument("--groups", default="1,2,4", help="key group sizes (KV heads per group)")
    ap.add_argument("--serve", default=SERVE)
    ap.add_argument("--out", default=None, help="a JSON of every prediction")
    args = ap.parse_args()

    from gac.allocation import serve_prediction
    from gac.api import outside_sites_ms
    from gac.compressors.palu import PaluCompressor
    from gac.errors import GacError
    from gac.guard import atomic_write_text
    from gac.hardware.latency import parse_serve, predict, skeleton
    from gac.hardware.profile import load_profile

    try:
        prof = load_profile(args.profile)
        serve = parse_serve(args.serve)
        groups = [int(g) for g in args.groups.split(",")]
    except (GacError, ValueError) as e:
        sys.exit(f"error: {e}")
    dense = skeleton(args.spec, fused=True)
    base = {p.key: predict(dense, prof, p)["ms"] for p in serve}
    rows = []
    for g in groups:
        sites = PaluCompressor(group_size=g).sites(skeleton(args.spec, fused=False))
        dims = {s.name: s.max_dim // 2 for s in sites}
        other = outside_sites_ms(skeleton(args.spec, fused=False), sites, prof, serve)
        guard = {r["point"]: r["speedup"] for r in serve_prediction(sites, dims, prof, serve, other)}
        lat = latent_skeleton(args.spec, g)
        for p in serve:
            pr = predict(lat, prof, p)
            rows.append({"group": g, "point": p.key, "guard": guard[p.key], "model": base[p.key] / pr["ms"],
                         "pricing": (pr.get("latent_attention") or {}).get("pricing")})  # fmt: skip
    print(f"{args.spec}, PaLU KV 0.5 (uniform ranks G·hd/2), profile {prof.id}: speedup over dense")
    print("| G | shape | guard (site sum) | whole model | latent attention priced by |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['group']} | {r['point']} | {r['guard']:.3f} | {r['model']:.3f} | {r['pricing'] or '-'} |"
        )
    if args.out:
        doc = {"command": "PYTHONPATH=src python " + " ".join(sys.argv), "profile": prof.id, "spec": args.spec,
               "rows": rows}  # fmt: skip
        atomic_write_text(args.out, json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
