"""The backend kinds a configuration may name, and the factory of each: one table.

``backends[].kind`` is checked against :data:`gateway.config.schema.BACKEND_KINDS` when the
configuration is parsed, whatever was imported; this table builds them.
"""

from __future__ import annotations

from collections.abc import Callable

from pydantic import BaseModel

from gateway.backends.base import Backend
from gateway.backends.embedded import EmbeddedEngine, EmbeddedOptions
from gateway.backends.http import HttpBackend
from gateway.config.schema import BACKEND_KINDS, BackendConfig, GatewayConfig

BackendFactory = Callable[[BackendConfig, GatewayConfig], Backend]

KINDS: dict[str, BackendFactory] = {
    "http": HttpBackend.from_config,
    "embedded": EmbeddedEngine.from_config,
}
assert set(KINDS) == set(BACKEND_KINDS), "gateway.config.schema.BACKEND_KINDS names every kind"

# The model of ``backends[].options`` for the kinds that take options: the loader checks
# them with the rest of the file (gateway.config.loader.load_config's option_models).
OPTION_MODELS: dict[str, type[BaseModel]] = {"embedded": EmbeddedOptions}


def build_backends(config: GatewayConfig) -> list[Backend]:
    return [KINDS[b.kind](b, config) for b in config.backends]
