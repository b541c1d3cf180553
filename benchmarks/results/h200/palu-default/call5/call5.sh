#!/bin/bash
# session 2026-11-28d, call 1 (the fifth H200 call of issue 34; committed as call5.sh) on two H200s.
# GPU 0: the latent kernel alone at key group 4 with the key and value ranks apart at the bytes of KV 0.5
#        (does the rebuild show in the time?) and at ranks 8 short of the rank tile; then the Qwen prefill pair.
# GPU 1: the GPU kernel tests (four pytest processes), then the Llama prefill pair (plans/palu-prefill.toml).
export PYTHONPATH=src PYTHONUNBUFFERED=1 OMP_NUM_THREADS=4
R=/tmp/h200d1; rm -rf $R; mkdir -p $R
nvidia-smi --query-gpu=index,name,uuid,clocks.sm,temperature.gpu --format=csv > $R/gpu.txt; cat $R/gpu.txt
grep -q "H200" $R/gpu.txt || { echo "not an H200 host"; exit 3; }
python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)" >> $R/gpu.txt
for i in 0 1; do mkdir -p /tmp/gc$i; cp -r .gaccache/. /tmp/gc$i/; done
G="python3 -m gac"
lane() { local i=$1; local t=$2; shift; shift; ( export CUDA_VISIBLE_DEVICES=$i GAC_CACHE=/tmp/gc$i; timeout $t bash -c "$*" ) > $R/lane$i.log 2>&1; echo "lane $i rc $?" >> $R/lane$i.log; }
P=plans/palu-prefill.toml
SPLIT=""
for pr in 256,256 128,384 384,128 248,248 248,256 256,248; do
  rk=${pr%,*}; rv=${pr#*,}
  SPLIT="$SPLIT timeout 75 python3 benchmarks/tools/gpu_latent_kernel.py --table --models llama3-8b,qwen2.5-7b --groups 4 --batches 1,16,64 --lengths 4096,32768 --rank-k $rk --rank-v $rv --budget-s 55 --out $R/split_k${rk}_v${rv}.json > $R/split_k${rk}_v${rv}.log 2>&1; echo rc \$? >> $R/split_k${rk}_v${rv}.log;"
done
TESTS="python3 -m pytest tests/kernels/test_latent_decode.py tests/kernels/test_latent_launch.py -o addopts='' -m gpu --collect-only -q -p no:cacheprovider 2>/dev/null | grep '::' > $R/ids.txt; split -n r/4 $R/ids.txt $R/ids_; for f in $R/ids_??; do timeout 270 python3 -m pytest -o addopts='' -m gpu -p no:cacheprovider -q \$(cat \$f) --junitxml=\$f.xml > \$f.log 2>&1 & done; wait; tail -n 2 $R/ids_??.log"
lane 0 585 "$SPLIT $G run $P --out $R/prefill --only 'shape-qwen2.5-7b-8/*'" &
lane 1 585 "$TESTS; $G run $P --out $R/prefill1 --only 'shape-llama3-8b-8/*'" &
wait
tar -czf $OUT/results.tgz -C /tmp h200d1
for f in $R/lane*.log; do echo "== $f"; tail -n 8 $f | cut -c1-300; done
for f in $R/split_*.log; do echo "== $f"; grep -h "G4 B" $f | cut -c1-120; tail -1 $f; done
tail -n 2 $R/ids_??.log
