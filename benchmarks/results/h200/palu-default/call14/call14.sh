#!/bin/bash
# session 2026-11-28f, call 2 (the fourteenth H200 call of issue 34; committed as call14.sh) on two H200s.
# Two ways to overlap the latent kernel's waited loads (benchmarks/results/cpu/latent_loop_waits.json), kernel alone
# at key group 4, B 16/64 x KV 4096/32768, against the launch table's own launch in the same process:
#  A. Llama: the key group's four up-projections held on chip for the split (stage 4, heads unrolled, one stage),
#     so a tile waits on three loads, not four;
#  B. 64-token tiles in 4 warps with the values transposed through the descriptor (VALUE_T_TILE 64, devrun/vt64.py):
#     two programs a multiprocessor (255 registers a thread in 4 warps), each one's waits under the other's work.
# Then the GPU kernel tests, split over the lanes. GPU 0: Llama-3-8B shape. GPU 1: Qwen2.5-7B shape.
# Ran at tree 3f759a6 (vt64.py beside this script). As it ran, both lanes wrote vt64_k128_v384.* and vt64_k192_v320.*
# into one folder: the JSON kept is each file's last writer (Llama at 128/384, Qwen at 192/320, renamed with the model),
# the other lane's two runs and the two vt64 logs are lost.
export PYTHONPATH=src PYTHONUNBUFFERED=1 OMP_NUM_THREADS=8
R=/tmp/h200f2; rm -rf $R; mkdir -p $R
nvidia-smi --query-gpu=index,name,uuid,clocks.sm,temperature.gpu --format=csv > $R/gpu.txt; cat $R/gpu.txt
grep -q "H200" $R/gpu.txt || { echo "not an H200 host"; exit 3; }
python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)" >> $R/gpu.txt
K="--auto-splits --groups 4 --batches 16,64 --lengths 4096,32768 --budget-s 100"
run() {  # tool tag model rk rv configs
  timeout 110 python3 $1 $K --models $3 --rank-k $4 --rank-v $5 --configs "$6" --out $R/$2_k$4_v$5.json > $R/$2_k$4_v$5.log 2>&1
  echo "rc $?" >> $R/$2_k$4_v$5.log
}
T=benchmarks/tools/gpu_latent_kernel.py
python3 -m pytest tests/kernels/test_latent_decode.py tests/kernels/test_latent_launch.py -o addopts='' -m gpu --collect-only -q -p no:cacheprovider 2>/dev/null | grep '::' > $R/ids.txt
split -n r/4 $R/ids.txt $R/ids_
tests() { for f in "$@"; do timeout 230 python3 -m pytest -o addopts='' -m gpu -p no:cacheprovider -q $(cat $f) > $f.log 2>&1 & done; wait; }
lane0() {
  run $T staged llama3-8b 128 384 "128,128,8,2,2,2,0,4;128,128,8,1,2,4,0,4,4"
  run devrun/vt64.py vt64 llama3-8b 128 384 "128,128,8,2,2,2,0,4;64,128,4,1,2,2,0,4;64,128,4,2,2,2,0,4"
  run devrun/vt64.py vt64 llama3-8b 192 320 "128,64,8,2,2,2,0,4;64,64,4,1,2,2,0,4;64,64,4,2,2,2,0,4"
  tests $R/ids_aa $R/ids_ab
}
lane1() {
  run devrun/vt64.py vt64 qwen2.5-7b 128 384 "128,128,8,3,2,1,0,2;64,128,4,1,2,1,0,2;64,128,4,2,2,1,0,2"
  run devrun/vt64.py vt64 qwen2.5-7b 192 320 "128,64,8,2,2,1,0,2;64,64,4,1,2,1,0,2;64,64,4,2,2,1,0,2"
  tests $R/ids_ac $R/ids_ad
}
( export CUDA_VISIBLE_DEVICES=0; timeout 560 bash -c "$(declare -f run tests lane0); R=$R; K='$K'; T=$T; lane0" > $R/lane0.log 2>&1; echo "lane 0 rc $?" >> $R/lane0.log ) &
( export CUDA_VISIBLE_DEVICES=1; timeout 560 bash -c "$(declare -f run tests lane1); R=$R; K='$K'; T=$T; lane1" > $R/lane1.log 2>&1; echo "lane 1 rc $?" >> $R/lane1.log ) &
wait
tar -czf $OUT/results.tgz -C /tmp h200f2
for f in $R/lane*.log; do echo "== $f"; tail -n 3 $f | cut -c1-200; done
for f in $R/*_k*.log; do echo "== $f"; grep "G4 B" $f | sed 's/cfg {.*} old [0-9.na]* //' | cut -c1-420; grep -i "error\|Traceback" $f | head -3; tail -1 $f; done
wc -l $R/ids.txt; tail -qn 1 $R/ids_a?.log
