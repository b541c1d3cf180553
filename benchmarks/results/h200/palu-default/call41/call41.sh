#!/bin/bash
# call 41: the capacity pair (dense and PaLU, key and value groups of 2), one machine. plans/palu-capacity-keygroup2.toml
# held then, uncommitted, what plans/palu-capacity-keygroup2-values2.toml holds now (plan name "palu-capacity-keygroup2");
# the committed file of that name (keys 2, values 4, the H100's run) was restored after the call
PLAN=plans/palu-capacity-keygroup2.toml RUN=devrun/capkg2 bash devrun/kg.sh call41 575 'shape-llama3-8b-8/base*' 'shape-llama3-8b-8/palu*'
grep -h "done\|rc " /tmp/call41/lane*.log; tail -30 /tmp/call41/report.txt
