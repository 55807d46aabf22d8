#!/bin/bash
# call 3 (issue 49): after the fixes of calls 1-2: detected GPUs keep the profile's host-core figures (the cpu
# expert tier's limit), async scheduling and PDL on by default on the card: every gpu/gh200 test again; where the
# device bytes left after an engine closes come from (leak_probe.py); DeepSeek-V3's layers with cpu-tier experts
# against streamed ones; n-gram speculation over 8 streamed layers of the 8B shape.
export PYTHONUNBUFFERED=1 TRITON_INTERPRET=0
R=/tmp/r3; mkdir -p $R; C=/tmp/gh200rt-validate; mkdir -p $C
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > $R/install.log 2>&1 || { cat $R/install.log; exit 1; }
export PYTHONPATH=/tmp/site
python3 -m pip install --no-index --no-deps --no-build-isolation --no-cache-dir . >> $R/install.log 2>&1 || { tail -20 $R/install.log; exit 1; }
echo "installed at ${SECONDS}s"
(taskset -c 12-15 python3 scripts/random_checkpoint.py deepseek-v3-cut $C/deepseek-v3-cut > $R/checkpoint.log 2>&1
 taskset -c 12-15 python3 scripts/random_checkpoint.py llama3-8b $C/llama3-8b-8l --num-layers 8 >> $R/checkpoint.log 2>&1
 echo "checkpoints done at ${SECONDS}s" >> $R/checkpoint.log) &
W=$!
N=""; python3 -c "import xdist" 2>/dev/null && N="-n 6"
timeout 140 python3 -m pytest -q -rs -m "gpu or gh200" -p no:cacheprovider $N --timeout 100 --durations 10 \
  --junit-xml $R/gpu_tests.xml tests > $R/gpu_tests.log 2>&1
echo "gpu tests rc=$? at ${SECONDS}s"; grep -E "^(FAILED|ERROR)|passed|failed" $R/gpu_tests.log | head -30
PYTHONPATH=/tmp/site:. timeout 40 python3 docs/gpu-runs/h200-2026-11-29/leak_probe.py none none none stream > $R/leak_probe.log 2>&1
echo "leak probe rc=$? at ${SECONDS}s"; grep -vE "Warn|warn" $R/leak_probe.log | tail -40
wait $W; tail -1 $R/checkpoint.log
timeout 40 python3 -m gh200rt.bench latency --tokens 8 --random-model deepseek-v3-cut --random-model-dir $C/deepseek-v3-cut \
  --placements experts-stream,experts-cpu --batches 1,8 --json $R/decode_deepseek_cpu.json > $R/decode_deepseek_cpu.log 2>&1
echo "deepseek rc=$? at ${SECONDS}s"; grep -vE "UserWarning|_warn_once" $R/decode_deepseek_cpu.log | tail -10
LEFT=$((300-SECONDS))
timeout $LEFT python3 -m gh200rt.bench speculative --model $C/llama3-8b-8l --offload stream --prompts 4 --output-tokens 32 \
  --batch 4 --json $R/speculative_streamed.json > $R/speculative_streamed.log 2>&1
echo "speculative rc=$? at ${SECONDS}s"; grep -v "does not fit" $R/speculative_streamed.log | tail -5
tar czf $OUT/report3.tgz -C /tmp r3
echo "done at ${SECONDS}s"
