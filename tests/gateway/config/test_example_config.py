"""examples/gateway.example.yaml, the file a newcomer starts from: valid, and no HTTP
backend on the gateway's own address (run beside it, the gateway would call itself and
answer its own 401)."""

from __future__ import annotations

from urllib.parse import urlsplit

from gateway.config.loader import load_config
from tests.support.paths import EXAMPLES


def test_no_backend_listens_where_the_gateway_does():
    config = load_config(EXAMPLES / "gateway.example.yaml")
    own = {("127.0.0.1", config.server.port), ("localhost", config.server.port)}
    urls = [b.url for b in config.backends if b.url]
    assert urls
    for url in urls:
        parts = urlsplit(url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        assert (parts.hostname, port) not in own, url
