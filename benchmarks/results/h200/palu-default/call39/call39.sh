#!/bin/bash
# call 39: plans/palu-keygroup2-values2.toml on the Llama-3-8B shape (dense and PaLU cells, one machine)
PLAN=plans/palu-keygroup2-values2.toml RUN=devrun/kg2v2 bash devrun/kg.sh call39 440 'shape-llama3-8b-8/base*' 'shape-llama3-8b-8/palu*'
