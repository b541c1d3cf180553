#!/bin/bash
# session 2026-11-28g, call 3 (the twentieth H200 call of issue 34; committed as call20.sh) on two H200s.
# The GPU kernel tests with the paired key rebuild (latent_attention.PAIRED_KEYS, on where a key group past two takes
# more than one rank chunk), split over the lanes; then the kernel alone at key/value rank 192/320 (three chunks of
# 64: paired) against --unpaired, the launch table's own launch. GPU 0: Llama-3-8B shape. GPU 1: Qwen2.5-7B shape.
export PYTHONPATH=src PYTHONUNBUFFERED=1 OMP_NUM_THREADS=8
R=/tmp/h200g3; rm -rf $R; mkdir -p $R
nvidia-smi --query-gpu=index,name,uuid,clocks.sm,temperature.gpu --format=csv > $R/gpu.txt; cat $R/gpu.txt
grep -q "H200" $R/gpu.txt || { echo "not an H200 host"; exit 3; }
python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)" >> $R/gpu.txt
sweep() {  # model tag
  for p in "" --unpaired; do
    timeout 90 python3 benchmarks/tools/gpu_latent_kernel.py --table --auto-splits $p --models $1 --groups 4 \
      --batches 16,64 --lengths 4096,32768 --rank-k 192 --rank-v 320 --budget-s 80 --out $R/$2_k192_v320$p.json \
      > $R/$2_k192_v320$p.log 2>&1; echo "rc $?" >> $R/$2_k192_v320$p.log
  done
}
python3 -m pytest tests/kernels/test_latent_decode.py tests/kernels/test_latent_launch.py -o addopts='' -m gpu --collect-only -q -p no:cacheprovider 2>/dev/null | grep '::' > $R/ids.txt
split -n r/4 $R/ids.txt $R/ids_
tests() { for f in "$@"; do timeout 300 python3 -m pytest -o addopts='' -m gpu -p no:cacheprovider -q $(cat $f) > $f.log 2>&1 & done; wait; }
( export CUDA_VISIBLE_DEVICES=0; timeout 540 bash -c "$(declare -f sweep tests); R=$R; tests $R/ids_aa $R/ids_ab; sweep llama3-8b llama" > $R/lane0.log 2>&1; echo "lane 0 rc $?" >> $R/lane0.log ) &
( export CUDA_VISIBLE_DEVICES=1; timeout 540 bash -c "$(declare -f sweep tests); R=$R; tests $R/ids_ac $R/ids_ad; sweep qwen2.5-7b qwen" > $R/lane1.log 2>&1; echo "lane 1 rc $?" >> $R/lane1.log ) &
wait
tar -czf $OUT/results.tgz -C /tmp h200g3
for f in $R/lane*.log; do echo "== $f"; tail -n 3 $f | cut -c1-200; done
for f in $R/*_k192*.log; do echo "== $f"; grep "G4 B" $f | sed 's/cfg {.*} old/old/' | cut -c1-300; tail -1 $f; done
wc -l $R/ids.txt; tail -qn 1 $R/ids_a?.log
