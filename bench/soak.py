"""Soak: N concurrent streams for T minutes through one gateway; errors, TTFT, RSS, fds.

Starts, on free loopback ports, the fixed-rate upstream (``bench/fixed_rate_upstream.py``,
``--rate`` tokens/s) and one gateway (``tokenpace serve`` with a generated configuration:
one tenant, one HTTP backend, WARNING logging), then keeps ``--streams`` slots busy:
each slot runs streams of ``--tokens`` tokens back to back on its own keep-alive
connection (starts staggered over one stream duration). A warm-up of ``--warmup``
minutes, then ``--minutes`` minutes measured, then the slots finish their streams and
close, and the gateway is left idle for ``--settle`` seconds.

Reported (stdout and ``--out``/soak.json):

- errors: streams that did not end with ``[DONE]`` after their tokens, a status other
  than 200, an in-stream error event, a connection lost;
- TTFT (request written → first content chunk read) p50/p99 of the streams started in
  the first and in the last minute of the measured period;
- the gateway's RSS and open file descriptors at start (before any load), at their
  peak, after the warm-up, and after the run (once settled). Targets: 0 errors; RSS
  after within 20 % of RSS after the warm-up; fds back to the start value.

The load generator runs in this process (asyncio, uvloop when installed, httptools'
response parser: a few µs a chunk), sharing the machine's CPUs with the gateway.
``--source DIR`` runs the gateway of another checkout (e.g. an older commit, in a git
worktree) with this environment, for a before/after comparison.

Run: ``python bench/soak.py --streams 1000 --minutes 5`` (about 7 minutes).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httptools
import httpx
import numpy as np
import psutil
import yaml

ROOT = Path(__file__).resolve().parent.parent
KEY = "tp-soak-key-0001"
_CONTENT = re.compile(rb'"content":"\d')  # a content chunk (the upstream's stamps)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, proc: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args} exited with {proc.returncode}")
        try:
            if httpx.get(url, timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{url} did not answer within {timeout} s")


def start_upstream(rate: float) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    args = [sys.executable, str(ROOT / "bench/fixed_rate_upstream.py"), "--port", str(port)]
    proc = subprocess.Popen([*args, "--rate", str(rate)])
    url = f"http://127.0.0.1:{port}"
    wait_http(url + "/health", proc)
    return proc, url


def start_gateway(
    upstream: str, streams: int, source: Path, workdir: Path
) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    config = {
        "server": {"host": "127.0.0.1", "port": port},
        "tenants": [{"name": "soak", "api_keys": [KEY], "max_queued": 0}],
        "backends": [
            {
                "name": "up",
                "url": f"{upstream}/v1",
                "models": ["bench"],
                "health_path": "/health",
                "max_connections": streams,  # one upstream connection per stream
            }
        ],
        "logging": {"level": "WARNING"},
    }
    path = workdir / "gateway.yaml"
    path.write_text(yaml.safe_dump(config))
    env = {**os.environ, "PYTHONPATH": str(source)}
    args = [sys.executable, "-m", "gateway.cli", "serve", "--config", str(path)]
    proc = subprocess.Popen(args, cwd=source, env=env)
    url = f"http://127.0.0.1:{port}"
    wait_http(url + "/healthz", proc)
    return proc, url


# ---------------------------------------------------------------------------------
# the load


@dataclass
class Stream:
    started: float  # time.monotonic() when the request was written
    ttft: float | None = None
    error: str | None = None


@dataclass
class Load:
    streams: list[Stream] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)

    def error(self, s: Stream, what: str) -> None:
        s.error = what
        self.errors[what] = self.errors.get(what, 0) + 1


class _Conn(asyncio.Protocol):
    """One keep-alive connection; one stream at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.done: asyncio.Future[None] | None = None
        self.stream: Stream | None = None
        self.body = b""
        self.lost = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if self.done is not None and not self.done.done():
            self.done.set_exception(ConnectionError("connection lost"))

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            if self.done is not None and not self.done.done():
                self.done.set_exception(exc)

    def on_body(self, body: bytes) -> None:
        s = self.stream
        if s is not None and s.ttft is None and _CONTENT.search(body):
            s.ttft = time.monotonic() - s.started
        self.body = (self.body + body)[-256:]  # the tail: [DONE] and any error event

    def on_message_complete(self) -> None:
        if self.done is not None and not self.done.done():
            self.done.set_result(None)

    def send(self, request: bytes, stream: Stream) -> asyncio.Future[None]:
        assert self.transport is not None
        self.stream, self.body = stream, b""
        self.done = asyncio.get_running_loop().create_future()
        stream.started = time.monotonic()
        self.transport.write(request)
        return self.done


async def slot(
    host: str, port: int, request: bytes, load: Load, until: float, delay: float
) -> None:
    await asyncio.sleep(delay)
    loop = asyncio.get_running_loop()
    conn: _Conn | None = None
    while time.monotonic() < until:
        if conn is None or conn.lost:
            _, conn = await loop.create_connection(_Conn, host, port)
        s = Stream(time.monotonic())
        load.streams.append(s)
        try:
            await asyncio.wait_for(conn.send(request, s), 120)
        except (ConnectionError, httptools.HttpParserError, TimeoutError) as exc:
            load.error(s, type(exc).__name__)
            conn.transport and conn.transport.close()
            conn = None
            continue
        status = conn.parser.get_status_code()
        if status != 200:
            load.error(s, f"HTTP {status}")
        elif b'"error"' in conn.body:
            load.error(s, "error event")
        elif not conn.body.rstrip().endswith(b"data: [DONE]"):
            load.error(s, "no [DONE]")
        elif s.ttft is None:
            load.error(s, "no content")
    if conn is not None and conn.transport is not None:
        conn.transport.close()


@dataclass
class Sample:
    t: float
    rss_mib: float
    fds: int


async def sampler(proc: psutil.Process, out: list[Sample], t0: float) -> None:
    while True:
        out.append(Sample(time.monotonic() - t0, proc.memory_info().rss / 2**20, proc.num_fds()))
        await asyncio.sleep(1.0)


def ttft_stats(streams: list[Stream]) -> dict[str, Any]:
    ttfts = [s.ttft for s in streams if s.ttft is not None]
    if not ttfts:
        return {"streams": len(streams)}
    p50, p99 = np.percentile(ttfts, [50, 99])
    return {"streams": len(streams), "p50_ms": round(p50 * 1e3, 1), "p99_ms": round(p99 * 1e3, 1)}


async def soak(args: argparse.Namespace, gateway: str, gw: psutil.Process) -> dict[str, Any]:
    host, port = "127.0.0.1", int(gateway.rsplit(":", 1)[1])
    body = json.dumps(
        {
            "model": "bench",
            "messages": [{"role": "user", "content": "soak"}],
            "stream": True,
            "max_tokens": args.tokens,
        }
    ).encode()
    request = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {KEY}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    samples: list[Sample] = []
    t0 = time.monotonic()
    start = Sample(0.0, gw.memory_info().rss / 2**20, gw.num_fds())
    sampling = asyncio.create_task(sampler(gw, samples, t0))
    warm_end = t0 + args.warmup * 60
    end = warm_end + args.minutes * 60
    duration = args.tokens / args.rate
    load = Load()
    slots = [
        slot(host, port, request, load, end, i * duration / args.streams)
        for i in range(args.streams)
    ]
    running = asyncio.gather(*slots)
    await asyncio.sleep(max(0.0, warm_end - time.monotonic()))
    after_warmup = Sample(time.monotonic() - t0, gw.memory_info().rss / 2**20, gw.num_fds())
    await running
    finished = time.monotonic()
    await asyncio.sleep(args.settle)
    after = Sample(time.monotonic() - t0, gw.memory_info().rss / 2**20, gw.num_fds())
    sampling.cancel()
    measured = [s for s in load.streams if warm_end <= s.started < end]
    first = [s for s in measured if s.started < warm_end + 60]
    last = [s for s in measured if s.started >= end - 60]
    peak_rss = max(s.rss_mib for s in samples)
    peak_fds = max(s.fds for s in samples)
    return {
        "streams": args.streams,
        "minutes": args.minutes,
        "warmup_minutes": args.warmup,
        "tokens": args.tokens,
        "rate": args.rate,
        "completed": len(load.streams),
        "errors": sum(load.errors.values()),
        "error_kinds": load.errors,
        "drain_s": round(finished - end, 1),
        "ttft_first_minute": ttft_stats(first),
        "ttft_last_minute": ttft_stats(last),
        "rss_mib": {
            "start": round(start.rss_mib, 1),
            "peak": round(peak_rss, 1),
            "after_warmup": round(after_warmup.rss_mib, 1),
            "after": round(after.rss_mib, 1),
        },
        "fds": {
            "start": start.fds,
            "peak": peak_fds,
            "after_warmup": after_warmup.fds,
            "after": after.fds,
        },
        "targets": {
            "no_errors": sum(load.errors.values()) == 0,
            "rss_within_20pct": abs(after.rss_mib - after_warmup.rss_mib)
            <= 0.2 * after_warmup.rss_mib,
            "fds_back": after.fds <= start.fds,
        },
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--streams", type=int, default=1000, help="concurrent streams")
    p.add_argument("--minutes", type=float, default=5.0, help="measured minutes")
    p.add_argument("--warmup", type=float, default=1.0, help="warm-up minutes")
    p.add_argument("--tokens", type=int, default=100, help="tokens per stream")
    p.add_argument("--rate", type=float, default=10.0, help="tokens/s per stream")
    p.add_argument("--settle", type=float, default=10.0, help="idle seconds before 'after'")
    p.add_argument("--source", type=Path, default=ROOT, help="checkout whose gateway runs")
    p.add_argument("--out", type=Path, help="directory for soak.json")
    args = p.parse_args(argv)
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    with tempfile.TemporaryDirectory(prefix="tokenpace-soak-") as tmp:
        up, upstream = start_upstream(args.rate)
        gw_proc, gateway = start_gateway(upstream, args.streams, args.source.resolve(), Path(tmp))
        try:
            result = asyncio.run(soak(args, gateway, psutil.Process(gw_proc.pid)))
        finally:
            for proc in (gw_proc, up):
                proc.terminate()
                proc.wait(10)
    result["source"] = str(args.source.resolve())
    text = json.dumps(result, indent=2)
    print(text)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "soak.json").write_text(text + "\n")
    return 0 if all(result["targets"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
