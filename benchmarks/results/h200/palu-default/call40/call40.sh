#!/bin/bash
# call 40: the current tree's Gluon GPU tests (the `slower` policy, the Qwen3 model test at key group 2, the key-group-1
# test, never run on a GPU), then plans/palu-keygroup2-values2.toml on the Qwen2.5-7B shape (dense and PaLU, one machine)
export PYTHONPATH=src PYTHONUNBUFFERED=1
R=/tmp/call40t; mkdir -p $R
git rev-parse HEAD > $R/tree.txt 2>&1
T0=$(date +%s)
timeout 110 python3 -m pytest tests/kernels/test_latent_gluon.py -m gpu -p no:cacheprovider -rA -q > $R/gluon_tests.log 2>&1
echo "rc $? after $(( $(date +%s) - T0 )) s" >> $R/gluon_tests.log
tail -3 $R/gluon_tests.log
tar -czf $OUT/call40_tests.tgz -C /tmp call40t
PLAN=plans/palu-keygroup2-values2.toml RUN=devrun/kg2v2q bash devrun/kg.sh call40 $(( 575 - ($(date +%s) - T0) )) 'shape-qwen2.5-7b-8/base*' 'shape-qwen2.5-7b-8/palu*'
grep -h "done\|rc " /tmp/call40/lane*.log; tail -30 /tmp/call40/report.txt
