#!/bin/bash
# session 2026-11-28 call 4 (one H100, issue 34): the final v11 kernel (queries turned where the row has <= 16 query
# rows): GPU kernel tests, the kernel against bf39189's on the same GPU, and the profile's latent_attention class re-timed
export PYTHONPATH=src PYTHONUNBUFFERED=1
R=/tmp/res34; mkdir -p $R
nvidia-smi -L > $R/gpu.txt; nvidia-smi --query-gpu=index,uuid,name,clocks.sm,temperature.gpu --format=csv >> $R/gpu.txt
git status --short > $R/tree.txt 2>/dev/null; git log -1 --format=%H >> $R/tree.txt 2>/dev/null
timeout 150 python3 benchmarks/tools/gpu_launch_constants.py --fields latent_attention --profile src/gac/profiles/h100-bfloat16.json --out $R/h100-bfloat16.json > $R/latent_class.log 2>&1; echo "class rc $?" >> $R/latent_class.log
timeout 130 python3 benchmarks/tools/gpu_latent_kernel.py --table --old devrun/latent_attention_old.py --models llama3-8b,qwen2.5-7b --groups 4 --batches 16,64 --lengths 4096,32768 --budget-s 100 --out $R/table_g4_final.json > $R/table_g4_final.log 2>&1
timeout 220 python3 -m pytest tests/kernels/test_latent_decode.py tests/kernels/test_latent_launch.py -m gpu -p no:cacheprovider -q > $R/gpu_tests.txt 2>&1; echo "tests rc $?" >> $R/gpu_tests.txt
tar -czf $OUT/results.tgz -C /tmp res34
tail -3 $R/latent_class.log; tail -9 $R/table_g4_final.log | cut -c1-200; tail -3 $R/gpu_tests.txt
