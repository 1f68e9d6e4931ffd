"""The vLLM plugin's reader channel (qos/vllm/reader_channel.py) on a real redis-server:
what the gateway publishes reaches the scheduler's inbox; nonsense is counted and
dropped; a Redis that goes away and comes back is subscribed to again. No vLLM needed
(the scheduler's side runs in scheduler_cases.py); the configuration's keys too."""

from __future__ import annotations

import threading
import time

import pytest
import redis

from qos.signals import Presence, ReaderSignal, channel, encode_wire
from qos.vllm.config import PluginConfig
from qos.vllm.reader_channel import Arrived, ReaderInbox, ReaderSubscriber
from tests.support.redis_server import RedisServer


def wait_for(predicate, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return bool(predicate())


def test_published_signals_reach_the_inbox_and_nonsense_is_dropped(
    redis_server: RedisServer, key_prefix: str
) -> None:
    inbox = ReaderInbox()
    sub = ReaderSubscriber(redis_server.url, key_prefix, inbox, clock=lambda: 42.0).start()
    publisher = redis.Redis.from_url(redis_server.url)
    try:
        assert sub.subscribed.wait(5)
        away = ReaderSignal(Presence.AWAY, buffer_tokens=12)
        publisher.publish(channel(key_prefix), b"not json")
        publisher.publish(channel(key_prefix), b'{"request_id": "r1", "presence": "asleep"}')
        publisher.publish(channel(key_prefix), encode_wire("r1", away))
        publisher.publish(channel("another-prefix"), encode_wire("r2", away))
        assert wait_for(lambda: len(inbox) == 1)
        assert wait_for(lambda: sub.malformed == 2)
        assert inbox.drain() == [Arrived("r1", away, 42.0)]
        assert inbox.drain() == []
        assert sub.stats() == {
            "reader_signals_received": 1,
            "reader_signals_malformed": 2,
            "reader_channel_reconnects": 0,
        }
    finally:
        publisher.close()
        sub.stop()
    assert not sub._thread.is_alive()


def test_the_subscription_comes_back_with_redis() -> None:
    server = RedisServer().start()
    inbox = ReaderInbox()
    sub = ReaderSubscriber(server.url, "tp", inbox).start()
    try:
        assert sub.subscribed.wait(5)
        server.kill()
        assert wait_for(lambda: sub.reconnects >= 1)
        server.start()  # the same port
        assert wait_for(lambda: sub.subscribed.is_set(), timeout=10)
        with redis.Redis.from_url(server.url) as publisher:
            publisher.publish(channel("tp"), encode_wire("r9", ReaderSignal(Presence.LEFT)))
        assert wait_for(lambda: len(inbox) == 1)
    finally:
        sub.stop()
        server.stop()


def test_the_inbox_is_thread_safe_and_bounded() -> None:
    inbox = ReaderInbox(maxlen=1000)
    signal = ReaderSignal(Presence.WATCHING)

    def produce(name: str) -> None:
        for i in range(5000):
            inbox.put(Arrived(f"{name}{i}", signal, float(i)))

    taken: list[Arrived] = []
    threads = [threading.Thread(target=produce, args=(n,)) for n in "ab"]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        taken += inbox.drain()
    taken += inbox.drain()
    assert len(taken) == len({a.request_id for a in taken}) <= 10000
    assert len(inbox) == 0
    for i in range(1500):
        inbox.put(Arrived(str(i), signal, 0.0))
    kept = inbox.drain()
    assert [a.request_id for a in kept] == [str(i) for i in range(500, 1500)]  # newest kept


def test_the_channel_settings() -> None:
    assert PluginConfig.from_env({}).redis_url is None
    cfg = PluginConfig.from_env(
        {"TOKENPACE_REDIS_URL": "redis://10.0.0.5:6379/0", "TOKENPACE_KEY_PREFIX": "prod"}
    )
    assert (cfg.redis_url, cfg.key_prefix) == ("redis://10.0.0.5:6379/0", "prod")
    assert PluginConfig.from_env({"TOKENPACE_REDIS_URL": "redis://r"}).key_prefix == "tokenpace"
    with pytest.raises(ValueError, match="TOKENPACE_KEY_PREFIX: names the reader channel"):
        PluginConfig.from_env({"TOKENPACE_KEY_PREFIX": "prod"})  # would do nothing
    with pytest.raises(ValueError, match="TOKENPACE_REDIS_URL: must be a Redis URL"):
        PluginConfig.from_env({"TOKENPACE_REDIS_URL": "http://r:6379"})
    with pytest.raises(ValueError, match="TOKENPACE_KEY_PREFIX: must not be empty"):
        PluginConfig.from_env({"TOKENPACE_REDIS_URL": "redis://r", "TOKENPACE_KEY_PREFIX": ""})
