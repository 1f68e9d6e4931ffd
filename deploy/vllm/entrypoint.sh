#!/bin/sh
# The vLLM image's entrypoint: vLLM's OpenAI server with tokenpace's scheduler.
#
#   entrypoint.sh [vLLM server arguments: --model M --served-model-name N ...]
#
# Adds `--scheduler-cls qos.vllm.AndesScheduler` before the given arguments; vLLM's own
# defaults stand, async scheduling (on by default on GPUs) included: the plugin builds on
# vLLM's AsyncScheduler then (docs/architecture/vllm-plugin-versions.md). The plugin's
# TOKENPACE_* settings (qos/vllm/config.py) are checked first, so a bad one stops the
# container at once rather than after the model has loaded. $PYTHON is the interpreter
# [python3].
set -eu
python=${PYTHON:-python3}
"$python" -c "from qos.vllm.config import PluginConfig; PluginConfig.from_env()" || {
    echo "entrypoint.sh: fix the TOKENPACE_* setting named above" >&2
    exit 2
}
exec "$python" -m vllm.entrypoints.openai.api_server \
    --scheduler-cls qos.vllm.AndesScheduler "$@"
