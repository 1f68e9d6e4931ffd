#!/usr/bin/env bash
# The vLLM scheduler comparison on a GPU machine with a real model (not part of CI).
#
#   MODEL=/models/Llama-3.1-8B-Instruct bench/vllm_compare_gpu.sh [extra bench/vllm_compare.py args]
#
# Needs a Python with vllm 0.32.x (pip install 'tokenpace[vllm]' into it, which also
# installs the plugin) and this project's dev extra for the gateway and the openai client.
# Same comparison as the CPU run (FCFS, priority, the tokenpace plugin through the
# gateway), at human tiers (--speedup 1: chat 1 s / 4.8 tok/s, batch 60 s / 2 tok/s), the
# trace's own lengths, the KV cache vLLM sizes itself, and a load you choose with RATE
# (requests/s; overload is where the schedulers differ: raise it until FCFS's QoE drops).
# Async scheduling is turned off (the plugin decides on the tokens of the step before).
# One run per server and arrival process by default (a GPU is quieter than a shared CPU;
# a run is ~3 min at the defaults): REPEATS=3 for medians over rotated runs.
set -euo pipefail
cd "$(dirname "$0")/.."
: "${MODEL:?set MODEL to a local model directory or hub name}"
PYTHON=${PYTHON:-python}
RATE=${RATE:-4}
REQUESTS=${REQUESTS:-600}
REPEATS=${REPEATS:-1}
MAX_NUM_SEQS=${MAX_NUM_SEQS:-256}
"$PYTHON" bench/vllm_compare.py \
    --python "$PYTHON" \
    --model "$MODEL" \
    --real-weights \
    --speedup 1 \
    --length-scale 1 \
    --rate "$RATE" \
    --requests "$REQUESTS" \
    --repeats "$REPEATS" \
    --max-num-seqs "$MAX_NUM_SEQS" \
    --max-model-len 4096 \
    --kv-blocks 0 \
    --block-size 16 \
    --stream-interval 1 \
    --nice 0 \
    --vllm-arg=--no-async-scheduling \
    --out results/vllm_compare_gpu \
    "$@"
