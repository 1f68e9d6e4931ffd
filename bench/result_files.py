"""A benchmark run's record: ``OUT/results.json``, with the load at its end and its wall
time (the scripts that measure gateways side by side, e.g. ``bench/tracing_cost.py``)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any


def save(results: dict[str, Any], out: str, started: float) -> Path:
    """Write ``results`` (with ``machine.loadavg_end`` and ``wall_s`` since ``started``, a
    ``time.monotonic()``) to ``out/results.json``; its path."""
    results.setdefault("machine", {})["loadavg_end"] = os.getloadavg()
    results["wall_s"] = time.monotonic() - started
    outdir = Path(out)
    outdir.mkdir(parents=True, exist_ok=True)
    path = outdir / "results.json"
    path.write_text(json.dumps(results, indent=2))
    return path
