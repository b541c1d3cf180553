#!/bin/bash
# session 2026-11-28e, call 2 (the tenth H200 call of issue 34; committed as call10.sh) on two H200s.
# The latent kernel alone at key group 4, launches swept with the table's own splits (--auto-splits), at key/value
# ranks 128/384 (the pipeline's most common key rank) and 256/256.
# GPU 0: Qwen2.5-7B shape; then the GPU kernel tests of the split key group's one-chunk launch.
# GPU 1: Llama-3-8B shape; then the rest of the GPU kernel tests (three pytest processes).
export PYTHONPATH=src PYTHONUNBUFFERED=1 OMP_NUM_THREADS=8
R=/tmp/h200e2; rm -rf $R; mkdir -p $R
nvidia-smi --query-gpu=index,name,uuid,clocks.sm,temperature.gpu,memory.used,memory.total --format=csv > $R/gpu.txt; cat $R/gpu.txt
grep -q "H200" $R/gpu.txt || { echo "not an H200 host"; exit 3; }
python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)" >> $R/gpu.txt
QC="128,64,8,2,2,1,0,2;128,128,8,2,2,1,0,2;128,128,8,2,2,2,0,2;128,256,8,2,2,1,0,2;256,128,16,2,2,1,0,2;128,128,16,2,2,1,0,2;128,128,8,3,2,1,0,2"
LC="128,64,8,2,2,2,0,4;128,128,8,2,2,2,0,4;128,256,8,2,2,2,0,4;128,128,8,2,2,2,0,2;128,128,8,2,2,1,0,2;256,128,16,2,2,2,0,4;128,128,16,2,2,2,0,4"
sweep() {  # model configs tag
  for pr in 128,384 256,256; do rk=${pr%,*}; rv=${pr#*,}
    timeout 150 python3 benchmarks/tools/gpu_latent_kernel.py --auto-splits --models $1 --groups 4 --batches 16,64 \
      --lengths 4096,32768 --rank-k $rk --rank-v $rv --configs "$2" --budget-s 140 --out $R/$3_k${rk}_v${rv}.json \
      > $R/$3_k${rk}_v${rv}.log 2>&1; echo "rc $?" >> $R/$3_k${rk}_v${rv}.log
  done
}
python3 -m pytest tests/kernels/test_latent_decode.py tests/kernels/test_latent_launch.py -o addopts='' -m gpu --collect-only -q -p no:cacheprovider 2>/dev/null | grep '::' > $R/ids.txt
grep "one_rank_chunk" $R/ids.txt > $R/ids_new; grep -v "one_rank_chunk" $R/ids.txt > $R/ids_rest; split -n r/3 $R/ids_rest $R/ids_r
lane0() {
  sweep qwen2.5-7b "$QC" qwen
  timeout 200 python3 -m pytest -o addopts='' -m gpu -p no:cacheprovider -q $(cat $R/ids_new) > $R/ids_new.log 2>&1
}
lane1() {
  sweep llama3-8b "$LC" llama
  for f in $R/ids_r??; do timeout 250 python3 -m pytest -o addopts='' -m gpu -p no:cacheprovider -q $(cat $f) > $f.log 2>&1 & done; wait
}
( export CUDA_VISIBLE_DEVICES=0; timeout 560 bash -c "$(declare -f sweep lane0); R=$R QC='$QC'; lane0" > $R/lane0.log 2>&1; echo "lane 0 rc $?" >> $R/lane0.log ) &
( export CUDA_VISIBLE_DEVICES=1; timeout 560 bash -c "$(declare -f sweep lane1); R=$R LC='$LC'; lane1" > $R/lane1.log 2>&1; echo "lane 1 rc $?" >> $R/lane1.log ) &
wait
tar -czf $OUT/results.tgz -C /tmp h200e2
for f in $R/lane*.log; do echo "== $f"; tail -n 3 $f | cut -c1-200; done
for f in $R/*_k*.log; do echo "== $f"; grep -c "G4 B" $f; tail -1 $f; done
tail -n 2 $R/ids_new.log $R/ids_r??.log
