#!/bin/bash
# call 47: the Gluon kernel's `slower` rule between 2 and 15 sequences, untimed so far: Llama-3-8B's key group of 4 at
# key rank 128 with 384 value columns (one KV head a Gluon program, the whole group a Triton program), the kernel alone
# at B 1/2/4/8/16 x KV 4096/16384/32768, the Triton kernel and the default path (Gluon where it serves, `slower` aside),
# dense decode attention in the same process
export PYTHONPATH=src PYTHONUNBUFFERED=1
R=/tmp/call47; mkdir -p $R
nvidia-smi --query-gpu=index,name,uuid,clocks.sm,temperature.gpu --format=csv > $R/gpu.txt
python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)" >> $R/gpu.txt
T0=$(date +%s)
timeout 300 python3 benchmarks/tools/gpu_latent_kernel.py --table --gluon --auto-splits --models llama3-8b --groups 4 \
  --batches 1,2,4,8,16 --lengths 4096,16384,32768 --rank-k 128 --rank-v 384 --no-slower --budget-s 280 --out $R/llama_g4_k128_v384.json \
  > $R/llama_g4_k128_v384.log 2>&1
echo "rc $? after $(( $(date +%s) - T0 )) s" >> $R/llama_g4_k128_v384.log
tail -n 20 $R/llama_g4_k128_v384.log
cp devrun/call47.sh $R/
tar -czf $OUT/call47.tgz -C /tmp call47
