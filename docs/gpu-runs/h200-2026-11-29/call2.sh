#!/bin/bash
# call 2 (issue 49), on the warm machine of call 1: this wave's paths on the card: the host KV tier on multi-turn
# conversations (8B shape), n-gram speculation with every layer streamed (8B shape), MoE decode per expert tier at
# batch 1 / 8 / 64 (Qwen3-30B-A3B's layers, 8 of them), DeepSeek-V3's layers with experts resident / direct /
# streamed / on the host's cores.
export PYTHONUNBUFFERED=1 TRITON_INTERPRET=0
R=/tmp/r2; mkdir -p $R; C=/tmp/gh200rt-validate
if [ ! -d /tmp/site ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > $R/install.log 2>&1 || exit 1
fi
export PYTHONPATH=/tmp/site
python3 -m pip install --no-index --no-deps --no-build-isolation --no-cache-dir . >> $R/install.log 2>&1 || { tail -20 $R/install.log; exit 1; }
echo "installed at ${SECONDS}s"; tail -3 /tmp/r/checkpoint.log 2>/dev/null
for s in llama3-8b qwen3-30b-a3b-8l deepseek-v3-cut; do [ -f $C/$s*/random_checkpoint.json ] || echo "no checkpoint $s yet"; done
D=$C/llama3-8b-random
timeout 60 python3 -m gh200rt.bench multi-turn --model $D --conversations 8 --turns 3 --output-tokens 32 > $R/multi_turn_8b.log 2>&1
echo "multi-turn rc=$? at ${SECONDS}s"; tail -6 $R/multi_turn_8b.log
timeout 60 python3 -m gh200rt.bench latency --tokens 8 --random-model qwen3-30b-a3b-8l --random-model-dir $C/qwen3-30b-a3b-8l \
  --placements resident,experts-direct,experts-stream --batches 1,8,64 --json $R/decode_qwen3_moe.json > $R/decode_qwen3_moe.log 2>&1
echo "qwen3 moe rc=$? at ${SECONDS}s"; grep -vE "UserWarning|_warn_once" $R/decode_qwen3_moe.log | tail -14
timeout 50 python3 -m gh200rt.bench latency --tokens 8 --random-model deepseek-v3-cut --random-model-dir $C/deepseek-v3-cut \
  --placements resident,experts-direct,experts-stream,experts-cpu --batches 1,8 --json $R/decode_deepseek.json > $R/decode_deepseek.log 2>&1
echo "deepseek rc=$? at ${SECONDS}s"; grep -vE "UserWarning|_warn_once" $R/decode_deepseek.log | tail -12
LEFT=$((190-SECONDS))
timeout $LEFT python3 -m gh200rt.bench speculative --model $D --offload stream --prompts 4 --output-tokens 32 --batch 4 \
  --json $R/speculative_streamed.json > $R/speculative_streamed.log 2>&1
echo "speculative rc=$? at ${SECONDS}s"; tail -5 $R/speculative_streamed.log
tar czf $OUT/report2.tgz -C /tmp r2
echo "done at ${SECONDS}s"
