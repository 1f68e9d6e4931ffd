"""``tokenpace serve --workers N``: N gateway processes on one port (docs/architecture/gateway.md,
"Worker processes").

uvicorn's own supervisor (``uvicorn.supervisors.Multiprocess``) runs the workers on the
sockets ``serve`` bound; :class:`Supervisor` adds ``mark_process_dead`` for the metrics
(``$PROMETHEUS_MULTIPROC_DIR``, fresh per serve). uvicorn pickles its configuration into
each worker, so the gateway configuration travels as data (:class:`WorkerSpec`,
:class:`WorkerProtocol`), as pickled bytes: this module imports the gateway only inside
its functions, so that a new worker answers the supervisor's health pings quickly.
Embedded engines run once, in the supervisor (:mod:`gateway.runtime.engine_server`).
Each worker tags its request ids (:mod:`gateway.runtime.holders`), so that the supervisor
releases at once the admission slots and queue places of a worker that died.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import pickle
import shutil
import signal
import socket
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from types import FrameType
from typing import TYPE_CHECKING, Any

import uvicorn
from uvicorn.config import STARTUP_FAILURE
from uvicorn.supervisors import Multiprocess

from gateway.background import stop

if TYPE_CHECKING:
    from starlette.types import ASGIApp

    from gateway.backends import Backend
    from gateway.config.schema import GatewayConfig
    from gateway.runtime.engine_server import EngineServer
    from gateway.runtime.server import GuardedHttpToolsProtocol
    from gateway.telemetry.metrics import GatewayMetrics

log = logging.getLogger("tokenpace.gateway.workers")

PUBLISH_INTERVAL_S = 1.0
WORKER_HEALTHCHECK_S = 10  # a worker that does not answer the supervisor's ping is replaced


def check_shared_store(config: GatewayConfig, workers: int) -> None:
    """ConfigError unless ``workers`` processes can share state (Redis) under ``config``."""
    from gateway.config.schema import ConfigError

    if workers > 1 and config.store.redis_url is None:
        raise ConfigError(
            [
                f"store.redis_url: not set, and --workers {workers} needs it: the workers "
                "share admission, rate limits, keys and request ids through Redis; set "
                "store.redis_url or --redis-url (redis://host:port/db), or serve with "
                "--workers 1"
            ]
        )


@dataclass(frozen=True)
class WorkerSpec:
    """What a worker builds its app from (pickled, in uvicorn's configuration)."""

    config: GatewayConfig  # embedded engines already replaced by their HTTP address
    cards: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)  # name -> cards
    log_json: bool = False
    log_level: str = "INFO"
    pool_id: str = ""  # with the worker's process id, its holder tag


class WorkerProtocol:
    """uvicorn's ``http`` setting for the workers: :func:`gateway.runtime.server.protocol_for`'s
    protocol, built in each worker (a class made at run time cannot be pickled)."""

    def __init__(self, config: GatewayConfig) -> None:
        self._config = pickle.dumps(config)
        self._cls: type[GuardedHttpToolsProtocol] | None = None

    def __call__(self, **kwargs: Any) -> GuardedHttpToolsProtocol:
        if self._cls is None:
            from gateway.runtime.server import protocol_for

            self._cls = protocol_for(pickle.loads(self._config))
        return self._cls(**kwargs)


def worker_backends(spec: WorkerSpec) -> list[Backend]:
    """The backends of ``spec.config``; those of an engine server describe themselves."""
    from gateway.backends.kinds import build_backends
    from gateway.runtime.engine_server import EngineServerBackend

    config = spec.config
    backends = build_backends(config)
    for i, cfg in enumerate(config.backends):
        if cfg.name in spec.cards:
            cards = spec.cards[cfg.name]
            backends[i] = EngineServerBackend(cfg, config.timeouts, config.health, cards)
    return backends


async def _publish_backends(metrics: GatewayMetrics) -> None:
    while True:
        metrics.publish_backends()
        await asyncio.sleep(PUBLISH_INTERVAL_S)


def worker_app(pickled_spec: bytes) -> ASGIApp:
    """The app factory each worker runs: the gateway of a pickled :class:`WorkerSpec`,
    publishing its backend gauges."""
    from gateway.app import create_app
    from gateway.runtime.holders import holder_tag
    from gateway.runtime.server import tune_garbage_collector
    from gateway.telemetry.logs import setup_logging

    spec: WorkerSpec = pickle.loads(pickled_spec)
    setup_logging(json_logs=spec.log_json, level=spec.log_level)
    tag = holder_tag(spec.pool_id, os.getpid())
    app = create_app(spec.config, backends=worker_backends(spec), request_id_prefix=tag)
    metrics: GatewayMetrics = app.state.gateway.metrics
    inner = app.router.lifespan_context

    @asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[Any]:
        async with inner(app) as state:
            task = asyncio.create_task(_publish_backends(metrics), name="tokenpace-publish")
            try:
                yield state
            finally:
                await stop(task)

    app.router.lifespan_context = lifespan
    tune_garbage_collector()
    return app


class Supervisor(Multiprocess):
    """uvicorn's supervisor, marking every worker that exits dead for the metrics and
    calling ``on_exit`` with its process id (its slots released), and draining on
    SIGTERM/SIGINT: from the signal handler itself, not at uvicorn's next half-second
    tick, its own copies of the listening sockets are closed (the workers close theirs,
    so the port refuses new connections instead of queueing them where no one accepts)
    and every worker is told to drain (:mod:`gateway.relay.drain`); one still running
    ``shutdown_s`` later is killed."""

    def __init__(
        self,
        config: uvicorn.Config,
        sockets: list[socket.socket],
        shutdown_s: float,
        on_exit: Callable[[int], None] | None = None,
    ) -> None:
        super().__init__(config, sockets)
        self.shutdown_s = shutdown_s
        self.on_exit = on_exit
        self._seen: set[int] = set()
        self._reaped: set[int] = set()
        self.startup_failed = False
        self._started = False  # every first worker spawned: they may be told to stop
        self._stopping = False

        def stop_now(sig: int, frame: FrameType | None) -> None:
            self.signal_queue.append(sig)  # uvicorn's loop still logs it and exits
            if self._started:
                self.terminate_all()

        # a plain function, not a bound method: sse-starlette takes a SIGTERM handler's
        # ``__self__`` for a uvicorn server and ends every stream of the in-process
        # engine (:mod:`gateway.runtime.engine_server`) when its ``should_exit`` is truthy
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, stop_now)

    def init_processes(self) -> None:
        super().init_processes()
        self._started = True

    def _remember(self) -> None:
        self._seen.update(p.pid for p in self.processes if p.pid is not None)

    def _reap(self, everyone: bool = False) -> None:
        """Mark the workers seen so far that are gone (``everyone``: all of them) dead."""
        from prometheus_client.multiprocess import mark_process_dead

        self._remember()
        alive = set() if everyone else {p.pid for p in self.processes if p.exitcode is None}
        for pid in sorted(self._seen - alive - self._reaped):
            self._reaped.add(pid)
            mark_process_dead(pid)
            if self.on_exit is not None:
                self.on_exit(pid)

    def handle_signals(self) -> None:
        self._remember()
        super().handle_signals()  # SIGHUP, SIGTTOU: workers replaced or removed

    def keep_subprocess_alive(self) -> None:
        self._remember()
        if self._stopping:
            return  # told to stop between two ticks: a worker that drained stays gone
        super().keep_subprocess_alive()  # replaces the workers that died
        self._reap()
        if any(p.exitcode == STARTUP_FAILURE for p in self.processes):
            self.startup_failed = True

    def terminate_all(self) -> None:
        if self._stopping:
            return
        self._stopping = True
        for sock in self.sockets:
            sock.close()
        super().terminate_all()  # SIGTERM: each worker drains

    def join_all(self) -> None:
        deadline = time.monotonic() + self.shutdown_s
        for process in self.processes:
            process.process.join(max(deadline - time.monotonic(), 0.0))
            if process.exitcode is None:
                log.error("worker %s still running after the drain: killed", process.pid)
                process.kill()
                process.process.join()

    def run(self) -> None:
        try:
            super().run()
        finally:
            self._reap(everyone=True)


class WorkerPool:
    """``workers`` gateway processes for ``config``; :meth:`run` serves until a signal."""

    def __init__(
        self, config: GatewayConfig, workers: int, *, log_json: bool, log_level: str
    ) -> None:
        from gateway.backends import InProcessBackend
        from gateway.backends.kinds import build_backends

        check_shared_store(config, workers)
        backends = build_backends(config)  # checks the options only a backend kind knows
        self.config = config
        self.workers = workers
        self.log_json = log_json
        self.log_level = log_level
        self.engines = [b for b in backends if isinstance(b, InProcessBackend)]
        self.pool_id = uuid.uuid4().hex  # the workers' holder tags derive from it

    def worker_exited(self, pid: int) -> None:
        """Release what the worker ``pid`` held in the shared store (slots, queue places)
        now, rather than when its leases lapse."""
        from gateway.runtime.holders import holder_tag, release_holder

        tag = holder_tag(self.pool_id, pid)
        released = release_holder(self.config, tag)
        if released:
            log.warning(
                "worker %s exited holding %d slot(s) or queue place(s): released", pid, released
            )

    def _spec(self, server: EngineServer | None) -> WorkerSpec:
        from gateway.runtime.engine_server import served_backend_config

        if server is None:
            return WorkerSpec(self.config, {}, self.log_json, self.log_level, self.pool_id)
        engines = {e.name: e for e in self.engines}
        backends = [
            served_backend_config(b, server.url(b.name), engines[b.name].throughput_tps)
            if b.name in engines
            else b
            for b in self.config.backends
        ]
        cards = {e.name: {m: e.model_card(m) for m in e.models} for e in self.engines}
        config = self.config.model_copy(update={"backends": backends})
        return WorkerSpec(config, cards, self.log_json, self.log_level, self.pool_id)

    def run(self, sockets: list[socket.socket]) -> int:
        """Serve on ``sockets`` until SIGINT/SIGTERM; the exit code."""
        from gateway.runtime.engine_server import EngineServer
        from gateway.runtime.server import graceful_shutdown_s
        from gateway.telemetry.metrics import MULTIPROC_ENV

        metrics_dir = tempfile.mkdtemp(prefix="tokenpace-metrics-")
        previous = os.environ.get(MULTIPROC_ENV)
        os.environ[MULTIPROC_ENV] = metrics_dir  # read by the workers' prometheus_client
        server: EngineServer | None = None
        try:
            if self.engines:
                server = EngineServer(self.engines, self.config)
                server.start()
            spec = self._spec(server)
            grace = graceful_shutdown_s(self.config)
            config = uvicorn.Config(
                functools.partial(worker_app, pickle.dumps(spec)),
                factory=True,
                workers=self.workers,
                timeout_worker_healthcheck=WORKER_HEALTHCHECK_S,
                http=WorkerProtocol(spec.config),  # type: ignore[arg-type]  # called as a class
                ws="none",
                lifespan="on",
                access_log=False,
                log_level=self.log_level.lower(),
                timeout_graceful_shutdown=grace,
            )
            # a second more to exit
            supervisor = Supervisor(config, sockets, grace + 1.0, self.worker_exited)
            supervisor.run()
        finally:
            if server is not None:
                server.stop()
            if previous is None:
                os.environ.pop(MULTIPROC_ENV, None)
            else:
                os.environ[MULTIPROC_ENV] = previous
            shutil.rmtree(metrics_dir, ignore_errors=True)
        if supervisor.startup_failed:
            log.error("a worker failed to start (see its log above); stopped")
            return 1
        return 0
