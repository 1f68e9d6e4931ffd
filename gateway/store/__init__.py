"""The gateway's shared state: :func:`build_store` picks the implementation.

Without ``store.redis_url``: :class:`MemoryStore` (one replica). With it: Redis, with
the local fallback of :class:`ResilientStore`. See ``gateway/store/base.py``.
"""

from __future__ import annotations

from gateway.config.schema import GatewayConfig
from gateway.store.base import (
    Admission,
    Arrival,
    Limits,
    QoEAggregates,
    QoERecord,
    RequestInfo,
    Slot,
    Standing,
    Store,
    StoreBusy,
    StoreCommandError,
    StoreMonitor,
    StoreUnavailable,
    store_unavailable,
)
from gateway.store.memory import MemoryStore
from gateway.store.redis import RedisStore
from gateway.store.resilient import ResilientStore

__all__ = [
    "Admission",
    "Arrival",
    "Limits",
    "MemoryStore",
    "QoEAggregates",
    "QoERecord",
    "RedisStore",
    "RequestInfo",
    "ResilientStore",
    "Slot",
    "Standing",
    "Store",
    "StoreBusy",
    "StoreCommandError",
    "StoreMonitor",
    "StoreUnavailable",
    "build_store",
    "store_unavailable",
]


def build_store(config: GatewayConfig, monitor: StoreMonitor | None = None) -> Store:
    """The store of ``config``; ``monitor`` hears how it fares (the gateway's metrics)."""
    s, t = config.store, config.telemetry
    monitor = monitor or StoreMonitor()
    local = MemoryStore(
        max_requests=config.recent_requests, max_records=t.max_records, retention_s=t.retention_s
    )
    if s.redis_url is None:
        monitor.mode("memory")
        return local
    redis = RedisStore(
        s.redis_url,
        s.key_prefix,
        timeout_s=s.timeout_s,
        request_ttl_s=s.request_ttl_s,
        retention_s=t.retention_s,
        max_records=t.max_records,
        max_connections=s.max_connections,
        monitor=monitor,
    )
    return ResilientStore(
        redis,
        local,
        fail_open=s.fail_mode == "open",
        reconnect_interval_s=s.reconnect_interval_s,
        buffer_max=t.buffer_max,
        monitor=monitor,
    )
