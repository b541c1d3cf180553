#!/bin/bash
# call 49: the capacity pair of key and value groups of 2 (plans/palu-capacity-keygroup2-values2.toml, Llama-3-8B
# shape, 32k context, this H200's free memory), dense and PaLU on one machine, with the Gluon kernel's occupancy
# launch (latent_gluon.OCCUPANCY_LAUNCH: 64-token tiles, two programs a multiprocessor, where it holds as many KV
# heads as the 128-token launch; call 48). Call 41 read 262 sequences at 66.0 ms (1.46x dense's tokens/s)
# devrun/kg.sh was ../call38/kg.sh, unchanged
PLAN=plans/palu-capacity-keygroup2-values2.toml RUN=devrun/capkg2v2 bash devrun/kg.sh call49 575 'shape-llama3-8b-8/base*' 'shape-llama3-8b-8/palu*'
