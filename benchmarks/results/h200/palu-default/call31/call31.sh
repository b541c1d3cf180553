#!/bin/bash
# call 31: the Gluon kernel as the default where it serves: its GPU tests (kernel and model), and the latent kernel's
# other GPU tests with it in place
export PYTHONPATH=src
R=$OUT/call31; mkdir -p $R
nvidia-smi > $R/gpu.txt 2>&1
python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)" >> $R/gpu.txt 2>&1
timeout 110 python3 -m pytest tests/kernels/test_latent_gluon.py -m gpu -q -p no:cacheprovider -x > $R/gluon_tests.log 2>&1
echo "rc $?" >> $R/gluon_tests.log
timeout 170 python3 -m pytest tests/kernels/test_latent_decode.py tests/kernels/test_latent_launch.py -m gpu -q -p no:cacheprovider > $R/latent_tests.log 2>&1
echo "rc $?" >> $R/latent_tests.log
cd $OUT && tar czf call31.tgz call31 && rm -rf call31
