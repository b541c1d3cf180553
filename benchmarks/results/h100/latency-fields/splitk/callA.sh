set -x
nvidia-smi --query-gpu=index,name --format=csv > $OUT/gpu.txt
export PYTHONPATH=src PYTHONUNBUFFERED=1
timeout 200 python3 devrun/bias_probe.py > $OUT/bias_probe.log 2>&1; echo "probe rc $?"
timeout 300 python3 -m gac bench latent_attention --out /tmp/lb > $OUT/latent_bench.log 2>&1; echo "bench rc $?"
tar czf $OUT/callA.tgz -C /tmp lb 2>/dev/null; ls -la $OUT; tail -5 $OUT/bias_probe.log $OUT/latent_bench.log
