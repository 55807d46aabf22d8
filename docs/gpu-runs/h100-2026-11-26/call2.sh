#!/bin/bash
# call 2: gemv tile sweep, decode after gemv, host_gemm before/after, whole gpu suite
export PYTHONUNBUFFERED=1 TRITON_INTERPRET=0
R=/tmp/r; mkdir -p $R
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > $R/install.log 2>&1 || { cat $R/install.log; exit 1; }
export PYTHONPATH=/tmp/site
python3 -m pip install --no-index --no-deps --no-build-isolation --no-cache-dir . >> $R/install.log 2>&1 || { tail -20 $R/install.log; exit 1; }
echo "installed at ${SECONDS}s"
C=/tmp/gh200rt-validate/llama3-8b-random
(python3 scripts/random_checkpoint.py llama3-8b $C > $R/checkpoint.log 2>&1; echo "checkpoint done at ${SECONDS}s" >> $R/checkpoint.log) &
W=$!
timeout 150 python3 scripts/bench_gpu_gemv.py --json $R/gemv.json > $R/gemv.log 2>&1; echo "gemv bench rc=$? at ${SECONDS}s"
sed -n '/fastest per case/,$p' $R/gemv.log
wait $W; tail -1 $R/checkpoint.log
D="python3 scripts/bench_decode.py --tokens 16 --random-model llama3-8b --random-model-dir $C"
timeout 60 $D --batches 1,8 --placements resident --json $R/decode_bf16.json > $R/decode_bf16.log 2>&1; echo "decode bf16 rc=$? at ${SECONDS}s"
grep -E "^(resident|stream|direct) " $R/decode_bf16.log
timeout 80 $D --batches 1 --placements direct --host-weight-dtype int4 --json $R/decode_int4.json > $R/decode_int4.log 2>&1; echo "decode int4 rc=$? at ${SECONDS}s"
grep -E "^(resident|stream|direct) " $R/decode_int4.log
timeout 45 python3 scripts/bench_gpu_host_gemm.py --json $R/host_gemm.json > $R/host_gemm.log 2>&1; echo "host_gemm bench rc=$? at ${SECONDS}s"
grep -E " (1|8) int4 " $R/host_gemm.log | head -24
LEFT=$((400-SECONDS))
timeout $LEFT python3 -m pytest -q -rs -m "gpu or gh200" -p no:cacheprovider --timeout 60 --junit-xml $R/all_gpu.xml tests > $R/all_gpu.log 2>&1
echo "gpu suite rc=$? at ${SECONDS}s"; grep -E "^(FAILED|ERROR)" $R/all_gpu.log | head -30; tail -3 $R/all_gpu.log
tar czf $OUT/report.tgz -C /tmp r
echo "done at ${SECONDS}s"
