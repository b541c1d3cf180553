#!/bin/bash
# ncu profiles of the latent decode kernel (issue 34): where the G4 kernel's time goes
set -x
export PYTHONPATH=src
R=$OUT/ncu; mkdir -p $R
nvidia-smi > $R/gpu.txt 2>&1; ncu --version >> $R/gpu.txt 2>&1
git log -1 --format=%H >> $R/gpu.txt 2>/dev/null; git status --short >> $R/gpu.txt 2>/dev/null
T=benchmarks/tools/gpu_latent_ncu.py
run() { name=$1; shift
  timeout 150 ncu --clock-control none --set full --import-source yes -k regex:_latent_flash_kernel --launch-skip 2 --launch-count 1 \
     -f -o $R/$name python3 $T "$@" > $R/$name.log 2>&1
  ncu -i $R/$name.ncu-rep --page details --csv > $R/${name}_details.csv 2>>$R/$name.log
  ncu -i $R/$name.ncu-rep --page raw --csv > $R/${name}_raw.csv 2>>$R/$name.log
  ncu -i $R/$name.ncu-rep --page source --csv --print-source sass > $R/${name}_sass.csv 2>>$R/$name.log
  python3 $T "$@" --calls 20 > $R/${name}_time.json 2>>$R/$name.log
}
run llama_g4_b16 --model llama3-8b --group 4 --batch 16 --kv 32768
run llama_g4_b64 --model llama3-8b --group 4 --batch 64 --kv 32768
run qwen_g4_b64 --model qwen2.5-7b --group 4 --batch 64 --kv 32768
run llama_g1_b64 --model llama3-8b --group 1 --v-group 4 --batch 64 --kv 32768
ls -la $R
cd $OUT && tar czf ncu.tgz ncu && rm -rf ncu/*.ncu-rep
du -sh $OUT/*
