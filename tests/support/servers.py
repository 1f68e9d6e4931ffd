"""A real uvicorn server for an ASGI app, on a free loopback port, in the test's event loop
(so tests can inspect the app's tasks), without signal handlers."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import uvicorn

from gateway.config.schema import GatewayConfig
from gateway.runtime.server import listen, uvicorn_config


class _QuietServer(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:  # leave the test runner's signals alone
        yield


@asynccontextmanager
async def run_server(app: Any, gateway_config: GatewayConfig | None = None) -> AsyncIterator[str]:
    """Serve ``app`` with uvicorn on a free loopback port; yields its base URL.

    With ``gateway_config``, as ``tokenpace serve`` does (:func:`gateway.runtime.server.
    uvicorn_config`: the connection limits); else plain uvicorn (the stand-in upstreams).
    """
    sock = listen("127.0.0.1", 0)
    port = sock.getsockname()[1]
    opts: dict[str, Any] = {"log_level": "critical", "timeout_graceful_shutdown": 1}
    if gateway_config is not None:
        config = uvicorn_config(app, gateway_config, **opts)
    else:
        config = uvicorn.Config(app, lifespan="on", access_log=False, ws="none", **opts)
    server = _QuietServer(config)
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
