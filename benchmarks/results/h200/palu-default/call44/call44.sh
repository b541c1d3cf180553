#!/bin/bash
# call 44: the latent kernels' GPU tests on the tree with the one-GEMM prompt rebuild (the Triton kernel's two files
# split over four pytest processes, the Gluon file in a fifth; the model-level tests prefill through it), then
# call 43's short-prefill pair on the Qwen2.5-7B shape (key bias; key and value groups of 2; dense in the same run)
export PYTHONPATH=src PYTHONUNBUFFERED=1
R=/tmp/call44t; mkdir -p $R
T0=$(date +%s)
python3 -m pytest tests/kernels/test_latent_decode.py tests/kernels/test_latent_launch.py -o addopts='' -m gpu --collect-only -q -p no:cacheprovider 2>/dev/null | grep '::' > $R/ids.txt
split -n r/4 $R/ids.txt $R/ids_
for f in $R/ids_a?; do timeout 200 python3 -m pytest -o addopts='' -m gpu -p no:cacheprovider -rA -q $(cat $f) > $f.log 2>&1 & done
timeout 200 python3 -m pytest tests/kernels/test_latent_gluon.py -m gpu -p no:cacheprovider -rA -q > $R/gluon_tests.log 2>&1 &
wait
echo "tests done after $(( $(date +%s) - T0 )) s" | tee $R/tests_time.txt
wc -l $R/ids.txt; tail -qn 1 $R/ids_a?.log $R/gluon_tests.log
tar -czf $OUT/call44_tests.tgz -C /tmp call44t
PLAN=devrun/prefill_short_qwen.toml RUN=devrun/p44 bash devrun/kg.sh call44 $(( 575 - ($(date +%s) - T0) )) 'shape-qwen2.5-7b-8/base*' 'shape-qwen2.5-7b-8/palu*'
grep -h "done\|rc " /tmp/call44/lane*.log
cp devrun/call44.sh devrun/prefill_short_qwen.toml /tmp/call44/ && tar -czf $OUT/call44.tgz -C /tmp call44
