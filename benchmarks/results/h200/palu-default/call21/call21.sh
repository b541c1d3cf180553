#!/bin/bash
# session 2026-11-28h, call 1 (the twenty-first H200 call of issue 34; committed as call21.sh) on one H200 (no two-GPU host lent).
# Dense decode attention past 128 (batch x KV head) pairs: gac_sdpa's "auto" keeps SDPA on the grouped query there
# (unmeasured), where the two batched GEMMs ran at 3.8 TB/s at B16 x 32k and cuDNN's flash kernel at 2.4 TB/s at
# B64 x 32k (call16). Whole compiled, captured dense decode steps, each mode forced.
# Llama-3-8B shape (8 KV heads), then Qwen2.5-7B shape (4 KV heads), one after the other on GPU 0.
export PYTHONPATH=src PYTHONUNBUFFERED=1 OMP_NUM_THREADS=8
R=/tmp/h200h1; rm -rf $R; mkdir -p $R
nvidia-smi --query-gpu=index,name,uuid,clocks.sm,temperature.gpu --format=csv > $R/gpu.txt; cat $R/gpu.txt
grep -q "H200" $R/gpu.txt || { echo "not an H200 host"; exit 3; }
python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)" >> $R/gpu.txt
C=benchmarks/results/h200/palu-default/call11
run() {  # gpu tag cell
  ( export CUDA_VISIBLE_DEVICES=0; timeout 270 python3 benchmarks/experiments/gpu_decode_attention.py $3 \
      --batches 32,64,128 --kv 8192,16384,32768 --modes sdpa,matmul --out $R/decode_attention_$2.json ) > $R/lane$1.log 2>&1
  echo "lane $1 rc $?" >> $R/lane$1.log
}
run 0 llama $C/llama/cells/shape-llama3-8b-8/base.json
run 1 qwen $C/qwen/cells/shape-qwen2.5-7b-8/base.json
tar -czf $OUT/results.tgz -C /tmp h200h1
for f in $R/lane*.log; do echo "== $f"; grep -v Warning $f | grep "^sdpa\|^matmul\|rc\|Error" | cut -c1-600; done
