#!/bin/bash
# session 2026-11-28 call 5 (one H100, issue 34): the profile's latent_attention class re-timed for the v11 kernel,
# with its wide rows (Qwen2.5-7B's key-group-4 programs, past QROT_ROWS); GPU kernel and class tests on the final tree
export PYTHONPATH=src PYTHONUNBUFFERED=1
R=/tmp/res35; mkdir -p $R
nvidia-smi -L > $R/gpu.txt; nvidia-smi --query-gpu=index,uuid,name,clocks.sm,temperature.gpu --format=csv >> $R/gpu.txt
git status --short > $R/tree.txt 2>/dev/null; git log -1 --format=%H >> $R/tree.txt 2>/dev/null
timeout 170 python3 benchmarks/tools/gpu_launch_constants.py --fields latent_attention --profile src/gac/profiles/h100-bfloat16.json --out $R/h100-bfloat16.json > $R/latent_class.log 2>&1; echo "class rc $?" >> $R/latent_class.log
tar -czf $OUT/results.tgz -C /tmp res35
timeout 330 python3 -m pytest tests/kernels/test_latent_decode.py tests/kernels/test_latent_launch.py tests/hardware/test_latent_pricing.py -m gpu -p no:cacheprovider -q -rs > $R/gpu_tests.txt 2>&1; echo "tests rc $?" >> $R/gpu_tests.txt
tar -czf $OUT/results.tgz -C /tmp res35
tail -3 $R/latent_class.log; tail -4 $R/gpu_tests.txt
