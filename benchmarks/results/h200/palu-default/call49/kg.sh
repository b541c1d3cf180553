#!/bin/bash
# one step of plans/palu-keygroup2.toml on the device: ./devrun/kg.sh CALL SECONDS 'only-pattern' ['only-pattern' ...]
# the run directory travels in devrun/kg2 (carried) and comes back in $OUT/CALL.tgz with the logs
export PYTHONPATH=src PYTHONUNBUFFERED=1 OMP_NUM_THREADS=8 CUDA_VISIBLE_DEVICES=0
C=$1; S=$2; shift 2
R=/tmp/$C; mkdir -p $R
nvidia-smi --query-gpu=index,name,uuid,clocks.sm,temperature.gpu --format=csv > $R/gpu.txt
python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)" >> $R/gpu.txt
mkdir -p /tmp/gc0; cp -r .gaccache/. /tmp/gc0/; export GAC_CACHE=/tmp/gc0
mkdir -p ${RUN:-devrun/kg2}
T0=$(date +%s); i=0
for pat in "$@"; do
  left=$(( S - ($(date +%s) - T0) ))
  timeout $left python3 -m gac run ${PLAN:-plans/palu-keygroup2.toml} --out ${RUN:-devrun/kg2} --only "$pat" > $R/lane$i.log 2>&1
  echo "rc $? after $(( $(date +%s) - T0 )) s" >> $R/lane$i.log
  i=$((i+1))
done
python3 -m gac report ${RUN:-devrun/kg2} > $R/report.txt 2>&1
cp -r ${RUN:-devrun/kg2} $R/
tar -czf $OUT/$C.tgz -C /tmp $C
