#!/bin/bash
# call 62: the two-warpgroup launch taken where it holds at least as many KV heads as the 128-token launch
# (latent_gluon.plan; call 61 timed it at key group 4, 128/128). (1) the Gluon kernel's GPU tests with that rule;
# (2) kernel alone, dense in the same process, the default path (--gluon) beside the Triton kernel (the table's launch)
# at the shapes the rule changes: Llama-3-8B key group 4 at 128/384 (before: the Triton kernel from 2 sequences, the
# `slower` rule) and 128/128 (the class's calls); Qwen2.5-7B's at 128/344 (before: the 128-token launch, one KV head,
# timed beside in its own process with GAC_GLUON_WS_LAUNCH=""); (3) the latent_attention class re-timed
export PYTHONUNBUFFERED=1
R=/tmp/call62; mkdir -p $R
nvidia-smi --query-gpu=index,name,uuid,clocks.sm,temperature.gpu --format=csv > $R/gpu.txt
python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)" >> $R/gpu.txt
cp devrun/call62.sh $R/
T0=$(date +%s)
pack() { tar -czf $OUT/call62.tgz -C /tmp call62; }
PYTHONPATH=src timeout 170 python3 -m pytest -o addopts="" -m gpu -q -p no:cacheprovider tests/kernels/test_latent_gluon.py \
  -k "matches_float64 or model_decode or takes_triton" > $R/gpu_tests.log 2>&1
echo "rc $? after $(( $(date +%s) - T0 )) s" >> $R/gpu_tests.log; tail -3 $R/gpu_tests.log; pack
run() {  # name, seconds, args
  n=$1; s=$2; shift 2
  PYTHONPATH=src timeout $s python3 benchmarks/tools/gpu_latent_kernel.py --table --auto-splits \
    --budget-s $(( s - 15 )) "$@" --out $R/$n.json > $R/$n.log 2>&1
  echo "rc $? after $(( $(date +%s) - T0 )) s" >> $R/$n.log
  grep -E "^rc|WRONG" $R/$n.log; pack
}
run llama_k128_v384 70 --gluon --models llama3-8b --groups 4 --batches 1,2,16,64 --lengths 4096,32768 --rank-k 128 --rank-v 384
run llama_k128_v128 60 --gluon --models llama3-8b --groups 4 --batches 16,64 --lengths 16384,32768 --rank-k 128 --rank-v 128
run qwen_k128_v344 70 --gluon --models qwen2.5-7b --groups 4 --batches 1,2,16,64 --lengths 4096,32768 --rank-k 128 --rank-v 344
GAC_GLUON_WS_LAUNCH= run qwen_k128_v344_before 70 --gluon --models qwen2.5-7b --groups 4 --batches 2,16,64 --lengths 4096,32768 \
  --rank-k 128 --rank-v 344
PYTHONPATH=src timeout 150 python3 benchmarks/tools/gpu_launch_constants.py --fields latent_attention \
  --profile src/gac/profiles/h200-bfloat16.json --out $R/h200-bfloat16.json > $R/latent_class.log 2>&1
echo "rc $? after $(( $(date +%s) - T0 )) s" >> $R/latent_class.log; tail -n 2 $R/latent_class.log; pack
echo "done after $(( $(date +%s) - T0 )) s"
