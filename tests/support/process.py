"""Real processes for the fault tests (no tests here): ``tokenpace serve`` with a
configuration file, and ``bench/fixed_rate_upstream.py`` as its backend (a stand-in for
vLLM that streams at a fixed rate), each on free loopback ports.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import psutil
import yaml

from tests.support.paths import ROOT
from tests.support.ports import free_port

KEY = "tp-fault-key-acme-0001"


def wait_http(url: str, proc: subprocess.Popen[bytes], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args} exited with {proc.returncode}")
        try:
            if httpx.get(url, timeout=0.5).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"{url} did not answer within {timeout} s")


class Process:
    """One child process serving HTTP on ``port``; :meth:`kill` is a crash (SIGKILL)."""

    def __init__(self, args: list[str], port: int, ready_path: str) -> None:
        self.args = args
        self.port = port
        self.ready_path = ready_path
        self.proc: subprocess.Popen[bytes] | None = None
        fd, self.log_path = tempfile.mkstemp(prefix="tokenpace-proc-", suffix=".log")
        os.close(fd)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 20.0) -> Process:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.args, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        wait_http(self.url + self.ready_path, self.proc, timeout)
        return self

    @property
    def ps(self) -> psutil.Process:
        assert self.proc is not None
        return psutil.Process(self.proc.pid)

    def fds(self) -> int:
        return self.ps.num_fds()

    def rss_mib(self) -> float:
        return self.ps.memory_info().rss / 2**20

    def output(self) -> str:
        return Path(self.log_path).read_text(errors="replace")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
        Path(self.log_path).unlink(missing_ok=True)


def upstream_process(port: int | None = None, rate: float = 20.0) -> Process:
    port = port or free_port()
    args = [sys.executable, "bench/fixed_rate_upstream.py", "--port", str(port)]
    return Process([*args, "--rate", str(rate)], port, "/health")


def gateway_process(upstream_url: str, log_level: str = "WARNING", **overrides: Any) -> Process:
    """``tokenpace serve`` in front of one upstream (model ``bench``), tenant ``acme``
    with :data:`KEY`; ``overrides`` replace top-level sections of the file."""
    port = free_port()
    config: dict[str, Any] = {
        "server": {"host": "127.0.0.1", "port": port},
        "tenants": [{"name": "acme", "api_keys": [KEY]}],
        "backends": [
            {
                "name": "up",
                "url": f"{upstream_url}/v1",
                "models": ["bench"],
                "health_path": "/health",
            }
        ],
        "health": {"interval_s": 0.5, "timeout_s": 0.5},
        "timeouts": {"connect_s": 1.0, "first_byte_s": 5.0, "idle_s": 5.0},
        **overrides,
    }
    config["server"] = {"host": "127.0.0.1", "port": port, **config["server"]}
    fd, path = tempfile.mkstemp(prefix="tokenpace-", suffix=".yaml")
    with os.fdopen(fd, "w") as f:
        yaml.safe_dump(config, f)
    args = [sys.executable, "-m", "gateway.cli", "serve", "--config", path]
    return Process([*args, "--log-level", log_level], port, "/healthz")
