#!/bin/bash
# session 2026-11-28f, call 1 (the thirteenth H200 call of issue 34; committed as call13.sh) on two H200s, at tree 61231f8 (gpu.txt names its parent: the tree was uncommitted when it ran).
# The latent kernel alone at key group 4 with the launch table's own launch, value tiles past 256 columns read in
# chunks of 128 (latent_attention.VALUE_CHUNK, the new default) against two halves (0, before), on the same inputs,
# at the key/value rank pairs the pipeline picks on the 8B shapes (128/384, 192/320, 64/448) and 256/256 (where
# both read one 256-column tile: the repeat is the run's spread). Then the GPU kernel tests, split over the lanes.
# GPU 0: Llama-3-8B shape. GPU 1: Qwen2.5-7B shape.
export PYTHONPATH=src PYTHONUNBUFFERED=1 OMP_NUM_THREADS=8
R=/tmp/h200f1; rm -rf $R; mkdir -p $R
nvidia-smi --query-gpu=index,name,uuid,clocks.sm,temperature.gpu --format=csv > $R/gpu.txt; cat $R/gpu.txt
grep -q "H200" $R/gpu.txt || { echo "not an H200 host"; exit 3; }
python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)" >> $R/gpu.txt
git rev-parse HEAD >> $R/gpu.txt 2>/dev/null
sweep() {  # model tag
  for pr in 128,384 192,320 64,448 256,256; do rk=${pr%,*}; rv=${pr#*,}
    timeout 100 python3 benchmarks/tools/gpu_latent_kernel.py --table --value-chunks 0,128 --models $1 --groups 4 \
      --batches 16,64 --lengths 4096,32768 --rank-k $rk --rank-v $rv --budget-s 90 --out $R/$2_k${rk}_v${rv}.json \
      > $R/$2_k${rk}_v${rv}.log 2>&1; echo "rc $?" >> $R/$2_k${rk}_v${rv}.log
  done
}
python3 -m pytest tests/kernels/test_latent_decode.py tests/kernels/test_latent_launch.py -o addopts='' -m gpu --collect-only -q -p no:cacheprovider 2>/dev/null | grep '::' > $R/ids.txt
split -n r/4 $R/ids.txt $R/ids_
tests() { for f in "$@"; do timeout 230 python3 -m pytest -o addopts='' -m gpu -p no:cacheprovider -q $(cat $f) > $f.log 2>&1 & done; wait; }
( export CUDA_VISIBLE_DEVICES=0; timeout 560 bash -c "$(declare -f sweep tests); R=$R; sweep llama3-8b llama; tests $R/ids_aa $R/ids_ab" > $R/lane0.log 2>&1; echo "lane 0 rc $?" >> $R/lane0.log ) &
( export CUDA_VISIBLE_DEVICES=1; timeout 560 bash -c "$(declare -f sweep tests); R=$R; sweep qwen2.5-7b qwen; tests $R/ids_ac $R/ids_ad" > $R/lane1.log 2>&1; echo "lane 1 rc $?" >> $R/lane1.log ) &
wait
tar -czf $OUT/results.tgz -C /tmp h200f1
for f in $R/lane*.log; do echo "== $f"; tail -n 3 $f | cut -c1-200; done
for f in $R/*_k*.log; do echo "== $f"; grep "G4 B" $f | sed 's/cfg {.*} old/old/' | cut -c1-400; tail -1 $f; done
wc -l $R/ids.txt; tail -qn 1 $R/ids_a?.log
