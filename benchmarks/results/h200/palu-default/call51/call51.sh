#!/bin/bash
# call 51: the tree with the occupancy launch and the split value boxes as defaults. The Gluon kernel's GPU tests
# (float64 agreement at every launch, and model decode on four families), then the kernel alone: value tiles below 256
# columns in two boxes (latent_gluon.VALUE_SPLIT) against one (GAC_GLUON_VALUE_SPLIT=0) at the capacity cell's layer 3
# (key and value groups of 2, ranks 64/144, Llama-3-8B shape) at B=262 x 32k and at the grid's batches; and Qwen2.5-7B's
# key group 4 at 128/280 (one KV head a program either way) with the occupancy launch against the 128-token launch
export PYTHONPATH=src PYTHONUNBUFFERED=1
R=/tmp/call51; mkdir -p $R
nvidia-smi --query-gpu=index,name,uuid,clocks.sm,temperature.gpu --format=csv > $R/gpu.txt
python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)" >> $R/gpu.txt
T0=$(date +%s)
timeout 150 python3 -m pytest -o addopts="" -m gpu tests/kernels/test_latent_gluon.py -k "matches_float64 or model_decode" \
  -q -x > $R/gpu_tests.log 2>&1
echo "rc $? after $(( $(date +%s) - T0 )) s" >> $R/gpu_tests.log
tail -n 3 $R/gpu_tests.log
run() {  # name, seconds, args
  n=$1; s=$2; shift 2
  timeout $s python3 benchmarks/tools/gpu_latent_kernel.py --table --gluon --auto-splits --budget-s $(( s - 15 )) "$@" \
    --out $R/$n.json > $R/$n.log 2>&1
  echo "rc $? after $(( $(date +%s) - T0 )) s" >> $R/$n.log
  grep -E "^rc|WRONG" $R/$n.log
}
run cap_k64_v144_split 45 --models llama3-8b --groups 2 --batches 262 --lengths 32768 --rank-k 64 --rank-v 144
GAC_GLUON_VALUE_SPLIT=0 run cap_k64_v144_one_box 45 --models llama3-8b --groups 2 --batches 262 --lengths 32768 --rank-k 64 --rank-v 144
run g2_k64_v144_split 45 --models llama3-8b,qwen2.5-7b --groups 2 --batches 1,16,64 --lengths 4096,32768 --rank-k 64 --rank-v 144
GAC_GLUON_VALUE_SPLIT=0 run g2_k64_v144_one_box 45 --models llama3-8b,qwen2.5-7b --groups 2 --batches 1,16,64 --lengths 4096,32768 --rank-k 64 --rank-v 144
run qwen_g4_k128_v280 45 --models qwen2.5-7b --groups 4 --batches 1,16,64 --lengths 4096,32768 --rank-k 128 --rank-v 280 --gluon-launches "128,8,64,1"
cp devrun/call51.sh $R/
tar -czf $OUT/call51.tgz -C /tmp call51
