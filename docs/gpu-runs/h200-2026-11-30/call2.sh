#!/bin/bash
# call 2 (issue 49), on call 1's warm machine: speculative decoding on the 8B shape cut to 8 layers, resident and
# with every layer streamed: the suffix method (the batched pass repeats the single pass's requests), a draft model
# that is the target itself (acceptance 1: what verifying k+1 tokens costs on a link-bound step), and an EAGLE-3
# head's drafting price; DeepSeek-V3's layers with the split latent kernel, experts in each tier.
export PYTHONUNBUFFERED=1 TRITON_INTERPRET=0
R=/tmp/r2; mkdir -p $R; C=/tmp/gh200rt-validate
if [ ! -d /tmp/site ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > $R/install.log 2>&1 || exit 1
  export PYTHONPATH=/tmp/site
  python3 -m pip install --no-index --no-deps --no-build-isolation --no-cache-dir . >> $R/install.log 2>&1 || exit 1
  taskset -c 8-15 python3 scripts/random_checkpoint.py llama3-8b $C/llama3-8b-8l --num-layers 8 > $R/checkpoint.log 2>&1
  (taskset -c 12-15 python3 scripts/random_checkpoint.py deepseek-v3-cut $C/deepseek-v3-cut >> $R/checkpoint.log 2>&1) &
fi
export PYTHONPATH=/tmp/site
echo "ready at ${SECONDS}s"; tail -1 /tmp/r/checkpoint2.log 2>/dev/null
M=$C/llama3-8b-8l
S="python3 -m gh200rt.bench speculative --model $M --prompts 4 --output-tokens 32 --batch 4"
SUFFIX='{"method": "suffix", "num_speculative_tokens": 8}'
SELF="{\"method\": \"draft_model\", \"model\": \"$M\", \"num_speculative_tokens\": 4}"
EAGLE="{\"method\": \"eagle3\", \"model\": \"$C/llama3-8b-eagle3\", \"num_speculative_tokens\": 3}"
timeout 60 $S --offload none --speculative-config "$SUFFIX" --json $R/spec_suffix_resident.json > $R/spec_suffix_resident.log 2>&1
echo "suffix resident rc=$? at ${SECONDS}s"; tail -4 $R/spec_suffix_resident.log
timeout 80 $S --offload stream --speculative-config "$SUFFIX" --json $R/spec_suffix_streamed.json > $R/spec_suffix_streamed.log 2>&1
echo "suffix streamed rc=$? at ${SECONDS}s"; tail -4 $R/spec_suffix_streamed.log
timeout 80 $S --offload stream --speculative-config "$SELF" --json $R/spec_self_streamed.json > $R/spec_self_streamed.log 2>&1
echo "self-draft streamed rc=$? at ${SECONDS}s"; tail -4 $R/spec_self_streamed.log
timeout 70 $S --offload stream --speculative-config "$EAGLE" --random-eagle3-head --json $R/spec_eagle3.json > $R/spec_eagle3.log 2>&1
echo "eagle3 streamed rc=$? at ${SECONDS}s"; tail -4 $R/spec_eagle3.log
wait
LEFT=$((330-SECONDS))
timeout $LEFT python3 -m gh200rt.bench latency --tokens 8 --random-model deepseek-v3-cut --random-model-dir $C/deepseek-v3-cut \
  --placements resident,experts-direct,experts-stream,experts-cpu --batches 1,8 --json $R/decode_deepseek.json > $R/decode_deepseek.log 2>&1
echo "deepseek rc=$? at ${SECONDS}s"; grep -vE "UserWarning|_warn_once" $R/decode_deepseek.log | tail -10
tar czf $OUT/report2.tgz -C /tmp r2
echo "done at ${SECONDS}s"
