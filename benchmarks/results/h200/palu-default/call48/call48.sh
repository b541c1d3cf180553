#!/bin/bash
# call 48: the Gluon kernel's optional launch fields (latent_gluon.LAUNCH_DEFAULTS): pipelined key chunks (the next
# chunk's rebuild issued before this one's RoPE and scores), queries staged in shared memory, two programs a
# multiprocessor at 64-token tiles. First the GPU tests of the kernel (every variant against float64), then the kernel
# alone at the default grid's key-group-4 layers (key rank 128) and at the capacity cell's key-and-value-group-2
# layers (B=262 x 32k), every variant beside the default launch, the Triton kernel and dense decode attention
export PYTHONPATH=src PYTHONUNBUFFERED=1
R=/tmp/call48; mkdir -p $R
nvidia-smi --query-gpu=index,name,uuid,clocks.sm,temperature.gpu --format=csv > $R/gpu.txt
python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)" >> $R/gpu.txt
T0=$(date +%s)
V="128,8,32,1;128,8,64,1,0,1;128,8,32,0,1,0;128,8,32,0,1,1;64,4,32,0,1,1,2;64,4,64,1,0,0,2"
timeout 150 python3 -m pytest -o addopts="" -m gpu tests/kernels/test_latent_gluon.py -k matches_float64 -q -x \
  > $R/gpu_tests.log 2>&1
echo "rc $? after $(( $(date +%s) - T0 )) s" >> $R/gpu_tests.log
tail -n 5 $R/gpu_tests.log
run() {  # name, seconds, args
  n=$1; s=$2; shift 2
  timeout $s python3 benchmarks/tools/gpu_latent_kernel.py --table --gluon --auto-splits --no-slower \
    --gluon-launches "$V" --budget-s $(( s - 25 )) "$@" --out $R/$n.json > $R/$n.log 2>&1
  echo "rc $? after $(( $(date +%s) - T0 )) s" >> $R/$n.log
  grep -E "^llama|^qwen|^rc" $R/$n.log | cut -c1-120
}
run llama_g4_k128_v232 110 --models llama3-8b --groups 4 --batches 1,16,64 --lengths 4096,32768 --rank-k 128 --rank-v 232
run qwen_g4_k128_v224 90 --models qwen2.5-7b --groups 4 --batches 1,16,64 --lengths 4096,32768 --rank-k 128 --rank-v 224
run cap_k64_v144 75 --models llama3-8b --groups 2 --batches 262 --lengths 32768 --rank-k 64 --rank-v 144
run cap_k64_v112 75 --models llama3-8b --groups 2 --batches 262 --lengths 32768 --rank-k 64 --rank-v 112
run cap_k128_v216 75 --models llama3-8b --groups 2 --batches 262 --lengths 32768 --rank-k 128 --rank-v 216
cp devrun/call48.sh $R/
tar -czf $OUT/call48.tgz -C /tmp call48
