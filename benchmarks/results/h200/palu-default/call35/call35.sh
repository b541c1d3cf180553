#!/bin/bash
# call 35: the Llama-3-8B PaLU cell of plans/palu-default.toml again, key ranks past 128 back on the Triton kernel
# (call 33 ran layer 4's 192/248 on the Gluon kernel, 1.5-1.8x the Triton kernel's time there). The device time left
# did not hold the dense cell too: the report compares it with call 33's dense cell, copied in afterwards.
export PYTHONPATH=src PYTHONUNBUFFERED=1 OMP_NUM_THREADS=8 CUDA_VISIBLE_DEVICES=0
R=/tmp/call35; rm -rf $R; mkdir -p $R
nvidia-smi --query-gpu=index,name,uuid,clocks.sm,temperature.gpu --format=csv > $R/gpu.txt; cat $R/gpu.txt
python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)" >> $R/gpu.txt
mkdir -p /tmp/gc0; cp -r .gaccache/. /tmp/gc0/; export GAC_CACHE=/tmp/gc0
T0=$(date +%s)
G="python3 -m gac"
timeout 330 $G run plans/palu-default.toml --out $R/llama --only 'shape-llama3-8b-8/palu*' > $R/lane0.log 2>&1
echo "lane 0 rc $? after $(( $(date +%s) - T0 )) s" >> $R/lane0.log
tar -czf $OUT/call35.tgz -C /tmp call35
tail -n 3 $R/lane0.log | cut -c1-300
