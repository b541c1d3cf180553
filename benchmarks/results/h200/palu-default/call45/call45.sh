#!/bin/bash
# call 45: where the capacity step of key and value groups of 2 goes (call 41: 262 sequences x 32k at 66.0 ms, 1.46x
# dense's tokens/s; 1.6x needs 60.2 ms). The kernel alone at B=262 x 32768 for the Llama-3-8B cell's layer ranks
# (capacity-keygroup2-values2/: layer 0 keys raw with values 248; layer 1 128/216; layer 2 128-64/168; layers 3-7
# 64/144-104), the launch table's Triton launch and the default path (Gluon where it serves), dense decode attention
# (gac_sdpa) in the same process
export PYTHONPATH=src PYTHONUNBUFFERED=1
R=/tmp/call45; mkdir -p $R
nvidia-smi --query-gpu=index,name,uuid,clocks.sm,temperature.gpu --format=csv > $R/gpu.txt
python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)" >> $R/gpu.txt
T0=$(date +%s)
run() {  # name, extra args
  n=$1; shift
  timeout 100 python3 benchmarks/tools/gpu_latent_kernel.py --table --gluon --auto-splits --models llama3-8b --groups 2 \
    --batches 262 --lengths 32768 --budget-s 80 "$@" --out $R/$n.json > $R/$n.log 2>&1
  echo "rc $? after $(( $(date +%s) - T0 )) s" >> $R/$n.log
  tail -n 6 $R/$n.log
}
run layer0_raw_v248 --raw --rank-v 248
run layer1_k128_v216 --rank-k 128 --rank-v 216
run layer3_k64_v144 --rank-k 64 --rank-v 144
run layer6_k64_v112 --rank-k 64 --rank-v 112
run layer2_k128_v168 --rank-k 128 --rank-v 168
cp devrun/call45.sh $R/
tar -czf $OUT/call45.tgz -C /tmp call45
