set -x
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv > $OUT/gpu.txt
python -c "import torch,triton,transformers;print(torch.__version__,triton.__version__,transformers.__version__)" >> $OUT/gpu.txt
K="timeout 95 env PYTHONPATH=src python3 benchmarks/tools/gpu_latent_kernel.py --groups 4 --batches 16,64 --lengths 4096,32768 --auto-splits"
for rr in "256 256" "128 384"; do
  set -- $rr
  $K --table --rank-k $1 --rank-v $2 --out $OUT/paired_k$1.json 2>&1 | tail -9
  $K --table --rank-k $1 --rank-v $2 --unpaired --out $OUT/unpaired_k$1.json 2>&1 | tail -9
done
$K --models llama3-8b --rank-k 256 --rank-v 256 --configs "128,128,8,2,2;128,256,8,2,2" --out $OUT/paired_k256_br_llama.json 2>&1 | tail -5
$K --models qwen2.5-7b --rank-k 256 --rank-v 256 --configs "128,128,8,2,2,1,0,2;128,128,8,3,2,1,0,2" --out $OUT/paired_k256_br_qwen.json 2>&1 | tail -5
