"""qos.vllm.AndesScheduler against vLLM's real scheduler code (unit level, no model run).

The cases are in ``tests/qos/vllm/scheduler_cases.py``; they need vLLM, which lives in its
own virtualenvs, so this test runs them there with pytest, once per supported vLLM
series, and fails with their report if any fails:

- 0.32: the CPU build (``.venv-vllm``, see ``tests/support/vllm.py``);
- 0.33: vLLM's GPU wheel with a CPU torch (``.venv-vllm033``, made by
  ``scripts/setup-vllm033.sh``; no model can run there, the scheduler can), or
  ``TOKENPACE_VLLM033_PYTHON``.

Each run covers synchronous and async scheduling (about 25 s and 50 s).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable

import pytest

from tests.support.paths import ROOT
from tests.support.vllm import local_model, vllm_python


def vllm033_python() -> str:
    """The interpreter with vLLM 0.33; AssertionError with the fix if there is none."""
    explicit = os.environ.get("TOKENPACE_VLLM033_PYTHON")
    if explicit:
        return explicit
    venv = ROOT / ".venv-vllm033" / "bin" / "python"
    assert venv.exists(), (
        f"no vLLM 0.33: {venv} is missing. Run `make vllm033` (scripts/setup-vllm033.sh) "
        "or set TOKENPACE_VLLM033_PYTHON to a Python with vllm 0.33 and this project"
    )
    return str(venv)


def run_in(python: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [python, *args], cwd=ROOT, capture_output=True, text=True, timeout=600, check=False
    )


@pytest.mark.parametrize(
    ("series", "interpreter"), [("0.32", vllm_python), ("0.33", vllm033_python)]
)
def test_scheduler_cases_pass_on_real_vllm(series: str, interpreter: Callable[[], str]) -> None:
    local_model("tiny-llama")
    python = interpreter()
    version = run_in(python, "-c", "import vllm; print(vllm.__version__)")
    assert version.stdout.startswith(f"{series}."), version.stdout + version.stderr[-3000:]
    proc = run_in(
        python,
        "-m",
        "pytest",
        "-q",
        "--noconftest",
        "-p",
        "no:cacheprovider",
        "tests/qos/vllm/scheduler_cases.py",
    )
    report = proc.stdout[-6000:] + proc.stderr[-3000:]
    assert proc.returncode == 0, report
    assert " passed" in proc.stdout and "failed" not in proc.stdout, report
