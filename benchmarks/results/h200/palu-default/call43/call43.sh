#!/bin/bash
# call 43: a prompt's latent rebuild in one block-diagonal GEMM and its causal attention on SDPA's grouped heads
# (gac.nn.latent.one_gemm, SDPA_GQA): the short-prefill pair of call 42 again (Llama-3-8B shape, key and value
# groups of 2; dense in the same run), with 2048-token prompts; then both choices timed apart
export PYTHONPATH=src PYTHONUNBUFFERED=1
T0=$(date +%s)
PLAN=devrun/prefill_short.toml RUN=devrun/p43 bash devrun/kg.sh call43 330 'shape-llama3-8b-8/base*' 'shape-llama3-8b-8/palu*'
grep -h "done\|rc " /tmp/call43/lane*.log
left=$(( 560 - ($(date +%s) - T0) ))
echo "microbench gets $left s"
timeout $left python3 benchmarks/tools/gpu_latent_prefill.py --out /tmp/call43/latent_prefill.json \
  --rows 128,512,2048,4096,16384 \
  --shapes 'llama3-8b kg2 keys,llama3-8b kg2 values,llama3-8b kg4 keys,llama3-8b kg4 values,qwen2.5-7b kg2 keys (bias)' \
  --attention-first > /tmp/call43/microbench.log 2>&1
echo "rc $? after $(( $(date +%s) - T0 )) s" >> /tmp/call43/microbench.log
tail -40 /tmp/call43/microbench.log
cp devrun/call43.sh devrun/prefill_short.toml /tmp/call43/
tar -czf $OUT/call43.tgz -C /tmp call43
