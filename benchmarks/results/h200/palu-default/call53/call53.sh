#!/bin/bash
# call 53: value tiles read in two boxes, the second ending at each group's own rank (latent_gluon.VALUE_SPLIT "2",
# the tree's new default), against call 51-52's reading ("1": one power of two below 256 at 8 warps, the second box
# after the first). The Gluon kernel's GPU tests first (float64 at every launch and both readings, model decode on
# four families), then the kernel alone, each reading in its own process, dense decode attention beside it:
# the capacity cell's layers (key and value groups of 2, Llama-3-8B shape, B=262 x 32k) and the default key group's
# layers of both 8B shapes at the grid's batches
export PYTHONPATH=src PYTHONUNBUFFERED=1
R=/tmp/call53; mkdir -p $R
nvidia-smi --query-gpu=index,name,uuid,clocks.sm,temperature.gpu --format=csv > $R/gpu.txt
python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)" >> $R/gpu.txt
git log -1 --format=%H >> $R/gpu.txt 2>/dev/null
T0=$(date +%s)
timeout 170 python3 -m pytest -o addopts="" -m gpu tests/kernels/test_latent_gluon.py -k "matches_float64 or model_decode" \
  -q > $R/gpu_tests.log 2>&1
echo "rc $? after $(( $(date +%s) - T0 )) s" >> $R/gpu_tests.log
tail -n 3 $R/gpu_tests.log
run() {  # name, seconds, args
  n=$1; s=$2; shift 2
  timeout $s python3 benchmarks/tools/gpu_latent_kernel.py --table --gluon --auto-splits --budget-s $(( s - 10 )) "$@" \
    --out $R/$n.json > $R/$n.log 2>&1
  echo "rc $? after $(( $(date +%s) - T0 )) s" >> $R/$n.log
  grep -E "^rc|WRONG|x, floor" $R/$n.log | cut -c1-150
}
for rr in 128/216 128/168 64/144; do
  k=${rr%/*}; v=${rr#*/}
  for m in 2 1; do
    GAC_GLUON_VALUE_SPLIT=$m run cap_k${k}_v${v}_split$m 40 --models llama3-8b --groups 2 --batches 262 --lengths 32768 --rank-k $k --rank-v $v
  done
done
for m in 2 1; do
  GAC_GLUON_VALUE_SPLIT=$m run llama_g4_k128_v232_split$m 45 --models llama3-8b --groups 4 --batches 1,16,64 --lengths 4096,32768 --rank-k 128 --rank-v 232
  GAC_GLUON_VALUE_SPLIT=$m run qwen_g4_k128_v224_split$m 45 --models qwen2.5-7b --groups 4 --batches 1,16,64 --lengths 4096,32768 --rank-k 128 --rank-v 224
done
cp devrun/call53.sh $R/
tar -czf $OUT/call53.tgz -C /tmp call53
