for t in $(seq 1 112); do [ -f /tmp/lanes.done ] && break; sleep 5; done
ls /tmp/lanes.done; cat /tmp/lanes.txt
cp /tmp/lanes.txt /tmp/ref0.log $OUT/; cat /tmp/svd-llm-*.log /tmp/asvd-*.log > $OUT/lanes.log
tar czf $OUT/callC.tgz -C /tmp ref0 svd-llm-shape-qwen2.5-7b-8 asvd-shape-llama3-8b-8 plan-svd-llm-shape-qwen2.5-7b-8.toml plan-asvd-shape-llama3-8b-8.toml 2>/dev/null; ls -la $OUT
