"""A real ``redis-server`` for the tests, on a free loopback port (no mocks).

``make test`` installs redis-server (scripts/install-system-deps.sh); a test that needs
it and cannot find it fails, it is not skipped.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from tests.support.ports import free_port


def _ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


class RedisServer:
    """One redis-server process; ``persist`` keeps data across :meth:`restart` (AOF)."""

    def __init__(self, port: int | None = None, *, persist: bool = False) -> None:
        exe = shutil.which("redis-server")
        if exe is None:
            raise RuntimeError(
                "redis-server not found: run scripts/install-system-deps.sh (make test does)"
            )
        self.exe = exe
        self.port = port or free_port()
        self.persist = persist
        self.dir = tempfile.mkdtemp(prefix="tokenpace-redis-")
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        persistence = (
            ["--appendonly", "yes", "--appendfsync", "always"]
            if self.persist
            else ["--appendonly", "no"]
        )
        args = [self.exe, "--port", str(self.port), "--bind", "127.0.0.1", "--save", ""]
        args += [*persistence, "--dir", self.dir, "--logfile", str(Path(self.dir) / "log")]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while not _ping(self.port):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"redis-server did not start on port {self.port}")
            time.sleep(0.01)
        return self

    def kill(self) -> None:
        """SIGKILL, as a crash."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def restart(self) -> None:
        self.kill()
        self.start()

    def stop(self) -> None:
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
