#!/bin/bash
# call 1 (session 3): speed kit (gpu tests incl. the graph-event fix, tiled attention vs old walk, 8B decode bf16,
# int4 direct with HBM / host scales), skinny tile sweep, int8 direct
export PYTHONUNBUFFERED=1 TRITON_INTERPRET=0
R=/tmp/r; mkdir -p $R
(nvidia-smi; nproc; free -g; python3 -c "import torch,triton;print(torch.__version__,triton.__version__)") > $R/machine.txt 2>&1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > $R/install.log 2>&1 || { cat $R/install.log; exit 1; }
export PYTHONPATH=/tmp/site
python3 -m pip install --no-index --no-deps --no-build-isolation --no-cache-dir . >> $R/install.log 2>&1 || { tail -20 $R/install.log; exit 1; }
echo "installed at ${SECONDS}s"
C=/tmp/gh200rt-validate
(python3 scripts/random_checkpoint.py llama3-8b $C/llama3-8b-random > $R/checkpoint.log 2>&1; echo "checkpoint done at ${SECONDS}s" >> $R/checkpoint.log) &
W=$!
timeout 150 python3 scripts/validate_gpu.py --kit speed --out $R/kernels --cache $C --budget-s 140 \
  --skip "kernel compile check" --skip "host_gemm timings" --skip "decode Llama-3-8B shape, bf16" --skip "decode Llama-3-8B shape, quantized direct"
echo "kernels part ended at ${SECONDS}s"
timeout 100 python3 scripts/bench_gpu_skinny.py --formats bf16,int4 --layers qkv,down --json $R/skinny.json > $R/skinny.log 2>&1
echo "skinny rc=$? at ${SECONDS}s"; sed -n '/fastest/,$p' $R/skinny.log | head -30
wait $W; tail -1 $R/checkpoint.log
timeout 160 python3 scripts/validate_gpu.py --kit speed --out $R/decode --cache $C --budget-s 150 \
  --skip "kernel compile check" --skip "decode kernels' gpu tests" --skip "paged attention timings" --skip "host_gemm timings"
echo "decode part ended at ${SECONDS}s"
LEFT=$((445-SECONDS))
if [ $LEFT -gt 30 ]; then
  timeout $LEFT python3 scripts/bench_decode.py --tokens 16 --random-model llama3-8b --random-model-dir $C/llama3-8b-random \
    --batches 1 --placements direct --host-weight-dtype int8 --json $R/decode_int8.json > $R/decode_int8.log 2>&1
  echo "int8 direct rc=$? at ${SECONDS}s"; grep -E "^(direct) " $R/decode_int8.log
fi
tar czf $OUT/report.tgz -C /tmp r
cp $R/kernels/report.md $OUT/kernels_report.md 2>/dev/null; cp $R/decode/report.md $OUT/decode_report.md 2>/dev/null
echo "done at ${SECONDS}s"
