#!/bin/bash
# session 2026-11-28e, call 4 (diagnosis, not a result): what the GPU holds when the Qwen2.5-7B shape's first decode
# point begins, dense and PaLU (plans/palu-default.toml's cells at fewer points), by allocating frames.
# As run, the two files of this folder sat in devrun/memdiag/ (an uncommitted scratch folder); the paths below are
# rewritten to this folder.
export PYTHONPATH=src PYTHONUNBUFFERED=1 OMP_NUM_THREADS=8
R=/tmp/h200e4; rm -rf $R; mkdir -p $R
nvidia-smi --query-gpu=index,name --format=csv > $R/gpu.txt
for i in 0 1; do mkdir -p /tmp/gc$i; cp -r .gaccache/. /tmp/gc$i/; done
lane() { local i=$1; shift; ( export CUDA_VISIBLE_DEVICES=$i GAC_CACHE=/tmp/gc$i PYTHONPATH=benchmarks/results/h200/palu-default/call12:src GAC_MEMDIAG=$R/mem$i.json; timeout 300 bash -c "$*" ) > $R/lane$i.log 2>&1; echo "lane $i rc $?" >> $R/lane$i.log; }
lane 0 "python3 -m gac run benchmarks/results/h200/palu-default/call12/memdiag.toml --out $R/run0 --only 'shape-qwen2.5-7b-8/base*'" &
lane 1 "python3 -m gac run benchmarks/results/h200/palu-default/call12/memdiag.toml --out $R/run1 --only 'shape-qwen2.5-7b-8/palu*'" &
wait
tar -czf $OUT/results.tgz -C /tmp h200e4
for f in $R/lane*.log; do echo "== $f"; tail -n 3 $f | cut -c1-200; done
ls -la $R
