#!/bin/bash
# one device call: install, kernel timings + gpu tests while the 8B checkpoint is written, decode, whole gpu suite
export PYTHONUNBUFFERED=1
R=/tmp/r; mkdir -p $R
(nvidia-smi; nproc; free -g; python3 -c "import torch,triton;print(torch.__version__,triton.__version__)") > $R/machine.txt 2>&1
python3 -m pip freeze > $R/host-freeze.txt 2>&1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > $R/install.log 2>&1 || { cat $R/install.log; exit 1; }
export PYTHONPATH=/tmp/site
python3 -m pip install --no-index --no-deps --no-build-isolation --no-cache-dir . >> $R/install.log 2>&1 || { tail -20 $R/install.log; exit 1; }
echo "installed at ${SECONDS}s"
C=/tmp/gh200rt-validate
(python3 scripts/random_checkpoint.py llama3-8b $C/llama3-8b-random > $R/checkpoint.log 2>&1; echo "checkpoint done at ${SECONDS}s" >> $R/checkpoint.log) &
W=$!
timeout 240 python3 scripts/validate_gpu.py --kit speed --out $R/kernels --cache $C --budget-s 225 \
  --skip "kernel compile check" --skip "decode Llama-3-8B shape, bf16" --skip "decode Llama-3-8B shape, quantized direct"
echo "kernels part ended at ${SECONDS}s"; wait $W; cat $R/checkpoint.log | tail -3
timeout 215 python3 scripts/validate_gpu.py --kit speed --out $R/decode --cache $C --budget-s 205 \
  --skip "kernel compile check" --skip "decode kernels' gpu tests" --skip "paged attention timings" --skip "host_gemm timings"
echo "decode part ended at ${SECONDS}s"
LEFT=$((545-SECONDS))
if [ $LEFT -gt 30 ]; then
  timeout $LEFT python3 -m pytest -q -rs -m "gpu or gh200" -p no:cacheprovider --timeout 60 --junit-xml $R/all_gpu.xml \
    --ignore tests/gpu/test_gpu_split_attention.py --ignore tests/gpu/test_gpu_model_kernels.py \
    --ignore tests/kernels/test_gpu_kernels.py --ignore tests/gpu/test_gpu_decode_graphs.py tests > $R/all_gpu.log 2>&1
  echo "gpu suite rc=$? at ${SECONDS}s"; tail -25 $R/all_gpu.log
fi
tar czf $OUT/report.tgz -C /tmp r
cp $R/kernels/report.md $OUT/kernels_report.md 2>/dev/null; cp $R/decode/report.md $OUT/decode_report.md 2>/dev/null
echo "done at ${SECONDS}s"
