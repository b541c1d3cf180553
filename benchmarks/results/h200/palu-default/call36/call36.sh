#!/bin/bash
# call 36: the final tree of the last session on the GPU (Gluon GPU tests, the latent kernels' GPU tests), the H200
# latent_attention class re-timed with the Gluon kernel as the default path runs it, and the kernel alone at key
# groups 1 and 2 (Gluon against Triton: the Gluon kernel was only timed at key group 4)
export PYTHONPATH=src PYTHONUNBUFFERED=1
R=$OUT/call36; mkdir -p $R
nvidia-smi > $R/gpu.txt 2>&1
python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)" >> $R/gpu.txt 2>&1
T0=$(date +%s)
timeout 150 python3 -m pytest tests/kernels/test_latent_gluon.py -m gpu -p no:cacheprovider -rA -q > $R/gluon_tests.log 2>&1
echo "rc $? after $(( $(date +%s) - T0 )) s" >> $R/gluon_tests.log
timeout 150 python3 -m pytest tests/kernels/test_latent_decode.py tests/kernels/test_latent_launch.py tests/hardware/test_latent_pricing.py -m gpu -p no:cacheprovider -q -x > $R/latent_tests.log 2>&1
echo "rc $? after $(( $(date +%s) - T0 )) s" >> $R/latent_tests.log
timeout 170 python3 benchmarks/tools/gpu_launch_constants.py --fields latent_attention \
  --profile src/gac/profiles/h200-bfloat16.json --out $R/h200-bfloat16.json > $R/latent_class.log 2>&1
echo "rc $? after $(( $(date +%s) - T0 )) s" >> $R/latent_class.log
run() {  # model groups seconds
  tag=$1_G$2
  timeout $3 python3 benchmarks/tools/gpu_latent_kernel.py --table --gluon --auto-splits \
    --models $1 --groups $2 --batches 16,64 --lengths 16384,32768 --budget-s $(( $3 - 25 )) \
    --out $R/kernel_$tag.json > $R/kernel_$tag.log 2>&1
  echo "rc $? after $(( $(date +%s) - T0 )) s" >> $R/kernel_$tag.log
}
run llama3-8b 1,2 80
run qwen2.5-7b 1,2 80
cd $OUT && tar czf call36.tgz call36 && rm -rf call36
