#!/bin/bash
# session 2026-11-28 call 3 (issue 34): the default path's PaLU cells with the queries turned by the tile start (v11),
# dense in the same lane; GPU kernel tests; ncu of the new key-group-4 row
export PYTHONPATH=src PYTHONUNBUFFERED=1 OMP_NUM_THREADS=4
R=/tmp/res33; mkdir -p $R
N=$(nvidia-smi -L | wc -l)
nvidia-smi -L > $R/gpu.txt; nvidia-smi --query-gpu=index,uuid,name,clocks.sm,temperature.gpu --format=csv >> $R/gpu.txt
git status --short > $R/tree.txt 2>/dev/null; git log -1 --format=%H >> $R/tree.txt 2>/dev/null
for i in $(seq 0 $((N-1))); do mkdir -p /tmp/gc$i; cp -r .gaccache/. /tmp/gc$i/; rm -f /tmp/gc$i/*dispatch*.json; done
G="python3 -m gac"
lane() { local i=$1; local t=$2; shift; shift; ( export CUDA_VISIBLE_DEVICES=$i GAC_CACHE=/tmp/gc$i; timeout $t bash -c "$*" ) > $R/lane$i.log 2>&1; echo "lane $i rc $?" >> $R/lane$i.log; }
P=plans/palu-default.toml; PC=plans/palu-capacity.toml
TESTS="python3 -m pytest tests/kernels/test_latent_decode.py tests/kernels/test_latent_launch.py -m gpu -p no:cacheprovider -q > $R/gpu_tests.txt 2>&1; tail -3 $R/gpu_tests.txt"
NCU="ncu --clock-control none --section LaunchStats --section Occupancy --section SpeedOfLight --section WarpStateStats --metrics sass__inst_executed_register_spilling,sass__inst_executed_local_loads -k regex:_latent_flash_kernel --launch-skip 2 --launch-count 1 --csv --page details python3 benchmarks/tools/gpu_latent_ncu.py --model llama3-8b --group 4 --batch 16 --kv 32768 > $R/ncu_llama_g4_b16.csv 2>&1"
lane 0 560 "$G run $P --out $R/llama --only 'shape-llama3-8b-8/base*' && $G run $P --out $R/llama --only 'shape-llama3-8b-8/palu*' && $G report $R/llama > $R/llama_report.txt 2>&1" &
if [ "$N" -ge 4 ]; then
  lane 1 560 "$G run $PC --out $R/capacity --only 'shape-llama3-8b-8/base*' && $G run $PC --out $R/capacity --only 'shape-llama3-8b-8/palu*' && $G report $R/capacity > $R/capacity_report.txt 2>&1" &
  lane 2 560 "$G run $P --out $R/qwen --only 'shape-qwen2.5-7b-8/base*' && $G run $P --out $R/qwen --only 'shape-qwen2.5-7b-8/palu*' && $G report $R/qwen > $R/qwen_report.txt 2>&1" &
  lane 3 560 "$TESTS; $NCU" &
else
  lane 1 560 "$TESTS; $NCU; $G run $PC --out $R/capacity --only 'shape-llama3-8b-8/base*' && $G run $PC --out $R/capacity --only 'shape-llama3-8b-8/palu*' && $G report $R/capacity > $R/capacity_report.txt 2>&1" &
fi
wait
tar -czf $OUT/results.tgz -C /tmp res33
for f in $R/lane*.log; do tail -n 6 $f | cut -c1-300; done
