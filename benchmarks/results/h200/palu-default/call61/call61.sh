#!/bin/bash
# call 61: (1) the GPU tests written but not yet run on a GPU (a point's timed-calls peak; the two-warpgroup model-decode
# case on Qwen3); (2) kernel alone, dense in the same process, the Triton kernel (the table's launch) beside:
#   a. key group 4 at 128/128 (the class's calls): two warpgroups of 2 KV heads (GAC_GLUON_HEADS=2) against the
#      128-token launch (2 heads), and two warpgroups of all 4 heads (one stage each), which the default takes nowhere;
#   b. key rank 192 (Llama-3-8B 192/328 and 192/280, Qwen2.5-7B 192/336, the default cells' layers 2-4 and 2): two
#      warpgroups of one KV head (GAC_GLUON_MAX_RANK=192), the key latents the register operand (xreg 1) or not (0).
# GAC_GLUON_WS_LAUNCH="" so that a given launch runs as given (latent_gluon.plan would otherwise swap in the
# two-warpgroup launch wherever it holds as many KV heads).
export PYTHONUNBUFFERED=1
R=/tmp/call61; mkdir -p $R
nvidia-smi --query-gpu=index,name,uuid,clocks.sm,temperature.gpu --format=csv > $R/gpu.txt
python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)" >> $R/gpu.txt
cp devrun/call61.sh $R/
T0=$(date +%s)
pack() { tar -czf $OUT/call61.tgz -C /tmp call61; }
PYTHONPATH=src timeout 200 python3 -m pytest -o addopts="" -m gpu -q -p no:cacheprovider \
  tests/eval/test_infer.py tests/kernels/test_latent_gluon.py \
  -k "timed_calls_peak or (model_decode_takes_the_gluon and qwen3)" > $R/gpu_tests.log 2>&1
echo "rc $? after $(( $(date +%s) - T0 )) s" >> $R/gpu_tests.log; tail -3 $R/gpu_tests.log; pack
run() {  # name, seconds, args
  n=$1; s=$2; shift 2
  PYTHONPATH=src GAC_GLUON_WS_LAUNCH= timeout $s python3 benchmarks/tools/gpu_latent_kernel.py --table --auto-splits \
    --no-slower --budget-s $(( s - 15 )) "$@" --out $R/$n.json > $R/$n.log 2>&1
  echo "rc $? after $(( $(date +%s) - T0 )) s" >> $R/$n.log
  grep -E "^rc|WRONG" $R/$n.log; pack
}
GAC_GLUON_HEADS=2 run g4_k128_v128_h2 75 --models llama3-8b --groups 4 --batches 1,2,16,64 --lengths 4096,32768 \
  --rank-k 128 --rank-v 128 --gluon-launches "64,4,64,1,1,2;128,8,64,1"
run g4_k128_v128_h4 60 --models llama3-8b --groups 4 --batches 2,16,64 --lengths 4096,32768 \
  --rank-k 128 --rank-v 128 --gluon-launches "64,4,64,1,1,2"
W="64,4,32,0,1,2;64,4,32,1,1,2"
GAC_GLUON_MAX_RANK=192 run llama_k192_v328 75 --models llama3-8b --groups 4 --batches 1,16,64 --lengths 4096,32768 \
  --rank-k 192 --rank-v 328 --gluon-launches "$W"
GAC_GLUON_MAX_RANK=192 run llama_k192_v280 75 --models llama3-8b --groups 4 --batches 1,16,64 --lengths 4096,32768 \
  --rank-k 192 --rank-v 280 --gluon-launches "$W"
GAC_GLUON_MAX_RANK=192 run qwen_k192_v336 75 --models qwen2.5-7b --groups 4 --batches 1,16,64 --lengths 4096,32768 \
  --rank-k 192 --rank-v 336 --gluon-launches "$W"
echo "done after $(( $(date +%s) - T0 )) s"
