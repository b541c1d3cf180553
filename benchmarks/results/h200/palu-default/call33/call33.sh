#!/bin/bash
# call 33: the Llama-3-8B pair of plans/palu-default.toml (dense then PaLU) with the Gluon kernel as the default where
# it serves (128-token tiles: key rank <= 128 with values up to 384 columns, key rank 192 with values <= 256), its
# report; and the kernel alone at layer 4's ranks (key 192, value 248: key boxes 128 + 64, one KV head a program)
export PYTHONPATH=src PYTHONUNBUFFERED=1 OMP_NUM_THREADS=8 CUDA_VISIBLE_DEVICES=0
R=/tmp/call33; rm -rf $R; mkdir -p $R
nvidia-smi --query-gpu=index,name,uuid,clocks.sm,temperature.gpu --format=csv > $R/gpu.txt; cat $R/gpu.txt
python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)" >> $R/gpu.txt
mkdir -p /tmp/gc0; cp -r .gaccache/. /tmp/gc0/; export GAC_CACHE=/tmp/gc0
T0=$(date +%s)
timeout 75 python3 benchmarks/tools/gpu_latent_kernel.py --table --gluon --auto-splits --models llama3-8b --groups 4 \
  --batches 16,64 --lengths 4096,32768 --rank-k 192 --rank-v 248 --budget-s 55 \
  --out $R/kernel_llama3-8b_k192_v248_B16-64.json > $R/kernel_llama3-8b_k192_v248_B16-64.log 2>&1
echo "rc $? after $(( $(date +%s) - T0 )) s" >> $R/kernel_llama3-8b_k192_v248_B16-64.log
G="python3 -m gac"
timeout 470 bash -c "$G run plans/palu-default.toml --out $R/llama --only 'shape-llama3-8b-8/base*' && $G run plans/palu-default.toml --out $R/llama --only 'shape-llama3-8b-8/palu*' && $G report $R/llama > $R/llama_report.txt 2>&1" > $R/lane0.log 2>&1
echo "lane 0 rc $? after $(( $(date +%s) - T0 )) s" >> $R/lane0.log
tar -czf $OUT/call33.tgz -C /tmp call33
tail -n 3 $R/lane0.log | cut -c1-300
