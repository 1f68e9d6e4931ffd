"""qos.vllm.AndesScheduler against vLLM's real scheduler code (unit level, no model run).

The cases are in ``tests/qos/vllm/scheduler_cases.py``; they need vLLM, which lives in its
own virtualenv (see ``tests/support/vllm.py``), so this test runs them there with
pytest and fails with their report if any fails. They take about 15 s.
"""

from __future__ import annotations

import subprocess

from tests.support.paths import ROOT
from tests.support.vllm import local_model, vllm_python


def test_scheduler_cases_pass_on_real_vllm() -> None:
    local_model("tiny-llama")
    proc = subprocess.run(
        [
            vllm_python(),
            "-m",
            "pytest",
            "-q",
            "--noconftest",
            "-p",
            "no:cacheprovider",
            "tests/qos/vllm/scheduler_cases.py",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    report = proc.stdout[-6000:] + proc.stderr[-3000:]
    assert proc.returncode == 0, report
    assert " passed" in proc.stdout and "failed" not in proc.stdout, report
