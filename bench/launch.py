"""The benchmarks' servers as processes of their own: one launcher.

:class:`Server` runs a command in a session of its own (stopping it stops everything it
started: a gateway's workers, a vLLM server's engine core), its output in a log file,
optionally pinned to some CPUs from its first instruction, and waits until a URL of it
answers 200 (or, for a server that does not speak HTTP, until its port accepts a
connection). It reports the CPU seconds and RSS of its process tree, and stops with
SIGTERM to the whole group, SIGKILL after a grace period. :func:`free_port` picks the
loopback port a server listens on. :func:`serve_in_loop` is the other way to run one: an
ASGI app under uvicorn in the caller's event loop (the benchmarks' gateway in front of a
vLLM server, and the tests', which inspect the app's tasks).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import psutil
import uvicorn

from gateway.config.schema import GatewayConfig
from gateway.runtime.server import listen, uvicorn_config


def free_port() -> int:
    """A free TCP port on the loopback interface."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _InLoopServer(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:  # leave the caller's signal handlers alone
        yield


@asynccontextmanager
async def serve_in_loop(
    app: Any, gateway_config: GatewayConfig | None = None, *, log_level: str = "critical"
) -> AsyncIterator[str]:
    """Serve ``app`` with uvicorn in the running event loop on a free loopback port,
    without signal handlers; yields its base URL. With ``gateway_config``, as ``tokenpace
    serve`` does (:func:`gateway.runtime.server.uvicorn_config`: the connection limits);
    else plain uvicorn (stand-in upstreams)."""
    sock = listen("127.0.0.1", 0)
    port = sock.getsockname()[1]
    opts: dict[str, Any] = {"log_level": log_level, "timeout_graceful_shutdown": 1}
    if gateway_config is not None:
        config = uvicorn_config(app, gateway_config, **opts)
    else:
        config = uvicorn.Config(app, lifespan="on", access_log=False, ws="none", **opts)
    server = _InLoopServer(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            if task.done():
                task.result()
                raise RuntimeError("server stopped during start-up")
            await asyncio.sleep(0.005)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        with contextlib.suppress(asyncio.CancelledError):
            await task
        sock.close()


class Server:
    """``cmd`` as a server on ``port`` (see the module docstring); ready when
    ``ready_path`` answers 200 (None: when the port accepts a connection). Its log is
    ``log_dir/NAME.log``."""

    def __init__(
        self,
        name: str,
        cmd: Sequence[str],
        *,
        port: int,
        ready_path: str | None,
        log_dir: Path,
        cpus: set[int] | None = None,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        stop_grace_s: float = 10.0,
    ) -> None:
        self.name = name
        self.port = port
        self.ready_url = None if ready_path is None else f"http://127.0.0.1:{port}{ready_path}"
        self.log_path = log_dir / f"{name}.log"
        self.stop_grace_s = stop_grace_s
        log_dir.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            list(cmd),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: what it starts stops with it
            env={**os.environ, **(env or {})},
            cwd=cwd,
            preexec_fn=None if not cpus else (lambda: os.sched_setaffinity(0, cpus)),
        )
        self.ps = psutil.Process(self.proc.pid)

    def wait_ready(self, timeout_s: float, interval_s: float = 0.2) -> None:
        """Until the server is ready; RuntimeError with the log's tail otherwise."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"{self.name} exited ({self.proc.returncode}); {self.log_path}:\n{self.tail()}"
                )
            if self._ready():
                return
            time.sleep(interval_s)
        raise RuntimeError(
            f"{self.name} not ready after {timeout_s:.0f} s; {self.log_path}:\n{self.tail()}"
        )

    def _ready(self) -> bool:
        if self.ready_url is None:
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", self.port), 1),
            ):
                return True
            return False
        with contextlib.suppress(httpx.HTTPError):
            return httpx.get(self.ready_url, timeout=1.0).status_code == 200
        return False

    def tail(self, chars: int = 4000) -> str:
        """The end of the log."""
        self._log.flush()
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace")[-chars:]
        return ""

    def tree(self) -> list[psutil.Process]:
        """The server's process and every process it started."""
        try:
            return [self.ps, *self.ps.children(recursive=True)]
        except psutil.Error:
            return [self.ps]

    def cpu_s(self) -> float:
        """CPU seconds (user and system) of the process tree so far."""
        total = 0.0
        for p in self.tree():
            with contextlib.suppress(psutil.Error):
                t = p.cpu_times()
                total += t.user + t.system
        return total

    def rss(self) -> int:
        """Resident memory of the process tree, bytes."""
        total = 0
        for p in self.tree():
            with contextlib.suppress(psutil.Error):
                total += p.memory_info().rss
        return total

    def stop(self) -> None:
        """SIGTERM to the process group, SIGKILL after ``stop_grace_s``."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(self.stop_grace_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(self.stop_grace_s)
        self._log.close()
