#!/bin/bash
# call 52: the capacity pair of key and value groups of 2 (plans/palu-capacity-keygroup2-values2.toml, Llama-3-8B
# shape, 32k context, this H200's free memory), dense and PaLU on one machine, with the Gluon kernel's occupancy
# launch (latent_gluon.OCCUPANCY_LAUNCH) and value tiles below 256 columns in two boxes (latent_gluon.VALUE_SPLIT;
# call 51). Call 49 read 262 sequences at 59.7 ms (1.59x dense's tokens/s) without the split values
# devrun/kg.sh was ../call38/kg.sh, unchanged
PLAN=plans/palu-capacity-keygroup2-values2.toml RUN=devrun/capkg2v2b bash devrun/kg.sh call52 520 'shape-llama3-8b-8/base*' 'shape-llama3-8b-8/palu*'
