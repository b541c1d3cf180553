#!/usr/bin/env bash
# GPU hardware measurements for gac (issue 2 and issue 3 item 6), run from the repo root:
#   bash benchmarks/tools/gpu_hardware.sh [OUTDIR]
# Writes, under OUTDIR/<gpu slug>/: the full and --quick profiles (bf16, fp16) with their timings,
# raw JSONL points and plots, `gac bench --experiment all` (bf16) and repair_kernels (fp16).
# Regenerates benchmarks/results/<gpu>/ (profile-*, *-bfloat16.*; README and docs/hardware.md) and the
# measured curves behind src/gac/profiles/<gpu>-*.json.
# After each step everything is re-packed into OUTDIR.tgz, so a run cut short keeps what it measured.
set -uo pipefail
export PYTHONUNBUFFERED=1 GAC_NO_PROGRESS=1 MPLBACKEND=Agg PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH}
OUTDIR=${1:-gpu_results}
STEPS=${GAC_STEPS:-"profile_bf16 quick_bf16 bench_all_bf16 profile_fp16 quick_fp16 repair_fp16"}
SLUG=$(python3 -c 'from gac.hardware.timing import gpu_slug; print(gpu_slug())')
RES="$OUTDIR/$SLUG"
mkdir -p "$RES"
python3 -c 'import json; from gac.hardware.timing import environment; print(json.dumps(environment()))' | tee "$RES/environment.json"
pack() { tar czf "$OUTDIR.tgz" -C "$(dirname "$OUTDIR")" "$(basename "$OUTDIR")"; }
run() { echo "== $*"; /usr/bin/time -f "wall %e s" "$@"; echo "rc=$?"; pack; }
for step in $STEPS; do
  case $step in
    profile_bf16) run python3 -m gac profile --dtype bfloat16 --out "$RES/$SLUG-bfloat16.json" --raw-dir "$RES" ;;
    quick_bf16) run python3 -m gac profile --quick --dtype bfloat16 --out "$RES/$SLUG-bfloat16-quick.json" --raw-dir "$RES" ;;
    bench_all_bf16) run python3 -m gac bench --experiment all --dtype bfloat16 --out "$RES" ;;
    profile_fp16) run python3 -m gac profile --dtype float16 --out "$RES/$SLUG-float16.json" --raw-dir "$RES" ;;
    quick_fp16) run python3 -m gac profile --quick --dtype float16 --out "$RES/$SLUG-float16-quick.json" --raw-dir "$RES" ;;
    repair_fp16) run python3 -m gac bench --experiment repair_kernels --dtype float16 --out "$RES" ;;
    *) echo "unknown step $step"; exit 2 ;;
  esac
done
ls -la "$RES"
