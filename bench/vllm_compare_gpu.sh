#!/usr/bin/env bash
# The vLLM scheduler comparison on a GPU machine with a real model (not part of CI; it has
# not run yet: docs/benchmarks/2026-12-06-vllm-async.md says so until it has).
#
#   MODEL=/models/Llama-3.1-8B-Instruct bench/vllm_compare_gpu.sh [extra bench/vllm_compare.py args]
#
# Needs a Python with vLLM 0.33 (pip install 'tokenpace[vllm]' into it, which also installs
# the plugin) and this project's dev extra for the gateway and the openai client; it
# stops at once on another vLLM. Three servers on the same model and settings, through
# the gateway, at human tiers (--speedup 1: chat 1 s / 4.8 tok/s, batch 60 s / 2 tok/s),
# the trace's own lengths, the KV cache vLLM sizes itself, and a load you choose with RATE
# (requests/s; overload is where the schedulers differ: raise it until FCFS's QoE drops):
#   fcfs        vLLM's stock scheduler at its defaults (async scheduling on a GPU);
#   andes       the plugin at vLLM's defaults (async scheduling: AsyncAndesScheduler);
#   andes-sync  the plugin with async scheduling off, to show what the overlap is worth.
# Printed per scheduler: QoE (average, p10), p90 TTFT, the share of replies frozen over 2
# and 5 s, user idle latency p99, tokens/s (whole run and while loaded), preemptions,
# and the scheduler's share of the step (schedule() over schedule + model + update).
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
"$PYTHON" - <<'PY'
from importlib.metadata import version

from qos.vllm import check_vllm_version

found = version("vllm")
check_vllm_version(found)
if not found.startswith("0.33."):
    raise SystemExit(f"vllm_compare_gpu.sh compares on vLLM 0.33; this Python has vllm {found}")
PY
"$PYTHON" bench/vllm_compare.py \
    --python "$PYTHON" \
    --model "$MODEL" \
    --real-weights \
    --modes fcfs,andes \
    --variant andes-sync \
    --variant-vllm-arg=andes-sync=--no-async-scheduling \
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
    --out results/vllm_compare_gpu \
    "$@"
