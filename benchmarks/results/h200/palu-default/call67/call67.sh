#!/bin/bash
# call 67: the default decode grid on the Llama-3-8B shape (plans/palu-default-decode.toml), dense and PaLU on one
# machine, with --align gac's new default: key and value ranks capped where the profile's latent_attention class timed
# the decode kernel change (keys 128, values 384 at key group 4 on h200-bfloat16, cb99c47). devrun/kg.sh is
# ../call38/kg.sh, unchanged
PLAN=plans/palu-default-decode.toml RUN=devrun/pdd67 bash devrun/kg.sh call67 440 'shape-llama3-8b-8/base*' 'shape-llama3-8b-8/palu*'
grep -h "rc " /tmp/call67/lane*.log
