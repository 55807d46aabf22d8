#!/bin/bash
# call 3 (session 3): gpu tests of the fixed M > 1 tiles and split tolerance; 8B int4 engine start on 16 cores after
# the load-time pool change; where the host's share of a batch-8/64 resident step goes (--host-profile)
export PYTHONUNBUFFERED=1 TRITON_INTERPRET=0
R=/tmp/r; mkdir -p $R
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > $R/install.log 2>&1 || { cat $R/install.log; exit 1; }
export PYTHONPATH=/tmp/site
python3 -m pip install --no-index --no-deps --no-build-isolation --no-cache-dir . >> $R/install.log 2>&1 || { tail -20 $R/install.log; exit 1; }
echo "installed at ${SECONDS}s"
C=/tmp/gh200rt-validate/llama3-8b-random
(python3 scripts/random_checkpoint.py llama3-8b $C > $R/checkpoint.log 2>&1; echo "checkpoint done at ${SECONDS}s" >> $R/checkpoint.log) &
W=$!
timeout 50 python3 -m pytest -q -rs -m gpu -p no:cacheprovider --timeout 40 tests/kernels/test_gpu_kernels.py \
  tests/gpu/test_gpu_split_attention.py > $R/tests.log 2>&1
echo "tests rc=$? at ${SECONDS}s"; grep -E "^(FAILED|ERROR)|passed|failed" $R/tests.log | head -8
wait $W; tail -1 $R/checkpoint.log
timeout 110 python3 scripts/bench_quant_load.py --engine-start --checkpoint $C --formats int4 > $R/quant_load.log 2>&1
echo "quant load rc=$? at ${SECONDS}s"; grep -v Warning $R/quant_load.log | tail -5
LEFT=$((240-SECONDS))
timeout $LEFT python3 scripts/bench_decode.py --tokens 16 --random-model llama3-8b --random-model-dir $C --batches 8,64 \
  --placements resident --kernel-times 4 --host-profile 22 > $R/decode_host.log 2>&1
echo "decode rc=$? at ${SECONDS}s"; grep -vE "UserWarning|_warn_once" $R/decode_host.log | tail -60
tar czf $OUT/report.tgz -C /tmp r
echo "done at ${SECONDS}s"
