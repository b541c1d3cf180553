#!/bin/bash
# call 68: the default decode grid on the Qwen2.5-7B shape (plans/palu-default-decode.toml), dense and PaLU on one
# machine, with --align gac's new default: key and value ranks capped where the profile's latent_attention class timed
# the decode kernel change (keys 128, values 384 at key group 4 on h200-bfloat16, cb99c47). devrun/kg.sh is
# ../call38/kg.sh, unchanged
PLAN=plans/palu-default-decode.toml RUN=devrun/pdd68 bash devrun/kg.sh call68 440 'shape-qwen2.5-7b-8/base*' 'shape-qwen2.5-7b-8/palu*'
grep -h "rc " /tmp/call68/lane*.log
