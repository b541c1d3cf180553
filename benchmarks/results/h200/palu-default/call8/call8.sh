#!/bin/bash
# session 2026-11-28d, call 4 (the eighth H200 call of issue 34; committed as call8.sh): plans/palu-capacity.toml with key ranks on the
# kernel's 64-rank tile. The dense cell on GPU 0 and the PaLU cell on GPU 1 of one two-H200 host, at once: the
# session's device time left no room for both on one GPU.
export PYTHONPATH=src PYTHONUNBUFFERED=1 OMP_NUM_THREADS=8
R=/tmp/h200d4; rm -rf $R; mkdir -p $R
nvidia-smi --query-gpu=index,name,uuid,clocks.sm,temperature.gpu,memory.used,memory.total --format=csv > $R/gpu.txt; cat $R/gpu.txt
grep -q "H200" $R/gpu.txt || { echo "not an H200 host"; exit 3; }
python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)" >> $R/gpu.txt
for i in 0 1; do mkdir -p /tmp/gc$i; cp -r .gaccache/. /tmp/gc$i/; done
lane() { local i=$1; local t=$2; shift; shift; ( export CUDA_VISIBLE_DEVICES=$i GAC_CACHE=/tmp/gc$i; timeout $t bash -c "$*" ) > $R/lane$i.log 2>&1; echo "lane $i rc $?" >> $R/lane$i.log; }
lane 0 370 "python3 -m gac run plans/palu-capacity.toml --out $R/cap0 --only 'shape-llama3-8b-8/base*'" &
lane 1 370 "python3 -m gac run plans/palu-capacity.toml --out $R/cap1 --only 'shape-llama3-8b-8/palu*'" &
wait
tar -czf $OUT/results.tgz -C /tmp h200d4
for f in $R/lane*.log; do echo "== $f"; tail -n 4 $f | cut -c1-300; done
