"""The backend kinds a configuration may name, and the factory of each: one table.

``backends[].kind`` is checked against :data:`gateway.config.schema.BACKEND_KINDS` when the
configuration is parsed, whatever was imported; this table builds them.
"""

from __future__ import annotations

from collections.abc import Callable

from gateway.backends.base import Backend
from gateway.backends.embedded import EmbeddedEngine
from gateway.backends.http import HttpBackend
from gateway.config.schema import BACKEND_KINDS, BackendConfig, GatewayConfig

BackendFactory = Callable[[BackendConfig, GatewayConfig], Backend]

KINDS: dict[str, BackendFactory] = {
    "http": HttpBackend.from_config,
    "embedded": EmbeddedEngine.from_config,
}
assert set(KINDS) == set(BACKEND_KINDS), "gateway.config.schema.BACKEND_KINDS names every kind"


def build_backends(config: GatewayConfig) -> list[Backend]:
    return [KINDS[b.kind](b, config) for b in config.backends]
