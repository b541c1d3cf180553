#!/bin/bash
# call 56: the default key group's decode grid on the Llama-3-8B shape (plans/palu-default-decode.toml: palu-default's
# decode points, no prefill), dense and PaLU on one machine, with the two-warpgroup launch the default at key rank 128
# from two sequences (call 54). devrun/kg.sh is ../call38/kg.sh, unchanged
PLAN=plans/palu-default-decode.toml RUN=devrun/pdd bash devrun/kg.sh call56 400 'shape-llama3-8b-8/base*' 'shape-llama3-8b-8/palu*'
grep -h "rc " /tmp/call56/lane*.log
