#!/bin/bash
# session 2026-11-28e, call 1 (the ninth H200 call of issue 34; committed as call9.sh) on two H200s.
# GPU 0: the capacity plan's dense cell with the closing search; the H200 latent_attention class re-timed with keys
#        and values apart (gac profile's split calls, never run on a GPU before); Qwen key-group-4 launches swept.
# GPU 1: the capacity plan's PaLU cell (key group 4, tile ranks) with the closing search.
export PYTHONPATH=src PYTHONUNBUFFERED=1 OMP_NUM_THREADS=8
R=/tmp/h200e1; rm -rf $R; mkdir -p $R
nvidia-smi --query-gpu=index,name,uuid,clocks.sm,temperature.gpu,memory.used,memory.total --format=csv > $R/gpu.txt; cat $R/gpu.txt
grep -q "H200" $R/gpu.txt || { echo "not an H200 host"; exit 3; }
python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)" >> $R/gpu.txt
git rev-parse HEAD >> $R/gpu.txt 2>/dev/null
for i in 0 1; do mkdir -p /tmp/gc$i; cp -r .gaccache/. /tmp/gc$i/; done
G="python3 -m gac"
lane() { local i=$1; local t=$2; shift; shift; ( export CUDA_VISIBLE_DEVICES=$i GAC_CACHE=/tmp/gc$i; timeout $t bash -c "$*" ) > $R/lane$i.log 2>&1; echo "lane $i rc $?" >> $R/lane$i.log; }
CFGS="128,64,8,2,2,1,0,2;128,64,8,2,2,2,0,2;128,64,8,3,2,1,0,2;128,128,8,2,2,1,0,2;64,64,4,2,2,1,0,2;64,64,8,2,2,1,0,2;128,64,8,2,2,1,0,1;128,64,8,2,2,4,0,4;128,64,8,2,1,1,0,2;128,64,8,2,4,1,0,2"
L0="$G run plans/palu-capacity.toml --out $R/cap0 --only 'shape-llama3-8b-8/base*'; echo cap0 rc \$?;"
L0="$L0 timeout 150 python3 benchmarks/tools/gpu_launch_constants.py --fields latent_attention --profile src/gac/profiles/h200-bfloat16.json --out $R/h200-bfloat16-class.json > $R/class.log 2>&1; echo class rc \$? >> $R/class.log;"
L0="$L0 timeout 200 python3 benchmarks/tools/gpu_latent_kernel.py --models qwen2.5-7b --groups 4 --batches 16,64 --lengths 4096,32768 --rank-k 128 --rank-v 384 --configs '$CFGS' --budget-s 185 --out $R/qwen_launch.json > $R/qwen_launch.log 2>&1; echo sweep rc \$? >> $R/qwen_launch.log"
lane 0 560 "$L0" &
lane 1 560 "$G run plans/palu-capacity.toml --out $R/cap1 --only 'shape-llama3-8b-8/palu*'" &
wait
tar -czf $OUT/results.tgz -C /tmp h200e1
for f in $R/lane*.log; do echo "== $f"; tail -n 6 $f | cut -c1-300; done
tail -n 5 $R/class.log; tail -n 50 $R/qwen_launch.log | cut -c1-200
