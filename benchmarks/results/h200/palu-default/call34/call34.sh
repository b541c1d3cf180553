#!/bin/bash
# call 34: the Gluon kernel's GPU tests (call 32's failures mended: the 64-token launch only by GAC_GLUON_LAUNCH, the
# model test's record read before its reference run); the Qwen2.5-7B pair of plans/palu-default.toml with the Gluon
# kernel as the default where it serves, and its report
export PYTHONPATH=src PYTHONUNBUFFERED=1 OMP_NUM_THREADS=8 CUDA_VISIBLE_DEVICES=0
R=/tmp/call34; rm -rf $R; mkdir -p $R
nvidia-smi --query-gpu=index,name,uuid,clocks.sm,temperature.gpu --format=csv > $R/gpu.txt; cat $R/gpu.txt
python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)" >> $R/gpu.txt
mkdir -p /tmp/gc0; cp -r .gaccache/. /tmp/gc0/; export GAC_CACHE=/tmp/gc0
T0=$(date +%s)
timeout 100 python3 -m pytest tests/kernels/test_latent_gluon.py -m gpu -p no:cacheprovider -rA -q > $R/gluon_tests.log 2>&1
echo "rc $? after $(( $(date +%s) - T0 )) s" >> $R/gluon_tests.log
G="python3 -m gac"
timeout 440 bash -c "$G run plans/palu-default.toml --out $R/qwen --only 'shape-qwen2.5-7b-8/base*' && $G run plans/palu-default.toml --out $R/qwen --only 'shape-qwen2.5-7b-8/palu*' && $G report $R/qwen > $R/qwen_report.txt 2>&1" > $R/lane0.log 2>&1
echo "lane 0 rc $? after $(( $(date +%s) - T0 )) s" >> $R/lane0.log
tar -czf $OUT/call34.tgz -C /tmp call34
tail -n 3 $R/lane0.log | cut -c1-300
