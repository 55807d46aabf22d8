#!/bin/bash
# call 3: is the graph-replay segfault the GEMV's? then the gpu tests the crash cut off
export PYTHONUNBUFFERED=1 TRITON_INTERPRET=0
R=/tmp/r; mkdir -p $R
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > $R/install.log 2>&1 || { cat $R/install.log; exit 1; }
export PYTHONPATH=/tmp/site
python3 -m pip install --no-index --no-deps --no-build-isolation --no-cache-dir . >> $R/install.log 2>&1 || { tail -20 $R/install.log; exit 1; }
echo "installed at ${SECONDS}s"
T=tests/gpu/test_gpu_transfer.py
P="-q -rA -p no:cacheprovider --timeout 60"
timeout 50 python3 -m pytest $P -m gpu $T -k "cuda_graphs or interleaved" > $R/t_gemv.log 2>&1; echo "graph tests with gemv rc=$? at ${SECONDS}s"; grep -E "^(PASSED|FAILED|ERROR)|passed|failed|Fatal|line [0-9]+ in test_" $R/t_gemv.log | head -12
timeout 50 python3 .whl/no_gemv.py $P -m gpu $T -k "cuda_graphs or interleaved" > $R/t_nogemv.log 2>&1; echo "graph tests without gemv rc=$? at ${SECONDS}s"; grep -E "^(PASSED|FAILED|ERROR)|passed|failed|Fatal|line [0-9]+ in test_" $R/t_nogemv.log | head -12
LEFT=$((215-SECONDS))
timeout $LEFT python3 -m pytest -q -rs -p no:cacheprovider --timeout 60 -m "gpu or gh200" --junit-xml $R/rest.xml \
  --deselect $T::test_streamed_decode_under_cuda_graphs --deselect $T::test_eager_steps_interleaved_with_replays_without_synchronising \
  $T tests/gpu/test_gpu_upcast.py tests/graphs tests/kernels tests/lora tests/model tests/numa tests/server tests/tiers tests/unit > $R/rest.log 2>&1
echo "rest of the gpu tests rc=$? at ${SECONDS}s"; grep -E "^(FAILED|ERROR)|Fatal|line [0-9]+ in test_" $R/rest.log | head -20; tail -2 $R/rest.log
tar czf $OUT/report.tgz -C /tmp r
echo "done at ${SECONDS}s"
