"""Reader signals for the vLLM plugin: heard on Redis in a thread, applied at decision time.

The gateway publishes every reader signal it accepts on the shared store's channel
:func:`qos.signals.channel` (``TOKENPACE_KEY_PREFIX``) as :func:`qos.signals.encode_wire`
bytes. With ``TOKENPACE_REDIS_URL`` set, :class:`ReaderSubscriber` listens there in a
daemon thread and puts each signal, with the time it arrived, into a
:class:`ReaderInbox`; the scheduler drains the inbox when it decides
(:meth:`qos.vllm.AndesScheduler._apply_reader_signals`), so the engine's step path never
waits on Redis. The thread never stops or slows the engine: Redis away, it subscribes
again with a backoff (:data:`RECONNECT_S` doubling to :data:`RECONNECT_MAX_S`); a
message that is not a signal is counted and dropped; the inbox is bounded (the oldest
signals go first, :data:`INBOX_MAX`). Redis keeps nothing for a subscriber that is
away, so signals published while the thread reconnects are lost: a client re-sends
``away`` every half lease (:data:`qos.signals.AWAY_LEASE_S`), and a lost ``watching`` costs
at most one lease of away treatment.

Needs redis-py (``redis``) in the engine's environment only when the channel is on. No
vLLM import.
"""

from __future__ import annotations

import importlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from qos.signals import ReaderSignal, channel, decode_wire

logger = logging.getLogger("tokenpace.vllm.reader")

INBOX_MAX = 65536
RECONNECT_S = 0.1
RECONNECT_MAX_S = 5.0
HEALTH_CHECK_S = 30
POLL_S = 0.5  # a wait for the next message ends this often (the thread stops promptly)


@dataclass(frozen=True, slots=True)
class Arrived:
    """One signal as the engine heard it: the gateway's request id, the signal, and
    when it arrived (``time.time()``, the clock of vLLM's ``arrival_time``)."""

    request_id: str
    signal: ReaderSignal
    received_at: float


class ReaderInbox:
    """Signals from the subscriber thread to the scheduler; thread-safe (a deque's
    ``append`` and ``popleft`` are atomic), bounded to ``maxlen`` (the oldest dropped)."""

    def __init__(self, maxlen: int = INBOX_MAX) -> None:
        self._items: deque[Arrived] = deque(maxlen=maxlen)

    def __len__(self) -> int:
        return len(self._items)

    def put(self, item: Arrived) -> None:
        self._items.append(item)

    def drain(self) -> list[Arrived]:
        """Every signal put so far, oldest first."""
        out: list[Arrived] = []
        items = self._items
        while items:
            try:
                out.append(items.popleft())
            except IndexError:  # pragma: no cover - only this thread takes from it
                break
        return out


class ReaderSubscriber:
    """The daemon thread that hears the channel (see the module docstring)."""

    def __init__(
        self,
        url: str,
        key_prefix: str,
        inbox: ReaderInbox,
        clock: Callable[[], float] = time.time,
    ) -> None:
        # only with the channel on (PluginConfig checked redis-py is there): an engine
        # without the channel needs no redis-py
        redis = importlib.import_module("redis")
        # the health check PINGs an idle subscription, so a connection that died
        # silently is found and replaced
        self._client: Any = redis.Redis.from_url(
            url,
            socket_connect_timeout=2.0,
            socket_timeout=POLL_S * 4,
            health_check_interval=HEALTH_CHECK_S,
        )
        self._errors: tuple[type[BaseException], ...] = (redis.RedisError, OSError)
        self.channel = channel(key_prefix)
        self.inbox = inbox
        self.clock = clock
        self.received = 0
        self.malformed = 0
        self.reconnects = 0
        self.subscribed = threading.Event()  # set while the subscription is live
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tokenpace-reader", daemon=True)

    def start(self) -> ReaderSubscriber:
        self._thread.start()
        return self

    def stop(self, timeout: float = 2.0) -> None:
        self._stop.set()
        self._thread.join(timeout)
        self._client.close()

    def stats(self) -> dict[str, int]:
        return {
            "reader_signals_received": self.received,
            "reader_signals_malformed": self.malformed,
            "reader_channel_reconnects": self.reconnects,
        }

    def _run(self) -> None:
        backoff = RECONNECT_S
        while not self._stop.is_set():
            pubsub = self._client.pubsub(ignore_subscribe_messages=True)
            try:
                pubsub.subscribe(self.channel)
                self.subscribed.set()
                backoff = RECONNECT_S
                while not self._stop.is_set():
                    message = pubsub.get_message(timeout=POLL_S)
                    if message is not None and message["type"] == "message":
                        self._take(message["data"])
            except self._errors as exc:
                self.subscribed.clear()
                self.reconnects += 1
                logger.warning(
                    "reader channel %s: %r; subscribing again in %g s", self.channel, exc, backoff
                )
            except Exception:  # never let the thread die: the engine runs on without signals
                self.subscribed.clear()
                self.reconnects += 1
                logger.exception("reader channel %s failed; subscribing again", self.channel)
            finally:
                try:
                    pubsub.close()
                except Exception:  # a connection already broken
                    logger.debug("closing the reader channel's connection failed", exc_info=True)
            self._stop.wait(backoff)
            backoff = min(backoff * 2, RECONNECT_MAX_S)

    def _take(self, data: bytes) -> None:
        try:
            request_id, signal = decode_wire(data)
        except ValueError as exc:
            self.malformed += 1
            logger.warning("reader channel: dropped a message that is not a signal (%s)", exc)
            return
        self.received += 1
        self.inbox.put(Arrived(request_id, signal, self.clock()))
