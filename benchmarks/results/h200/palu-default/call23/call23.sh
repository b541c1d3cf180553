#!/bin/bash
# session 2026-11-28h, call 3 (the twenty-third H200 call of issue 34; committed as call23.sh) on one H200.
# gac_sdpa's "auto" now attends with the two batched GEMMs up to 2^24 cached slots (MATMUL_MAX_SLOTS, from call 21).
# The Qwen2.5-7B pair of plans/palu-default.toml (dense then PaLU) under the new rule, and its report.
export PYTHONPATH=src PYTHONUNBUFFERED=1 OMP_NUM_THREADS=8 CUDA_VISIBLE_DEVICES=0
R=/tmp/h200h3; rm -rf $R; mkdir -p $R
nvidia-smi --query-gpu=index,name,uuid,clocks.sm,temperature.gpu --format=csv > $R/gpu.txt; cat $R/gpu.txt
grep -q "H200" $R/gpu.txt || { echo "not an H200 host"; exit 3; }
python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)" >> $R/gpu.txt
mkdir -p /tmp/gc0; cp -r .gaccache/. /tmp/gc0/; export GAC_CACHE=/tmp/gc0
G="python3 -m gac"
timeout 450 bash -c "$G run plans/palu-default.toml --out $R/qwen --only 'shape-qwen2.5-7b-8/base*' && $G run plans/palu-default.toml --out $R/qwen --only 'shape-qwen2.5-7b-8/palu*' && $G report $R/qwen > $R/qwen_report.txt 2>&1" > $R/lane0.log 2>&1
echo "lane 0 rc $?" >> $R/lane0.log
tar -czf $OUT/results.tgz -C /tmp h200h3
tail -n 3 $R/lane0.log | cut -c1-300
tail -n 40 $R/qwen_report.txt
