#!/bin/bash
# session 2026-11-28b call 4 (issue 34): the Llama-3-8B pair of plans/palu-default.toml on the final kernel tree
# (run 14's Llama cells ran on f7d2aba, whose raw-key first layer launched without the turned queries)
export PYTHONPATH=src PYTHONUNBUFFERED=1 OMP_NUM_THREADS=8
R=/tmp/res44; mkdir -p $R
nvidia-smi -L > $R/gpu.txt; git log -1 --format=%H > $R/tree.txt 2>/dev/null; git status --short >> $R/tree.txt
mkdir -p /tmp/gc0; cp -r .gaccache/. /tmp/gc0/; export GAC_CACHE=/tmp/gc0
G="python3 -m gac"; P=plans/palu-default.toml
timeout 560 bash -c "$G run $P --out $R/llama --only 'shape-llama3-8b-8/base*' && $G run $P --out $R/llama --only 'shape-llama3-8b-8/palu*' && $G report $R/llama" > $R/llama.log 2>&1; echo "rc $?" >> $R/llama.log
tar -czf $OUT/results.tgz -C /tmp res44
tail -4 $R/llama.log
