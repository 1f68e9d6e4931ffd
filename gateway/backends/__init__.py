"""Backends: the engines a request can be routed to.

``base`` (the :class:`Backend` seam, :class:`InProcessBackend`), ``http`` (an
OpenAI-compatible server over HTTP), ``sse`` (its event stream read), ``chunk`` (what
the relay reads of each chunk), ``aggregate`` (chunks folded into one response),
``kinds`` (the backend kinds of a configuration).
"""

from gateway.backends.aggregate import aggregate_chunks
from gateway.backends.base import (
    Backend,
    BackendError,
    BackendRuntime,
    Batch,
    ChunkStream,
    GeneratorChunkStream,
    InProcessBackend,
)

__all__ = [
    "Backend",
    "BackendError",
    "BackendRuntime",
    "Batch",
    "ChunkStream",
    "GeneratorChunkStream",
    "InProcessBackend",
    "aggregate_chunks",
]
