#!/bin/bash
# call 65: (1) kernel alone, dense in the same process: the two-warpgroup launch of two KV heads now taken at value
# latents of 264-320 columns (key rank 128), where the occupancy launch held one (latent_gluon.plan): Qwen2.5-7B's key
# group of 4 at 128/280 (its default cell's layer 3; before: the occupancy launch, timed beside in its own process with
# GAC_GLUON_WS_LAUNCH="") and Llama-3-8B's at 128/304 (before: the Triton kernel from 2 sequences, the table's launch).
# (2) a what-if, kernel by kernel over CUDA-graph replays (gpu_decode_trace.py): call 56's Llama-3-8B cell as it is and
# with every rebuilt key group cut to rank 128 and value group to 384 columns, the same latent total (cells_capped_llama.json)
export PYTHONUNBUFFERED=1
R=/tmp/call65; mkdir -p $R
nvidia-smi --query-gpu=index,name,uuid,clocks.sm,temperature.gpu --format=csv > $R/gpu.txt
python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)" >> $R/gpu.txt
cp devrun/call65.sh devrun/c65/cells_capped_llama.json $R/
T0=$(date +%s)
pack() { tar -czf $OUT/call65.tgz -C /tmp call65; }
run() {  # name, seconds, args
  n=$1; s=$2; shift 2
  PYTHONPATH=src timeout $s python3 benchmarks/tools/gpu_latent_kernel.py --table --auto-splits \
    --budget-s $(( s - 15 )) "$@" --out $R/$n.json > $R/$n.log 2>&1
  echo "rc $? after $(( $(date +%s) - T0 )) s" >> $R/$n.log
  grep -E "^rc|WRONG" $R/$n.log; pack
}
run qwen_k128_v280 50 --gluon --models qwen2.5-7b --groups 4 --batches 2,16,64 --lengths 4096,32768 --rank-k 128 --rank-v 280
GAC_GLUON_WS_LAUNCH= run qwen_k128_v280_before 50 --gluon --models qwen2.5-7b --groups 4 --batches 2,16,64 --lengths 4096,32768 \
  --rank-k 128 --rank-v 280
run llama_k128_v304 50 --gluon --models llama3-8b --groups 4 --batches 2,16,64 --lengths 4096,32768 --rank-k 128 --rank-v 304
P=1x4096,16x32768,64x16384,64x32768
for c in asis capped; do
  cell=benchmarks/results/h200/palu-default/default-decode-llama-call56/cells/shape-llama3-8b-8/palu-r0.5-gac.json
  [ $c = capped ] && cell=devrun/c65/cells_capped_llama.json
  PYTHONPATH=src OMP_NUM_THREADS=8 timeout 200 python3 benchmarks/tools/gpu_decode_trace.py --out $R/trace_$c.json \
    --spec shape:llama3-8b:8 --cell $cell --points $P --models dense,palu > $R/trace_$c.log 2>&1
  echo "rc $? after $(( $(date +%s) - T0 )) s" >> $R/trace_$c.log; grep -h "median\|rc " $R/trace_$c.log; pack
done
