#!/bin/bash
# call 4 (issue 49), on call 3's warm machine and its 8B checkpoint: the same trace as call 3 with the engines run
# twice in one process (the second round has every kernel of every engine compiled), to compare warm engines.
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site; mkdir -p /tmp/r4
timeout 170 python3 -m gh200rt.bench tiers --model /tmp/gh200rt-validate/llama3-8b-random --quiet-seconds 2 \
  --burst-requests 48 --burst-seconds 0.5 --burst-prompt 320 --burst-tokens 64 --quiet-tokens 8 --max-model-len 512 \
  --max-num-seqs 64 --slo-ttft 2 --slo-tpot 0.15 --engines static-8,resident,dynamic,static-8,resident,dynamic \
  --json /tmp/r4/tiers_twice.json > /tmp/r4/tiers_twice.log 2>&1
echo rc=$?; grep -vE "Warning|warn" /tmp/r4/tiers_twice.log | cut -c1-330 | tail -7; cp /tmp/r4/* $OUT/
