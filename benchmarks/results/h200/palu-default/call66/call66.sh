#!/bin/bash
# call 66: the what-if of call 65 on the Qwen2.5-7B shape, kernel by kernel over CUDA-graph replays
# (gpu_decode_trace.py): call 57's cell as it is and with every rebuilt key group cut to rank 128 and value group to 384
# columns, the same latent total (cells_capped_qwen.json); the tree of call 65 (two-warpgroup launch rule)
export PYTHONUNBUFFERED=1
R=/tmp/call66; mkdir -p $R
nvidia-smi --query-gpu=index,name,uuid,clocks.sm,temperature.gpu --format=csv > $R/gpu.txt
python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)" >> $R/gpu.txt
cp devrun/call66.sh devrun/c65/cells_capped_qwen.json $R/
T0=$(date +%s)
P=1x4096,16x16384,64x32768
for c in asis capped; do
  cell=benchmarks/results/h200/palu-default/default-decode-qwen-call57/cells/shape-qwen2.5-7b-8/palu-r0.5-gac.json
  [ $c = capped ] && cell=devrun/c65/cells_capped_qwen.json
  PYTHONPATH=src OMP_NUM_THREADS=8 timeout 160 python3 benchmarks/tools/gpu_decode_trace.py --out $R/trace_$c.json \
    --spec shape:qwen2.5-7b:8 --cell $cell --points $P --models dense,palu > $R/trace_$c.log 2>&1
  echo "rc $? after $(( $(date +%s) - T0 )) s" >> $R/trace_$c.log; grep -h "median\|rc " $R/trace_$c.log
  tar -czf $OUT/call66.tgz -C /tmp call66
done
