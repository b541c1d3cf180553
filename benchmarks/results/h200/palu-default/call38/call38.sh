#!/bin/bash
# call 38: plans/palu-keygroup2.toml's Llama-3-8B PaLU cell and both Qwen2.5-7B cells (call 37 ran the Llama dense cell)
bash devrun/kg.sh call38 555 'shape-llama3-8b-8/palu*' 'shape-qwen2.5-7b-8/base*' 'shape-qwen2.5-7b-8/palu*'
