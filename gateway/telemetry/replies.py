"""The gateway's own QoE of the streams it relayed, measured in batches.

A completed stream hands its :class:`~gateway.context.Emissions` to :class:`Replies`
(an append: its writes' times and token counts, after the others'); the telemetry's
flush measures every reply waiting at once, :func:`qos.metrics.replies_qoe`: Andes
Eq. 1, the monotone QoE, the freezes and the user idle latency (Wang et al. Eq. 9) of
each, the very numbers :func:`qos.metrics.reply_qoe` gives of it alone, in as many numpy
calls per batch as one reply would take per length. A request pays for an append, not
for numpy's fixed cost on a short timeline.
"""

from __future__ import annotations

import logging
from array import array
from dataclasses import dataclass

import numpy as np

from gateway.context import Emissions, RequestContext
from qos.metrics import ReplyQoE, replies_qoe, reply_qoe

log = logging.getLogger("tokenpace.gateway.telemetry")


@dataclass(frozen=True, slots=True)
class Reply:
    """Whose a reply was and how it ended, for its QoE record."""

    request_id: str
    tenant: str
    tier: str
    outcome: str


class Replies:
    """Completed streams waiting for their QoE (module doc), at most ``limit`` of them."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._clear()

    def _clear(self) -> None:
        self._times = array("d")  # every waiting reply's emission times, one after another
        self._counts = array("q")  # the tokens of each of those writes
        self._tokens: list[int] = []  # each reply's tokens
        self._ttft: list[float] = []  # each reply's tier's expectations
        self._tds: list[float] = []
        self._replies: list[Reply] = []

    def __len__(self) -> int:
        return len(self._replies)

    def add(self, ctx: RequestContext, outcome: str, emissions: Emissions) -> None:
        """Keep a completed stream's emissions until :meth:`measure` (dropped past the
        limit: the records are best effort, as the flush's queue)."""
        if len(self._replies) >= self.limit:
            return
        self._times.extend(emissions.times)
        self._counts.extend(emissions.counts)
        self._tokens.append(sum(emissions.counts))
        self._ttft.append(ctx.tier.ttft)
        self._tds.append(ctx.tier.tds)
        self._replies.append(Reply(ctx.request_id, ctx.tenant, ctx.tier.name, outcome))

    def measure(self) -> list[tuple[Reply, ReplyQoE]]:
        """The QoE of every waiting reply, which no longer waits."""
        if not self._replies:
            return []
        replies, tokens, ttft, tds = self._replies, self._tokens, self._ttft, self._tds
        times = np.repeat(np.frombuffer(self._times), np.frombuffer(self._counts, np.int64))
        self._clear()
        try:
            return list(zip(replies, replies_qoe(times, tokens, ttft, tds), strict=True))
        except ValueError as exc:  # cannot happen with monotonic times: each on its own
            log.warning("QoE of a batch not computed: %s", exc)
        measured = []
        ends = np.cumsum(tokens).tolist()
        for i, reply in enumerate(replies):
            try:
                qoe = reply_qoe(times[ends[i] - tokens[i] : ends[i]], ttft[i], tds[i])
            except ValueError as exc:
                log.warning("QoE of request %s not computed: %s", reply.request_id, exc)
                continue
            measured.append((reply, qoe))
        return measured
