"""Both stages of a factorized site in one launch (``gac::lowrank_fused``) against the existing path.

For the Llama-3-8B SVD-LLM (15%, ``--align gac``) site shapes, at 1 and 16 token rows, bf16:

* ``existing``: what the default decode path issues today, cuBLAS: ``x Vᵀ`` then ``t Uᵀ`` (for the
  fused q/k/v and gate/up groups: the concatenated first stage, then each member's ``u``);
* ``dense``: the dense layers the site replaces (one GEMV per member), for context;
* every configuration of the fused kernel (:data:`gac.kernels.lowrank_fused.CONFIGS`), one launch
  with the grid barrier.

Each is timed as 64 calls in a CUDA graph over weights rotated past L2; 15 replays give the median
and quartiles per call (µs).  Each fused configuration first runs once, alone, under a deadline
(event polling: a launch that does not finish in ``--hang-s`` writes the partial results and ends
the process, which kills the kernel); its barrier counters must read zero afterwards and its
result must match float64.  A configuration that fails to compile or check is recorded, not fatal.
Past ``--limit-s`` the remaining configurations are skipped (recorded).

  PYTHONPATH=src python3 benchmarks/tools/gpu_lowrank_fused.py --out $OUT/lowrank_fused.json [--models llama qwen] [--rows 1]

Regenerates ``benchmarks/results/h200/lowrank_rows/`` and the fused low-rank kernel tables of ``h200/decode-diag/`` (docs/eval.md: the one-launch low-rank kernel).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

from gac.hardware.dispatch_table import row_class
from gac.hardware.timing import copies_past_l2, graph_timings

# per model shape: (name, in features, per member (rank, out)) at the SVD-LLM (15%, --align gac)
# ranks of benchmarks/results/h200/speed/cells/shape-llama3-8b-8/svd-llm-r0.85-gac.json and
# speed-gemv/cells/shape-qwen2.5-7b-8/svd-llm-r0.85-gac.json
MODELS = {
    "llama": [
        ("o_proj", 4096, [(1736, 4096)]),
        ("down_proj", 14336, [(2712, 4096)]),
        ("qkv", 4096, [(1736, 4096), (704, 1024), (704, 1024)]),
        ("gate_up", 4096, [(2704, 14336), (2704, 14336)]),
    ],
    "qwen": [
        ("o_proj", 3584, [(1520, 3584)]),
        ("down_proj", 18944, [(2560, 3584)]),
        ("qkv", 3584, [(1520, 3584), (384, 512), (384, 512)]),
        ("gate_up", 3584, [(2560, 18944), (2560, 18944)]),
    ],
}
SITES = MODELS["llama"]
COPY_GBPS = 4490.0  # measured H200 GEMV bandwidth, benchmarks/results/h200/decode-diag/


def bench(fn, wait, reps: int = 64, samples: int = 15) -> dict[str, float]:
    """Quartiles of µs per call of ``fn(i)`` captured ``reps`` times in a CUDA graph.

    ``wait(what)`` waits for the GPU (under the deadline: never a blocking synchronize).
    """
    ts = graph_timings(fn, reps, samples, wait)
    q = lambda f: ts[min(len(ts) - 1, round(f * (len(ts) - 1)))]  # noqa: E731
    return {"q25": q(0.25), "median": q(0.5), "q75": q(0.75)}


class Deadline:
    """Wait for the GPU with a deadline; past it, save what we have and end the process."""

    def __init__(self, out: Path, res: dict, hang_s: float) -> None:
        self.out, self.res, self.hang_s = out, res, hang_s

    def wait(self, what: str) -> None:
        ev = torch.cuda.Event()
        ev.record()
        t0 = time.perf_counter()
        while not ev.query():
            if time.perf_counter() - t0 > self.hang_s:  # the spin is bounded: this should never happen
                self.res["hung"] = f"{what}: not finished after {self.hang_s} s; process ended"
                save(self.out, self.res)
                print(self.res["hung"], flush=True)
                os._exit(3)  # a stuck kernel dies with the process's context
            time.sleep(0.0002)


def save(out: Path, res: dict) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1))


def spin_bound_check(dev: torch.device, deadline: Deadline) -> str:
    """An arrive count that can never reach P: every program must give up, flag it and reset (ms)."""
    from gac.kernels import lowrank_fused as L

    spin = L.MAX_SPIN
    L.MAX_SPIN = 4096
    try:
        x = torch.randn(1, 256, device=dev, dtype=torch.half)
        v = torch.randn(64, 256, device=dev, dtype=torch.half)
        u = torch.randn(128, 64, device=dev, dtype=torch.half)
        y = torch.empty(1, 128, device=dev, dtype=torch.half)
        counters = torch.tensor([-(10**6), 0, 0, 0], dtype=torch.int32, device=dev)
        t0 = time.perf_counter()
        L._launch(x, v, None, [u], [None], [64], [128], y, counters, L.CONFIGS[1][0])
        deadline.wait("spin bound check")
        got = counters.tolist()
        ok = "ok" if got == [0, 0, 1, 0] else "UNEXPECTED"
        return f"{ok}: counters {got} (want [0, 0, 1, 0]) in {time.perf_counter() - t0:.2f} s with compile"
    except Exception as e:  # noqa: BLE001 - recorded
        return f"failed: {type(e).__name__}: {e}"
    finally:
        L.MAX_SPIN = spin


def run_site(name, k, members, rows, dtype, dev, res, deadline, t_end, margin) -> dict:  # noqa: ANN001
    from gac.kernels import lowrank_fused as L

    splits = [r for r, _ in members]
    outs = [n for _, n in members]
    su = L.site_setup(k, splits, outs, rows, dtype, dev, l2_bytes=160 * 2**20)
    ws, copies, x, nbytes, existing = su.ws, su.copies, su.x, su.nbytes, su.existing
    esize = torch.tensor([], dtype=dtype).element_size()
    dense_bytes = esize * k * sum(outs)
    ys = [torch.empty(rows, n, device=dev, dtype=dtype) for n in outs]

    rec: dict = {"site": name, "rows": rows, "k": k, "members": members, "bytes": nbytes,
                 "bytes_ideal_us": nbytes / COPY_GBPS / 1e3, "launches_existing": 1 + len(members)}  # fmt: skip
    rec["existing_us"] = bench(existing, deadline.wait)
    # the dense layers this site replaces (context): one GEMV per member, copies rotated past L2
    dcopies = copies_past_l2(dense_bytes, 160 * 2**20, most=16)
    dws = [[torch.randn(n, k, device=dev, dtype=dtype) for n in outs] for _ in range(dcopies)]
    rec["dense_us"] = bench(
        lambda i: [torch.mm(x, w.t(), out=ys[j]) for j, w in enumerate(dws[i % dcopies])], deadline.wait
    )
    dws.clear()
    v0, us0 = ws[0]
    ref = su.ref
    y = torch.empty(rows, sum(outs), device=dev, dtype=dtype)
    counters = L.new_counters(dev)
    nones = [None] * len(members)
    rec["configs"] = []
    for cfg in L.CONFIGS[row_class(rows, L.CONFIGS)]:
        c: dict = {"config": list(cfg)}
        rec["configs"].append(c)
        if time.perf_counter() > t_end:
            c["status"] = "skipped: --limit-s reached"
            continue
        try:
            t0 = time.perf_counter()
            c["programs"] = L._launch(x, v0, None, us0, nones, splits, outs, y, counters, cfg)
            deadline.wait(f"{name}@{rows} {list(cfg)} first launch")
            c["first_launch_s"] = time.perf_counter() - t0  # compile included
            cnt = counters.tolist()
            c["rel_err"] = ((y.double() - ref).norm() / ref.norm()).item()
            if cnt[:3] != [0, 0, 0]:
                c["status"] = f"barrier counters {cnt} after one launch (timed out or not reset)"
                counters.zero_()
                continue
            if not c["rel_err"] < 2e-2:
                c["status"] = "wrong result"
                continue
            c["us"] = bench(
                lambda i, cfg=cfg: L._launch(
                    x, ws[i % copies][0], None, ws[i % copies][1], nones, splits, outs, y, counters, cfg
                ),
                lambda what, cfg=cfg: deadline.wait(f"{name}@{rows} {list(cfg)} {what}"),
            )
            cnt = counters.tolist()
            c["status"] = "ok" if cnt[:3] == [0, 0, 0] else f"counters {cnt} after graph replays"
        except Exception as e:  # noqa: BLE001 - record and go on
            c["status"] = f"failed: {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
            counters.zero_()
    ok = [c for c in rec["configs"] if c.get("status") == "ok"]
    if ok:
        best = min(ok, key=lambda c: c["us"]["median"])
        rec["best"] = {"config": best["config"], "programs": best["programs"], "us": best["us"]}
        rec["speedup_vs_existing"] = rec["existing_us"]["median"] / best["us"]["median"]
        rec["use"] = best["us"]["median"] < margin * rec["existing_us"]["median"]
    ws.clear()
    torch.cuda.empty_cache()
    return rec


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--limit-s", type=float, default=100.0, help="skip remaining configurations past this")
    ap.add_argument("--hang-s", type=float, default=20.0, help="one launch longer than this ends the run")
    ap.add_argument("--margin", type=float, default=0.97)
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--models", nargs="+", choices=sorted(MODELS), default=["llama"])
    a = ap.parse_args()
    from gac.hardware.timing import environment

    if not torch.cuda.is_available():
        print("needs CUDA", file=sys.stderr)
        return 2
    dev = torch.device("cuda")
    dtype = torch.bfloat16
    t_start = time.perf_counter()
    res: dict = {"schema": "gac.lowrank-fused/1", "command": " ".join([sys.executable, *sys.argv]),
                 "env": environment(dev, dtype), "copy_gbps_assumed": COPY_GBPS, "sites": []}  # fmt: skip
    import triton

    from gac.kernels import lowrank_fused as L

    res["env"]["triton"] = triton.__version__
    res["max_spin"] = L.MAX_SPIN
    deadline = Deadline(a.out, res, a.hang_s)
    save(a.out, res)
    res["spin_bound_check"] = spin_bound_check(dev, deadline)
    save(a.out, res)
    print("spin bound check:", res["spin_bound_check"], flush=True)
    sites = [
        (f"{m}:{name}" if len(a.models) > 1 else name, k, mem) for m in a.models for name, k, mem in MODELS[m]
    ]
    for name, k, members in sites:
        for rows in a.rows:
            rec = run_site(name, k, members, rows, dtype, dev, res, deadline, t_start + a.limit_s, a.margin)
            res["sites"].append(rec)
            save(a.out, res)
            best = rec.get("best")
            print(
                f"{name:9s} rows {rows:2d}: existing {rec['existing_us']['median']:7.2f} µs "
                f"({rec['launches_existing']} launches), dense {rec['dense_us']['median']:7.2f}, "
                f"bytes ideal {rec['bytes_ideal_us']:6.2f}, fused "
                + (f"{best['us']['median']:7.2f} µs {best['config']} P={best['programs']} "
                   f"x{rec['speedup_vs_existing']:.2f}" if best else "none ok"),
                flush=True,
            )  # fmt: skip
    # per decode step of a 32-layer model: every site of a model once per layer
    for m in a.models:
        for rows in a.rows:
            recs = [
                r
                for r in res["sites"]
                if r["rows"] == rows and (len(a.models) == 1 or r["site"].startswith(m + ":"))
            ]
            ex = sum(r["existing_us"]["median"] for r in recs)
            fu = sum(min(r["existing_us"]["median"], r["best"]["us"]["median"]) if "best" in r else
                     r["existing_us"]["median"] for r in recs)  # fmt: skip
            key = str(rows) if len(a.models) == 1 else f"{m}@{rows}"
            res.setdefault("per_step_32_layers_ms", {})[key] = {
                "existing": 32 * ex / 1e3, "with_fused_where_faster": 32 * fu / 1e3,
            }  # fmt: skip
    res["wall_s"] = time.perf_counter() - t_start
    save(a.out, res)
    print(json.dumps(res["per_step_32_layers_ms"]), f"wall {res['wall_s']:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
