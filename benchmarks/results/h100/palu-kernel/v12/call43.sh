#!/bin/bash
# session 2026-11-28b call 3 (issue 34): Nsight Compute on the new key-group-4 row at B=64 x 32k (its worst points):
# Qwen2.5-7B (programs of 2 KV heads) at value ranks 256 and 432, Llama-3-8B at 432
export PYTHONPATH=src PYTHONUNBUFFERED=1
R=/tmp/res43; mkdir -p $R
nvidia-smi -L > $R/gpu.txt
N="ncu --clock-control none --section LaunchStats --section Occupancy --section SpeedOfLight --section WarpStateStats --section MemoryWorkloadAnalysis --metrics sass__inst_executed_register_spilling,sass__inst_executed_local_loads -k regex:_latent_flash_kernel --launch-skip 2 --launch-count 1 --csv --page details python3 benchmarks/tools/gpu_latent_ncu.py --group 4 --batch 64 --kv 32768"
timeout 150 $N --model qwen2.5-7b --rank-v 432 > $R/ncu_qwen_b64_rv432.csv 2>&1
timeout 150 $N --model qwen2.5-7b > $R/ncu_qwen_b64_rv256.csv 2>&1
timeout 150 $N --model llama3-8b --rank-v 432 > $R/ncu_llama_b64_rv432.csv 2>&1
tar -czf $OUT/results.tgz -C /tmp res43
for f in $R/*.csv; do echo $f; grep -E "Registers Per|Duration|Achieved Occupancy|Compute \(SM\) Throughput|DRAM Throughput|Memory Throughput|spilling|Local" $f | cut -c1-200 | head -9; done
