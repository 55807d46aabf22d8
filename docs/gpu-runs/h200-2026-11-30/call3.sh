#!/bin/bash
# call 3 (issue 49): the host KV tier's gpu tests after the in-place test's fix (its case was written by the compiled
# store on CPU tensors); dynamic tiers against static splits with every engine warmed on the trace's prompt lengths
# first, in both orders, on a burst that wants more KV than all-resident has (48 x 384 tokens: 1,152 blocks against
# ~440), each request's latencies kept in the JSON.
export PYTHONUNBUFFERED=1 TRITON_INTERPRET=0
R=/tmp/r3; mkdir -p $R; C=/tmp/gh200rt-validate; mkdir -p $C
if [ ! -d /tmp/site ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > $R/install.log 2>&1 || exit 1
fi
export PYTHONPATH=/tmp/site
python3 -m pip install --no-index --no-deps --no-build-isolation --no-cache-dir . >> $R/install.log 2>&1 || { tail -20 $R/install.log; exit 1; }
echo "installed at ${SECONDS}s"
D=$C/llama3-8b-random
[ -f $D/random_checkpoint.json ] || (taskset -c 8-15 python3 scripts/random_checkpoint.py llama3-8b $D > $R/checkpoint.log 2>&1; echo "8b done at ${SECONDS}s" >> $R/checkpoint.log) &
W=$!
timeout 90 python3 -m pytest -q -rs -m gpu -p no:cacheprovider --timeout 80 --junit-xml $R/gpu_tests_kv.xml \
  tests/gpu/test_gpu_kv_offload.py > $R/gpu_tests_kv.log 2>&1
echo "kv gpu tests rc=$? at ${SECONDS}s"; grep -E "^(FAILED|ERROR)|passed|failed" $R/gpu_tests_kv.log | head
wait $W; tail -1 $R/checkpoint.log 2>/dev/null
T="python3 -m gh200rt.bench tiers --model $D --quiet-seconds 2 --burst-requests 48 --burst-seconds 0.5 --burst-prompt 320 \
  --burst-tokens 64 --quiet-tokens 8 --max-model-len 512 --max-num-seqs 64 --slo-ttft 2 --slo-tpot 0.15"
timeout 130 $T --engines resident,static-8,static-16,dynamic --json $R/tiers_a.json > $R/tiers_a.log 2>&1
echo "tiers (resident first) rc=$? at ${SECONDS}s"; grep -vE "Warning|warn" $R/tiers_a.log | cut -c1-330 | tail -5
LEFT=$((330-SECONDS))
timeout $LEFT $T --engines dynamic,static-16,static-8,resident --json $R/tiers_b.json > $R/tiers_b.log 2>&1
echo "tiers (dynamic first) rc=$? at ${SECONDS}s"; grep -vE "Warning|warn" $R/tiers_b.log | cut -c1-330 | tail -5
tar czf $OUT/report3.tgz -C /tmp r3
echo "done at ${SECONDS}s"
