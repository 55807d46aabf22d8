#!/bin/bash
# call 5 (issue 49), warm machine: call 1's multi-turn run with the engines in the reverse order (off first).
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site
timeout 100 python3 -m gh200rt.bench multi-turn --model /tmp/gh200rt-validate/llama3-8b-random --conversations 8 \
  --turns 3 --system-tokens 2048 --user-tokens 256 --output-tokens 32 --order off,in-place,on \
  > $OUT/multi_turn_reversed.log 2>&1
echo rc=$?; tail -7 $OUT/multi_turn_reversed.log
