#!/bin/bash
# call 54: two warpgroups a program (latent_gluon launch "64,4,64,1,1,2", ws 2): each warpgroup its own split with
# its own key and value stages, the up-projections and in-tile cos/sin shared, so that one warpgroup's rebuild-RoPE-
# softmax chain runs while the other waits, at key rank 128 where two programs a multiprocessor do not fit. The GPU
# tests first (float64 at every launch, this one among them; model decode on four families), then the kernel alone:
# each launch alone ("128,8,64,1": the 128-token launch; the occupancy launch "64,4,64,1,2") beside the default path
# and dense decode attention, at the capacity cell's layers (key and value groups of 2, B=262 x 32k) and the default
# key group's layers at the grid's batches; one run of the tree before (cf2febc, devrun/old) for the restructured kernel
export PYTHONUNBUFFERED=1
R=/tmp/call54; mkdir -p $R
nvidia-smi --query-gpu=index,name,uuid,clocks.sm,temperature.gpu --format=csv > $R/gpu.txt
python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)" >> $R/gpu.txt
T0=$(date +%s)
PYTHONPATH=src timeout 200 python3 -m pytest -o addopts="" -m gpu tests/kernels/test_latent_gluon.py -k "matches_float64 or model_decode" \
  -q > $R/gpu_tests.log 2>&1
echo "rc $? after $(( $(date +%s) - T0 )) s" >> $R/gpu_tests.log
tail -n 3 $R/gpu_tests.log
run() {  # name, seconds, args
  n=$1; s=$2; shift 2
  PYTHONPATH=${SRC:-src} timeout $s python3 ${TOOL:-benchmarks/tools}/gpu_latent_kernel.py --table --gluon --auto-splits --budget-s $(( s - 10 )) "$@" \
    --out $R/$n.json > $R/$n.log 2>&1
  echo "rc $? after $(( $(date +%s) - T0 )) s" >> $R/$n.log
  grep -E "^rc|WRONG" $R/$n.log
  cp devrun/call54.sh $R/; tar -czf $OUT/call54.tgz -C /tmp call54
}
L="64,4,64,1,1,2;128,8,64,1;64,4,64,1,2"
for rr in 128/216 128/168 64/144; do
  k=${rr%/*}; v=${rr#*/}
  run cap_k${k}_v${v} 60 --models llama3-8b --groups 2 --batches 262 --lengths 32768 --rank-k $k --rank-v $v --gluon-launches "$L" --no-slower
done
run llama_g4_k128_v232 70 --models llama3-8b --groups 4 --batches 1,16,64 --lengths 4096,32768 --rank-k 128 --rank-v 232 --gluon-launches "$L" --no-slower
run qwen_g4_k128_v224 70 --models qwen2.5-7b --groups 4 --batches 1,16,64 --lengths 4096,32768 --rank-k 128 --rank-v 224 --gluon-launches "$L" --no-slower
run g2_k64_v144 70 --models llama3-8b,qwen2.5-7b --groups 2 --batches 1,16,64 --lengths 4096,32768 --rank-k 64 --rank-v 144 --gluon-launches "$L" --no-slower
SRC=devrun/old/src TOOL=devrun/old/benchmarks/tools run old_llama_g4_k128_v232 50 --models llama3-8b --groups 4 --batches 1,16,64 --lengths 4096,32768 --rank-k 128 --rank-v 232
cp devrun/call54.sh $R/
tar -czf $OUT/call54.tgz -C /tmp call54
