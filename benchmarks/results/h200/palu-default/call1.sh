#!/bin/bash
# session 2026-11-28c call 1 (issue 34) on two H200s: the H200 profile's missing latency fields (latent_attention,
# gemv_kernel, prefill_attention), the latent kernel alone at key group 4, the GPU kernel tests, and the
# palu-default Llama-3-8B pair (dense and PaLU cells on one GPU)
export PYTHONPATH=src PYTHONUNBUFFERED=1 OMP_NUM_THREADS=8
R=/tmp/h200c1; rm -rf $R; mkdir -p $R
nvidia-smi --query-gpu=index,name,uuid,clocks.sm,temperature.gpu --format=csv > $R/gpu.txt; cat $R/gpu.txt
grep -q "H200" $R/gpu.txt || { echo "not an H200 host"; exit 3; }
git rev-parse HEAD > $R/tree.txt 2>/dev/null; git status --short >> $R/tree.txt 2>/dev/null
python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)" >> $R/gpu.txt
for i in 0 1; do mkdir -p /tmp/gc$i; cp -r .gaccache/. /tmp/gc$i/; done
G="python3 -m gac"
lane() { local i=$1; local t=$2; shift; shift; ( export CUDA_VISIBLE_DEVICES=$i GAC_CACHE=/tmp/gc$i; timeout $t bash -c "$*" ) > $R/lane$i.log 2>&1; echo "lane $i rc $?" >> $R/lane$i.log; }
P=plans/palu-default.toml
FIELDS="timeout 260 python3 benchmarks/tools/gpu_launch_constants.py --fields latent_attention,gemv_kernel,prefill_attention --profile src/gac/profiles/h200-bfloat16.json --out $R/h200-bfloat16.json > $R/fields.log 2>&1; echo fields rc \$? >> $R/fields.log"
K="timeout 120 python3 benchmarks/tools/gpu_latent_kernel.py --table --models llama3-8b,qwen2.5-7b --groups 1,4 --batches 1,16,64 --lengths 4096,32768 --budget-s 100 --out $R/table_g14.json > $R/table_g14.log 2>&1; echo table rc \$? >> $R/table_g14.log"
TESTS="timeout 150 python3 -m pytest tests/kernels/test_latent_decode.py tests/kernels/test_latent_launch.py -m gpu -p no:cacheprovider -q -x > $R/gpu_tests.txt 2>&1; tail -3 $R/gpu_tests.txt"
lane 0 560 "$FIELDS; $K; $TESTS" &
lane 1 560 "$G run $P --out $R/llama --only 'shape-llama3-8b-8/base*' && $G run $P --out $R/llama --only 'shape-llama3-8b-8/palu*' && $G report $R/llama > $R/llama_report.txt 2>&1" &
wait
tar -czf $OUT/results.tgz -C /tmp h200c1
for f in $R/lane*.log $R/fields.log; do echo "== $f"; tail -n 6 $f | cut -c1-300; done
tail -8 $R/table_g14.log | cut -c1-220; tail -3 $R/gpu_tests.txt
