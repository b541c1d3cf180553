#!/bin/bash
# session 2026-11-28h, call 2 (the twenty-second H200 call of issue 34; committed as call22.sh) on one H200.
# gac_sdpa's "auto" now attends with the two batched GEMMs up to 2^24 cached slots (MATMUL_MAX_SLOTS, from call 21).
# 1. The GEMMs alone in a fresh process at Llama B128 x KV 32768 (2^25 slots), where call 21's run of them, after
#    its SDPA run in the same process, ran out of memory; and at B64 x 32768 (2^24), with peak memory.
# 2. The Llama-3-8B pair of plans/palu-default.toml (dense then PaLU) under the new rule, and its report.
export PYTHONPATH=src PYTHONUNBUFFERED=1 OMP_NUM_THREADS=8 CUDA_VISIBLE_DEVICES=0
R=/tmp/h200h2; rm -rf $R; mkdir -p $R
nvidia-smi --query-gpu=index,name,uuid,clocks.sm,temperature.gpu --format=csv > $R/gpu.txt; cat $R/gpu.txt
grep -q "H200" $R/gpu.txt || { echo "not an H200 host"; exit 3; }
python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)" >> $R/gpu.txt
mkdir -p /tmp/gc0; cp -r .gaccache/. /tmp/gc0/; export GAC_CACHE=/tmp/gc0
C=benchmarks/results/h200/palu-default/call11
timeout 110 python3 benchmarks/experiments/gpu_decode_attention.py $C/llama/cells/shape-llama3-8b-8/base.json \
  --batches 64,128 --kv 32768 --modes matmul --out $R/decode_attention_matmul_fresh.json > $R/diag.log 2>&1
echo "diag rc $?" >> $R/diag.log
G="python3 -m gac"
timeout 450 bash -c "$G run plans/palu-default.toml --out $R/llama --only 'shape-llama3-8b-8/base*' && $G run plans/palu-default.toml --out $R/llama --only 'shape-llama3-8b-8/palu*' && $G report $R/llama > $R/llama_report.txt 2>&1" > $R/lane0.log 2>&1
echo "lane 0 rc $?" >> $R/lane0.log
tar -czf $OUT/results.tgz -C /tmp h200h2
grep -v Warning $R/diag.log | grep "^matmul\|rc" | cut -c1-400
tail -n 3 $R/lane0.log | cut -c1-300
tail -n 40 $R/llama_report.txt
