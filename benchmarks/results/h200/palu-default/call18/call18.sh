set -x
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv > $OUT/gpu.txt
python -c "import torch,triton,transformers;print(torch.__version__,triton.__version__,transformers.__version__)" >> $OUT/gpu.txt
PYTHONPATH=src timeout 500 python3 benchmarks/tools/gpu_latent_ablate.py --out $OUT/ablate.json --budget-s 420 2>&1 | tee $OUT/ablate.log
