#!/bin/bash
# session 2026-11-28f, call 4 (the sixteenth H200 call of issue 34; committed as call16.sh) on two H200s.
# Where a decode step's time goes, dense against PaLU, at the ranks of call 11's cells (the current record), kernel by
# kernel over CUDA-graph replays (benchmarks/tools/gpu_decode_trace.py). GPU 0: Llama-3-8B shape. GPU 1: Qwen2.5-7B.
# At tree dbd59b1: the PaLU skeleton stores a full-width group with the identity up-projection, so the first layer
# reads its keys raw as the compressed model does (call 15 rebuilt them at rank 512).
export PYTHONPATH=src PYTHONUNBUFFERED=1 OMP_NUM_THREADS=8
R=/tmp/h200f4; rm -rf $R; mkdir -p $R
nvidia-smi --query-gpu=index,name,uuid,clocks.sm,temperature.gpu --format=csv > $R/gpu.txt; cat $R/gpu.txt
grep -q "H200" $R/gpu.txt || { echo "not an H200 host"; exit 3; }
python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)" >> $R/gpu.txt
C=benchmarks/results/h200/palu-default/call11
P=1x4096,16x4096,16x32768,64x4096,64x32768
( export CUDA_VISIBLE_DEVICES=0; timeout 500 python3 benchmarks/tools/gpu_decode_trace.py --out $R/trace_llama.json --spec shape:llama3-8b:8 \
    --cell $C/llama/cells/shape-llama3-8b-8/palu-r0.5-gac.json --points $P --models dense,palu > $R/llama.log 2>&1; echo "rc $?" >> $R/llama.log ) &
( export CUDA_VISIBLE_DEVICES=1; timeout 500 python3 benchmarks/tools/gpu_decode_trace.py --out $R/trace_qwen.json --spec shape:qwen2.5-7b:8 \
    --cell $C/qwen/cells/shape-qwen2.5-7b-8/palu-r0.5-gac.json --points $P --models dense,palu > $R/qwen.log 2>&1; echo "rc $?" >> $R/qwen.log ) &
wait
tar -czf $OUT/results.tgz -C /tmp h200f4
tail -n 4 $R/llama.log $R/qwen.log
grep -h "median" $R/*.log | head -30
