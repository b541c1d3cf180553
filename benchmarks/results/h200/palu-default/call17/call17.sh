#!/bin/bash
# session 2026-11-28f, call 5 (the seventeenth H200 call of issue 34; committed as call17.sh) on two H200s.
# Where a decode step's time goes, dense against PaLU, kernel by
# kernel over CUDA-graph replays (benchmarks/tools/gpu_decode_trace.py). GPU 0: Llama-3-8B shape. GPU 1: Qwen2.5-7B.
# A what-if: call 11's ranks with every rebuilt key group past rank 128 cut to 128 and its value group given the
# difference, at most 512 (devrun/capped/*.json, committed beside this script as cells_capped_*.json). Tree fba8224 (the cells were then at devrun/capped/*.json; the script as committed reads them here).
export PYTHONPATH=src PYTHONUNBUFFERED=1 OMP_NUM_THREADS=8
R=/tmp/h200f5; rm -rf $R; mkdir -p $R
nvidia-smi --query-gpu=index,name,uuid,clocks.sm,temperature.gpu --format=csv > $R/gpu.txt; cat $R/gpu.txt
grep -q "H200" $R/gpu.txt || { echo "not an H200 host"; exit 3; }
python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)" >> $R/gpu.txt
C=benchmarks/results/h200/palu-default/call11
P=1x4096,16x4096,16x32768,64x4096,64x32768
( export CUDA_VISIBLE_DEVICES=0; timeout 500 python3 benchmarks/tools/gpu_decode_trace.py --out $R/trace_llama.json --spec shape:llama3-8b:8 \
    --cell benchmarks/results/h200/palu-default/call17/cells_capped_llama.json --points $P --models dense,palu > $R/llama.log 2>&1; echo "rc $?" >> $R/llama.log ) &
( export CUDA_VISIBLE_DEVICES=1; timeout 500 python3 benchmarks/tools/gpu_decode_trace.py --out $R/trace_qwen.json --spec shape:qwen2.5-7b:8 \
    --cell benchmarks/results/h200/palu-default/call17/cells_capped_qwen.json --points $P --models dense,palu > $R/qwen.log 2>&1; echo "rc $?" >> $R/qwen.log ) &
wait
tar -czf $OUT/results.tgz -C /tmp h200f5
tail -n 4 $R/llama.log $R/qwen.log
grep -h "median" $R/*.log | head -30
