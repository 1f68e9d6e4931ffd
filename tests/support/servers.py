"""A real uvicorn server for an ASGI app, on a free loopback port, in the test's event loop
(so tests can inspect the app's tasks), without signal handlers: the benchmarks' runner
(``bench/launch.py``), one implementation for both."""

from __future__ import annotations

import sys

from tests.support.paths import ROOT

sys.path.insert(0, str(ROOT / "bench"))

from launch import serve_in_loop as run_server

__all__ = ["run_server"]
