#!/bin/sh
# The vLLM image's entrypoint: vLLM's OpenAI server with tokenpace's scheduler.
#
#   entrypoint.sh [vLLM server arguments: --model M --served-model-name N ...]
#
# Adds `--scheduler-cls qos.vllm.AndesScheduler` and `--no-async-scheduling` (the plugin
# decides each step on the last step's outcome; on a GPU vLLM schedules ahead unless told
# not to, and the plugin refuses to start then) before the given arguments. The plugin's
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
    --scheduler-cls qos.vllm.AndesScheduler --no-async-scheduling "$@"
