nvidia-smi --query-gpu=index,name,uuid --format=csv > $OUT/gpu.txt; cat $OUT/gpu.txt
grep -q "H100" $OUT/gpu.txt || { echo "not an H100 host"; exit 3; }
git rev-parse HEAD > $OUT/tree.txt; git status --short >> $OUT/tree.txt
rm -f /tmp/lanes.done /tmp/lanes.txt; setsid nohup bash devrun/lanes.sh > /tmp/lanes.out 2>&1 < /dev/null &
for t in $(seq 1 116); do [ -f /tmp/lanes.done ] && break; sleep 5; done
cat /tmp/lanes.txt; tail -3 /tmp/*.log | cut -c1-200
