"""The gateway's stack with nothing of the gateway: what the libraries alone cost.

A FastAPI app with one route, ``POST /v1/chat/completions``, that forwards the body to
the upstream through an ``httpx.AsyncClient`` on the gateway's own transport
(``gateway.backends.http.upstream_transport``) and streams the reply back through
sse-starlette, relaying the upstream's bytes as read: no authentication, validation,
tiers, admission, metrics, parsing or QoE. Served by uvicorn with the same settings
as ``tokenpace serve`` (no access log; start-up objects frozen out of the collector).

``bench/gateway_load.py`` runs it as the target ``floor`` beside the gateway: the
difference between the two is what the gateway's own work costs, and the floor's own
figures are the least the stack the gateway is built on (FastAPI, sse-starlette,
httpx) adds on the machine it runs on. Not a product: a measuring stick.

    python bench/stack_floor.py --port 9100 --upstream http://127.0.0.1:9000/v1
"""

from __future__ import annotations

import argparse
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import uvicorn
from fastapi import FastAPI, Request
from sse_starlette.sse import EventSourceResponse

from gateway.backends.http import upstream_transport
from gateway.backends.upstream import body_reader
from gateway.runtime.server import tune_garbage_collector


def create_app(upstream: str, max_connections: int) -> FastAPI:
    state: dict[str, httpx.AsyncClient] = {}

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        transport = upstream_transport(max_connections)
        async with httpx.AsyncClient(transport=transport, timeout=None) as client:
            state["client"] = client
            yield

    app = FastAPI(lifespan=lifespan)

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> EventSourceResponse:
        client = state["client"]
        upstream_request = client.build_request(
            "POST",
            f"{upstream}/chat/completions",
            content=await request.body(),
            headers={"Content-Type": "application/json", "Accept-Encoding": "identity"},
        )
        resp = await client.send(upstream_request, stream=True)
        read = body_reader(resp)

        async def relay() -> AsyncIterator[bytes]:
            try:
                while part := await read():
                    yield part
            finally:
                await resp.aclose()

        return EventSourceResponse(relay(), ping=3600, sep="\n")

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    return app


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--upstream", required=True, help="base URL including /v1")
    p.add_argument("--max-connections", type=int, default=512)
    a = p.parse_args()
    app = create_app(a.upstream, a.max_connections)
    tune_garbage_collector()
    uvicorn.run(app, host=a.host, port=a.port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
