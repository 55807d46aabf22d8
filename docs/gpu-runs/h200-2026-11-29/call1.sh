#!/bin/bash
# call 1 (issue 49): install; every gpu/gh200 test with junit; bandwidth -> the H200's measured profile; dynamic
# tiers with CUDA graphs against all-resident, all-streamed and static splits on the 8B shape; resident decode
# defaults (layers fused up to 64 rows, PDL, async scheduling) at batch 1 / 8 / 64. Checkpoints for call 2 are
# written in the background on cores 12-15.
export PYTHONUNBUFFERED=1 TRITON_INTERPRET=0
R=/tmp/r; mkdir -p $R; C=/tmp/gh200rt-validate; mkdir -p $C
(nvidia-smi; nproc; free -g; lscpu | head -20; python3 -c "import torch,triton;print(torch.__version__,triton.__version__)") > $R/machine.txt 2>&1
python3 -m pip freeze > $R/host-freeze.txt 2>/dev/null
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > $R/install.log 2>&1 || { cat $R/install.log; exit 1; }
export PYTHONPATH=/tmp/site
python3 -m pip install --no-index --no-deps --no-build-isolation --no-cache-dir . >> $R/install.log 2>&1 || { tail -20 $R/install.log; exit 1; }
echo "installed at ${SECONDS}s"
cd /tmp && python3 -c "import gh200rt, gh200rt.kernels; print('gh200rt from', gh200rt.__file__)"; cd - >/dev/null
(taskset -c 12-15 python3 scripts/random_checkpoint.py llama3-8b $C/llama3-8b-random > $R/checkpoint.log 2>&1; echo "8b done at ${SECONDS}s" >> $R/checkpoint.log) &
W=$!
N=""; python3 -c "import xdist" 2>/dev/null && N="-n 6"
timeout 200 python3 -m pytest -q -rs -m "gpu or gh200" -p no:cacheprovider $N --timeout 100 --durations 15 \
  --junit-xml $R/gpu_tests.xml tests > $R/gpu_tests.log 2>&1
echo "gpu tests rc=$? at ${SECONDS}s"; grep -E "^(FAILED|ERROR)|passed|failed" $R/gpu_tests.log | head -40
wait $W; tail -1 $R/checkpoint.log
timeout 50 python3 -m gh200rt.bench bandwidth --readers gpu-copy-h2d,gpu-host-gemm,cpu-linear,cpu-gemm \
  --sizes-mib 64 256 1024 --repeats 3 --no-plot --out $R/bandwidth --profile-out $R/measured_profile.json > $R/bandwidth.log 2>&1
echo "bandwidth rc=$? at ${SECONDS}s"; tail -25 $R/bandwidth.log
(for s in qwen3-30b-a3b-8l deepseek-v3-cut; do taskset -c 12-15 python3 scripts/random_checkpoint.py $s $C/$s > $R/checkpoint_$s.log 2>&1; echo "$s done at ${SECONDS}s" >> $R/checkpoint.log; done) &
L="--random-model llama3-8b --random-model-dir $C/llama3-8b-random"
timeout 150 python3 -m gh200rt.bench tiers $L --engines resident,streamed,static-8,static-16,dynamic --quiet-seconds 2 \
  --burst-requests 24 --burst-seconds 0.5 --quiet-tokens 8 --burst-tokens 32 --json $R/tiers_8b.json > $R/tiers_8b.log 2>&1
echo "tiers rc=$? at ${SECONDS}s"; grep -vE "Warning|warn" $R/tiers_8b.log | tail -8
LEFT=$((548-SECONDS))
timeout $LEFT python3 -m gh200rt.bench latency --tokens 16 $L --batches 1,8,64 --placements resident --layer-path both \
  --fused-decode-rows 64 --pdl both --async-scheduling both --json $R/decode_defaults.json > $R/decode_defaults.log 2>&1
echo "decode defaults rc=$? at ${SECONDS}s"; grep -vE "UserWarning|_warn_once" $R/decode_defaults.log | tail -40
tail -2 $R/checkpoint.log
tar czf $OUT/report.tgz -C /tmp r --exclude='*.safetensors'
echo "done at ${SECONDS}s"
