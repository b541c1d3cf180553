#!/usr/bin/env bash
# Issue 13 on the GPU machine, in one device call (per-call limit 600 s): the layer-by-layer
# compression demo, the multi-GPU evaluation (2+ GPUs), then as much of plans/paper.toml's GPU
# cells as the time left allows (the plan resumes in the next call: carry runs/paper back).
#   STEPS=seq,multi,paper,refine,speed LIMIT_S=570 bash benchmarks/experiments/gpu_large_models.sh
set -u
export PYTHONPATH=src GAC_CACHE=$PWD/.gpu/corpora
R=$OUT/res; mkdir -p "$R"
t0=$(date +%s); LIMIT_S=${LIMIT_S:-570}; STEPS=${STEPS:-seq,multi,paper}
left() { local l=$(( LIMIT_S - ($(date +%s) - t0) )); echo $(( l > 30 ? l : 30 )); }
nvidia-smi > "$R/nvidia-smi.txt" 2>&1
python3 -c "import torch,transformers,triton,accelerate;print(torch.__version__,transformers.__version__,triton.__version__,accelerate.__version__)" > "$R/versions.txt" 2>&1
if [[ $STEPS == *seq* ]]; then
  timeout $(( $(left) - 20 )) python3 -u benchmarks/tools/gpu_sequential.py --spec shape:llama3-8b:4 --budget 2 \
    --n-samples 16 --seq-len 512 --out "$R/sequential.json" > "$R/sequential.log" 2>&1; echo "seq rc=$? t=$(( $(date +%s) - t0 ))" >> "$R/steps.txt"
fi
if [[ $STEPS == *multi* ]]; then
  timeout $(( $(left) - 20 )) python3 -u benchmarks/tools/gpu_multi_gpu.py --out "$R/multi_gpu.json" > "$R/multi_gpu.log" 2>&1; echo "multi rc=$? t=$(( $(date +%s) - t0 ))" >> "$R/steps.txt"
fi
if [[ $STEPS == *paper* ]]; then
  timeout $(( $(left) - 25 )) python3 -u -m gac run plans/paper.toml --out runs/paper --only 'kernels/*' \
    --only 'shape-llama3-8b-8/*' > "$R/paper.log" 2>&1; echo "paper rc=$? t=$(( $(date +%s) - t0 ))" >> "$R/steps.txt"
  [ -d runs/paper ] && tar czf "$OUT/paper.tgz" runs/paper
fi
if [[ $STEPS == *refine* ]]; then  # gac profile --refine against an unaligned SVD model (2 layers: same GEMM shapes)
  python3 -u -m gac compress shape:llama3-8b:2 --compressor svd --param-ratio 0.85 --align none \
    --out /tmp/gac_svd_none > "$R/compress.log" 2>&1
  python3 -u -m gac profile --refine /tmp/gac_svd_none --profile h200-bfloat16 --tokens 2048 \
    --out "$R/h200-bfloat16-refined.json" > "$R/refine.log" 2>&1; echo "refine rc=$? t=$(( $(date +%s) - t0 ))" >> "$R/steps.txt"
fi
if [[ $STEPS == *speed* ]]; then  # issue 9 grid points on the default path
  timeout $(( $(left) - 25 )) python3 -u -m gac run plans/speed.toml --out runs/speed > "$R/speed.log" 2>&1
  echo "speed rc=$? t=$(( $(date +%s) - t0 ))" >> "$R/steps.txt"
  [ -d runs/speed ] && tar czf "$OUT/speed.tgz" runs/speed
fi
tar czf "$OUT/res.tgz" -C "$OUT" res
