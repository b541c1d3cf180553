#!/bin/bash
# session 2026-11-28b call 1 (issue 34): the transposed-values / value-descriptor kernel (sub-2 programs for Qwen's
# 28-row key group): kernel alone against cc6c504's on the same GPU (value ranks 256 and 432), the profile's
# latent_attention class re-timed, the GPU kernel tests, and the default path's PaLU cells (dense in the same lane)
export PYTHONPATH=src PYTHONUNBUFFERED=1 OMP_NUM_THREADS=4
R=/tmp/res41; mkdir -p $R
N=$(nvidia-smi -L | wc -l)
nvidia-smi -L > $R/gpu.txt; nvidia-smi --query-gpu=index,uuid,name,clocks.sm,temperature.gpu --format=csv >> $R/gpu.txt
git status --short > $R/tree.txt 2>/dev/null; git log -1 --format=%H >> $R/tree.txt 2>/dev/null
for i in $(seq 0 $((N-1))); do mkdir -p /tmp/gc$i; cp -r .gaccache/. /tmp/gc$i/; rm -f /tmp/gc$i/*dispatch*.json; done
G="python3 -m gac"
lane() { local i=$1; local t=$2; shift; shift; ( export CUDA_VISIBLE_DEVICES=$i GAC_CACHE=/tmp/gc$i; timeout $t bash -c "$*" ) > $R/lane$i.log 2>&1; echo "lane $i rc $?" >> $R/lane$i.log; }
P=plans/palu-default.toml
K="python3 benchmarks/tools/gpu_latent_kernel.py --table --old devrun/latent_attention_head.py --models llama3-8b,qwen2.5-7b --groups 4 --batches 16,64 --lengths 4096,32768 --budget-s 110"
CLASS="python3 benchmarks/tools/gpu_launch_constants.py --fields latent_attention --profile src/gac/profiles/h100-bfloat16.json --out $R/h100-bfloat16.json > $R/latent_class.log 2>&1; echo class rc \$? >> $R/latent_class.log"
TESTS="python3 -m pytest tests/kernels/test_latent_decode.py tests/kernels/test_latent_launch.py -m gpu -p no:cacheprovider -q > $R/gpu_tests.txt 2>&1; tail -3 $R/gpu_tests.txt"
lane 0 560 "$K --out $R/table_rv256.json > $R/table_rv256.log 2>&1; $K --rank-v 432 --out $R/table_rv432.json > $R/table_rv432.log 2>&1; $CLASS" &
lane 1 560 "$TESTS" &
lane 2 560 "$G run $P --out $R/llama --only 'shape-llama3-8b-8/base*' && $G run $P --out $R/llama --only 'shape-llama3-8b-8/palu*' && $G report $R/llama > $R/llama_report.txt 2>&1" &
lane 3 560 "$G run $P --out $R/qwen --only 'shape-qwen2.5-7b-8/base*' && $G run $P --out $R/qwen --only 'shape-qwen2.5-7b-8/palu*' && $G report $R/qwen > $R/qwen_report.txt 2>&1" &
wait
tar -czf $OUT/results.tgz -C /tmp res41
for f in $R/lane*.log; do tail -n 4 $f | cut -c1-300; done
tail -12 $R/table_rv256.log | cut -c1-220; tail -12 $R/table_rv432.log | cut -c1-220; tail -3 $R/gpu_tests.txt
