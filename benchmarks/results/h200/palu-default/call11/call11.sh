#!/bin/bash
# session 2026-11-28e, call 3 (the eleventh H200 call of issue 34; committed as call11.sh) on two H200s, after the
# key-group-4 row takes a key rank up to 128 as one chunk (latent_attention.ONE_CHUNK_RANK).
# GPU 0: the GPU tests of the split key group's one-chunk launch; then the Qwen2.5-7B pair of plans/palu-default.toml.
# GPU 1: the H200 latent_attention class re-timed (keys and values apart) with that launch; then the Llama-3-8B pair.
export PYTHONPATH=src PYTHONUNBUFFERED=1 OMP_NUM_THREADS=8
R=/tmp/h200e3; rm -rf $R; mkdir -p $R
nvidia-smi --query-gpu=index,name,uuid,clocks.sm,temperature.gpu --format=csv > $R/gpu.txt; cat $R/gpu.txt
grep -q "H200" $R/gpu.txt || { echo "not an H200 host"; exit 3; }
python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)" >> $R/gpu.txt
for i in 0 1; do mkdir -p /tmp/gc$i; cp -r .gaccache/. /tmp/gc$i/; done
G="python3 -m gac"
lane() { local i=$1; local t=$2; shift; shift; ( export CUDA_VISIBLE_DEVICES=$i GAC_CACHE=/tmp/gc$i; timeout $t bash -c "$*" ) > $R/lane$i.log 2>&1; echo "lane $i rc $?" >> $R/lane$i.log; }
pair() { echo "$G run $1 --out $R/$2 --only '$3/base*' && $G run $1 --out $R/$2 --only '$3/palu*' && $G report $R/$2 > $R/$2_report.txt 2>&1"; }
T0="timeout 120 python3 -m pytest -o addopts='' -m gpu -p no:cacheprovider -q tests/kernels/test_latent_launch.py -k one_rank_chunk > $R/tests.log 2>&1; echo tests rc \$? >> $R/tests.log"
C1="timeout 150 python3 benchmarks/tools/gpu_launch_constants.py --fields latent_attention --profile src/gac/profiles/h200-bfloat16.json --out $R/h200-bfloat16-class.json > $R/class.log 2>&1; echo class rc \$? >> $R/class.log"
lane 0 575 "$T0; $(pair plans/palu-default.toml qwen shape-qwen2.5-7b-8)" &
lane 1 575 "$C1; $(pair plans/palu-default.toml llama shape-llama3-8b-8)" &
wait
tar -czf $OUT/results.tgz -C /tmp h200e3
for f in $R/lane*.log; do echo "== $f"; tail -n 4 $f | cut -c1-300; done
tail -n 2 $R/tests.log $R/class.log
for f in $R/*_report.txt; do echo "== $f"; tail -n 3 $f; done
