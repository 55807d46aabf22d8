#!/bin/bash
# call 2 (session 3): split-attention tests (tf32 tolerance), host_gemm gpu tests with the M>1 tiles, skinny int8/int4
# sweep against the new own choice, 8B decode with per-kernel device times (resident b1/8/64, int4 direct b1/8)
export PYTHONUNBUFFERED=1 TRITON_INTERPRET=0
R=/tmp/r; mkdir -p $R
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > $R/install.log 2>&1 || { cat $R/install.log; exit 1; }
export PYTHONPATH=/tmp/site
python3 -m pip install --no-index --no-deps --no-build-isolation --no-cache-dir . >> $R/install.log 2>&1 || { tail -20 $R/install.log; exit 1; }
echo "installed at ${SECONDS}s"
C=/tmp/gh200rt-validate/llama3-8b-random
(python3 scripts/random_checkpoint.py llama3-8b $C > $R/checkpoint.log 2>&1; echo "checkpoint done at ${SECONDS}s" >> $R/checkpoint.log) &
W=$!
timeout 60 python3 -m pytest -q -rs -m gpu -p no:cacheprovider --timeout 50 tests/gpu/test_gpu_split_attention.py \
  tests/kernels/test_gpu_kernels.py tests/gpu/test_gpu_device_view.py > $R/tests.log 2>&1
echo "tests rc=$? at ${SECONDS}s"; grep -E "^(FAILED|ERROR)|passed|failed" $R/tests.log | head -12
timeout 60 python3 scripts/bench_gpu_skinny.py --formats int8,int4 --layers qkv,down --json $R/skinny.json > $R/skinny.log 2>&1
echo "skinny rc=$? at ${SECONDS}s"; grep -E "own choice|fastest" -A0 $R/skinny.log; sed -n '/fastest per case/,$p' $R/skinny.log
wait $W; tail -1 $R/checkpoint.log
D="python3 scripts/bench_decode.py --tokens 16 --random-model llama3-8b --random-model-dir $C"
timeout 70 $D --batches 1,8,64 --placements resident --kernel-times 14 --json $R/decode_bf16.json > $R/decode_bf16.log 2>&1
echo "decode bf16 rc=$? at ${SECONDS}s"; grep -vE "UserWarning|_warn_once" $R/decode_bf16.log | tail -52
LEFT=$((245-SECONDS))
timeout $LEFT $D --batches 1,8 --placements direct --host-weight-dtype int4 --kernel-times 6 --json $R/decode_int4.json > $R/decode_int4.log 2>&1
echo "decode int4 rc=$? at ${SECONDS}s"; grep -vE "UserWarning|_warn_once" $R/decode_int4.log | tail -18
tar czf $OUT/report.tgz -C /tmp r
echo "done at ${SECONDS}s"
