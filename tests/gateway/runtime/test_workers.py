"""``tokenpace serve --workers N``: real processes, a real Redis, the official openai client.

One gateway of two workers on the embedded SIMULATED engine serves most tests; the
signal tests start their own. Which worker served what is read from the workers' own
metric files (``prometheus_client.multiprocess``, one file per process id).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import psutil
import pytest
import yaml
from prometheus_client.multiprocess import MultiProcessCollector

from gateway.cli import serve
from gateway.runtime.workers import PUBLISH_INTERVAL_S
from tests.support.ports import free_port
from tests.support.process import Process
from tests.support.redis_server import RedisServer

KEY = "tp-workers-key-acme-0001"
ADMIN_KEY = "tp-workers-admin-0001"
MODEL = "tokenpace-sim"
HELLO = [{"role": "user", "content": "Hello!"}]


def _config_file(port: int, redis_url: str | None) -> str:
    config: dict[str, Any] = {
        "server": {"host": "127.0.0.1", "port": port},
        "tenants": [{"name": "acme", "api_keys": [KEY]}],
        "backends": [
            {
                "name": "sim",
                "kind": "embedded",
                "models": [MODEL],
                "options": {"time_scale": 4, "default_output_tokens": [8, 16]},
            }
        ],
        "health": {"interval_s": 0.5, "timeout_s": 0.5},
        "admin": {"key": ADMIN_KEY},
    }
    if redis_url is not None:
        config["store"] = {"redis_url": redis_url}
    fd, path = tempfile.mkstemp(prefix="tokenpace-workers-", suffix=".yaml")
    with os.fdopen(fd, "w") as f:
        yaml.safe_dump(config, f)
    return path


def _serve_args(path: str, workers: int = 2) -> list[str]:
    return [
        sys.executable,
        "-m",
        "gateway.cli",
        "serve",
        "--config",
        path,
        "--workers",
        str(workers),
    ]


class Pool:
    """A running ``serve --workers 2``: the supervisor, its workers, their metrics dir."""

    def __init__(self, redis_url: str) -> None:
        port = free_port()
        self.config = _config_file(port, redis_url)
        self.proc = Process(_serve_args(self.config), port, "/readyz")
        try:
            self.proc.start(timeout=60)  # N + 1 processes start on a 2-core machine
            self.wait_workers(2)
        except BaseException:
            self.stop()
            raise

    @property
    def supervisor(self) -> psutil.Process:
        return self.proc.ps

    def workers(self) -> list[psutil.Process]:
        kids = self.supervisor.children()
        return [p for p in kids if "spawn_main" in " ".join(p.cmdline())]

    def wait_workers(
        self, n: int, started: int | None = None, timeout: float = 30.0
    ) -> list[psutil.Process]:
        """The ``n`` workers, once ``started`` (default ``n``) have started (each logs it)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            logged = self.proc.output().count("Application startup complete")
            workers = self.workers()
            if logged >= (started or n) and len(workers) == n:
                return workers
            time.sleep(0.05)
        raise AssertionError(f"{n} workers did not start:\n{self.proc.output()}")

    def metrics_dir(self) -> Path:
        return Path(self.workers()[0].environ()["PROMETHEUS_MULTIPROC_DIR"])

    def served_by(self, pid: int) -> float:
        """Chat completions this worker counted, read from its own metric file."""
        path = self.metrics_dir() / f"counter_{pid}.db"
        if not path.exists():
            return 0.0
        total = 0.0
        for family in MultiProcessCollector.merge([str(path)]):
            for s in family.samples:
                if (
                    s.name == "tokenpace_requests_total"
                    and s.labels["endpoint"] == "chat.completions"
                ):
                    total += s.value
        return total

    def stop_and_check(self, sig: signal.Signals, family: list[psutil.Process]) -> None:
        """Send ``sig`` to the supervisor: it exits 0, with every process of ``family``
        (itself, its workers, multiprocessing's helper) gone and the metrics dir removed."""
        metrics_dir = self.metrics_dir()
        assert self.proc.proc is not None
        self.proc.proc.send_signal(sig)
        assert self.proc.proc.wait(20) == 0
        _, alive = psutil.wait_procs(family, timeout=10)
        assert not alive, alive
        assert not metrics_dir.exists()

    def stop(self) -> None:
        self.proc.stop()
        Path(self.config).unlink(missing_ok=True)


@pytest.fixture(scope="module")
def redis() -> Iterator[RedisServer]:
    server = RedisServer().start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def pool(redis: RedisServer) -> Iterator[Pool]:
    """Stopped by SIGTERM at the end, which must stop every process and clean up."""
    p = Pool(redis.url)
    try:
        yield p
        p.stop_and_check(signal.SIGTERM, [p.supervisor, *p.supervisor.children(recursive=True)])
    finally:
        p.stop()


def _scrape(url: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{url}/metrics", timeout=5).text
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def _settled(url: str, done: Callable[[dict], bool]) -> dict:
    """A scrape once ``done`` holds for it and nothing is in flight. A worker ends its
    request record after the client has read the last event, and publishes its backend
    view every ``PUBLISH_INTERVAL_S``; a few intervals bound both."""
    deadline = time.monotonic() + 5 * PUBLISH_INTERVAL_S
    while True:
        samples = _scrape(url)
        idle = _total(samples, "tokenpace_requests_in_flight") == 0 and (
            _total(samples, "tokenpace_backend_in_flight") == 0
        )
        if (done(samples) and idle) or time.monotonic() > deadline:
            return samples
        time.sleep(0.1)


def _total(samples: dict, name: str, **labels: str) -> float:
    want = set(labels.items())
    return sum(v for (n, lab), v in samples.items() if n == name and want <= lab)


async def _round(url: str, streams: int) -> int:
    """``streams`` concurrent streaming chats, each on a connection of its own; tokens."""

    async def one() -> int:
        async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0) as c:
            stream = await c.chat.completions.create(
                model=MODEL,
                messages=HELLO,
                stream=True,
                max_tokens=12,
                stream_options={"include_usage": True},
            )
            usage = 0
            async for chunk in stream:
                if chunk.usage is not None:
                    usage = chunk.usage.completion_tokens
            return usage

    return sum(await asyncio.gather(*(one() for _ in range(streams))))


def test_two_workers_serve_and_metrics_sum_over_them(pool: Pool) -> None:
    url = pool.proc.url
    before = _scrape(url)
    sent, tokens = 0, 0
    pids = [w.pid for w in pool.workers()]
    for _ in range(10):  # the kernel hands connections to whichever worker accepts first
        tokens += asyncio.run(_round(url, 8))
        sent += 8
        if all(pool.served_by(pid) > 0 for pid in pids):
            break
    per_worker = {pid: pool.served_by(pid) for pid in pids}
    assert all(n > 0 for n in per_worker.values()), per_worker

    labels = {"endpoint": "chat.completions", "status": "200", "outcome": "completed"}
    after = _settled(
        url,
        lambda m: (
            _total(m, "tokenpace_requests_total", **labels)
            - _total(before, "tokenpace_requests_total", **labels)
            == sent
        ),
    )
    served = _total(after, "tokenpace_requests_total", **labels)
    assert served == sum(per_worker.values())  # one series, the workers' counts added
    out = _total(after, "tokenpace_output_tokens_total") - _total(
        before, "tokenpace_output_tokens_total"
    )
    assert out == tokens == 12 * sent
    # gauges: summed over live workers (no pid label), nothing in flight now
    in_flight = {k: v for k, v in after.items() if k[0] == "tokenpace_requests_in_flight"}
    assert in_flight and all("pid" not in dict(k[1]) for k in in_flight)
    assert _total(after, "tokenpace_requests_in_flight", endpoint="chat.completions") == 0
    assert _total(after, "tokenpace_backend_healthy", backend="sim") == 1
    assert _total(after, "tokenpace_backend_in_flight", backend="sim") == 0
    # the admin status document reads the same combined series
    status = httpx.get(
        f"{url}/v1/tokenpace/admin/status", headers={"Authorization": f"Bearer {ADMIN_KEY}"}
    ).json()
    assert status["tenants"]["acme"]["requests"] == served
    assert status["tenants"]["acme"]["output_tokens"] == _total(
        after, "tokenpace_output_tokens_total", tenant="acme"
    )


def test_backend_gauges_add_up_the_workers_in_flight(pool: Pool) -> None:
    url = pool.proc.url

    async def hold() -> float:
        async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0) as c:
            streams = [
                await c.chat.completions.create(
                    model=MODEL, messages=HELLO, stream=True, max_tokens=2000
                )
                for _ in range(4)
            ]
            for s in streams:  # every stream under way
                await anext(aiter(s))
            await asyncio.sleep(1.5)  # each worker publishes its view every second
            seen = _total(await asyncio.to_thread(_scrape, url), "tokenpace_backend_in_flight")
            for s in streams:
                await s.close()
            return seen

    assert asyncio.run(hold()) == 4


def test_the_embedded_engine_runs_once_in_the_supervisor(pool: Pool) -> None:
    asyncio.run(_round(pool.proc.url, 4))
    sup = pool.supervisor
    listening = {c.laddr.port for c in sup.net_connections("tcp") if c.status == psutil.CONN_LISTEN}
    engine_ports = listening - {pool.proc.port}
    assert len(engine_ports) == 1  # one engine server, in the supervisor
    (engine_port,) = engine_ports
    for w in pool.workers():
        conns = w.net_connections("tcp")
        assert not {c.laddr.port for c in conns if c.status == psutil.CONN_LISTEN} - {
            pool.proc.port
        }
        # the worker reaches the engine over loopback (its pooled connections)
        assert any(c.raddr and c.raddr.port == engine_port for c in conns)
    assert pool.proc.output().count("embedded engine, SIMULATION") == 1
    models = openai.OpenAI(base_url=f"{pool.proc.url}/v1", api_key=KEY).models.list()
    assert [m.owned_by for m in models.data] == ["tokenpace-simulation"]


@pytest.fixture
def tokenpace_logger() -> Iterator[None]:
    """``serve`` configures the ``tokenpace`` logger; put it back for the tests after."""
    logger = logging.getLogger("tokenpace")
    handlers, propagate, level = list(logger.handlers), logger.propagate, logger.level
    yield
    logger.handlers[:] = handlers
    logger.propagate = propagate
    logger.setLevel(level)


@pytest.mark.parametrize("with_file", [True, False])
@pytest.mark.usefixtures("tokenpace_logger")
def test_the_memory_store_is_refused(
    with_file: bool, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("TOKENPACE_CONFIG", raising=False)
    path = _config_file(free_port(), None) if with_file else None
    try:
        code = serve([*(["--config", path] if path else []), "--workers", "2"])
    finally:
        if path:
            Path(path).unlink()
    out, err = capsys.readouterr()
    assert code == 2
    assert "store.redis_url" in err and "--workers 2" in err
    assert "listening" not in out  # refused before serving anything


def test_a_crashed_worker_is_replaced_and_sigint_stops_everything(redis: RedisServer) -> None:
    p = Pool(redis.url)
    try:
        asyncio.run(_round(p.proc.url, 4))
        chats = "tokenpace_requests_total"
        _settled(p.proc.url, lambda m: _total(m, chats, endpoint="chat.completions") == 4)
        metrics_dir = p.metrics_dir()
        family = [p.supervisor, *p.supervisor.children(recursive=True)]
        victim = max(p.workers(), key=lambda w: p.served_by(w.pid))  # served some of them
        assert (metrics_dir / f"gauge_livesum_{victim.pid}.db").exists()
        victim.kill()
        victim.wait(10)
        replaced = p.wait_workers(2, started=3)
        assert victim.pid not in {w.pid for w in replaced}
        family += [w for w in replaced if w not in family]
        # marked dead: its live gauges are dropped, its counts stay
        assert not (metrics_dir / f"gauge_livesum_{victim.pid}.db").exists()
        assert _total(_scrape(p.proc.url), chats, endpoint="chat.completions") == 4
        p.stop_and_check(signal.SIGINT, family)
    finally:
        p.stop()


def test_the_demo_runs_on_two_workers_with_redis_url(
    redis: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``tokenpace serve --workers 2 --redis-url URL``, no configuration file: the demo
    tenant on two workers sharing Redis."""
    monkeypatch.delenv("TOKENPACE_CONFIG", raising=False)
    monkeypatch.setenv("TOKENPACE_DEMO_KEY", "tp-demo-workers-0001")
    port = free_port()
    args = [sys.executable, "-m", "gateway.cli", "serve", "--port", str(port)]
    proc = Process([*args, "--workers", "2", "--redis-url", redis.url], port, "/readyz")
    try:
        proc.start(timeout=60)
        client = openai.OpenAI(
            base_url=f"{proc.url}/v1", api_key="tp-demo-workers-0001", max_retries=0
        )
        reply = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=4)
        assert reply.usage is not None and reply.usage.completion_tokens == 4
        assert "workers: 2 (shared state Redis)" in proc.output()
    finally:
        proc.stop()
