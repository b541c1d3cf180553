#!/bin/bash
# call 50: the occupancy launch (latent_gluon.OCCUPANCY_LAUNCH, the default since call 48) at the key-and-value-group-2
# grid's batches, the kernel alone: Llama-3-8B and Qwen2.5-7B shapes at key/value ranks 64/144 and 64/112, B 1/16/64
# x KV 4096/32768; the default path (--gluon: the occupancy launch where it holds as many KV heads) beside the
# 128-token launch alone, the Triton kernel and dense decode attention in the same process
export PYTHONPATH=src PYTHONUNBUFFERED=1
R=/tmp/call50; mkdir -p $R
nvidia-smi --query-gpu=index,name,uuid,clocks.sm,temperature.gpu --format=csv > $R/gpu.txt
python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)" >> $R/gpu.txt
T0=$(date +%s)
run() {  # name, seconds, args
  n=$1; s=$2; shift 2
  timeout $s python3 benchmarks/tools/gpu_latent_kernel.py --table --gluon --auto-splits --gluon-launches "128,8,64,1" \
    --budget-s $(( s - 15 )) --groups 2 --batches 1,16,64 --lengths 4096,32768 "$@" --out $R/$n.json > $R/$n.log 2>&1
  echo "rc $? after $(( $(date +%s) - T0 )) s" >> $R/$n.log
  grep -E "^rc|WRONG" $R/$n.log
}
run llama_g2_k64_v144 60 --models llama3-8b --rank-k 64 --rank-v 144
run llama_g2_k64_v112 60 --models llama3-8b --rank-k 64 --rank-v 112
run qwen_g2_k64_v144 60 --models qwen2.5-7b --rank-k 64 --rank-v 144
run qwen_g2_k64_v112 60 --models qwen2.5-7b --rank-k 64 --rank-v 112
cp devrun/call50.sh $R/
tar -czf $OUT/call50.tgz -C /tmp call50
