"""The gateway's QoE of the streams it relayed, measured in batches
(gateway.telemetry.replies): the very numbers of each stream measured alone."""

from __future__ import annotations

import random
from array import array

from gateway.context import Emissions, RequestContext, ResolvedTier
from gateway.telemetry.replies import Replies, Reply
from qos.metrics import reply_qoe

TIERS = [ResolvedTier("voice", 0.5, 20.0, 0), ResolvedTier("chat", 1.0, 4.8, 1)]


def _stream(rng: random.Random, i: int) -> tuple[RequestContext, Emissions]:
    """A stream's context and emissions: writes of 1-4 tokens, bursts and stalls."""
    tier = TIERS[i % 2]
    ctx = RequestContext(
        f"{i:032x}", f"t{i % 3}", 1.0, tier, "chat.completions", "m", True, 0.0, 16
    )
    times, counts, t = array("d"), array("q"), rng.uniform(0.05, 2.0)
    for _ in range(rng.choice([1, 1, 2, 9, 40, 130])):
        t += rng.choice([0.0, 0.01, 0.2, 1.5])
        times.append(t)
        counts.append(rng.randint(1, 4))
    return ctx, Emissions(times, counts)


def test_a_batch_of_streams_measures_each_as_alone():
    rng = random.Random(3)
    streams = [_stream(rng, i) for i in range(60)]
    replies = Replies(limit=100)
    for ctx, emissions in streams:
        replies.add(ctx, "completed", emissions)
    assert len(replies) == 60
    got = replies.measure()
    assert len(replies) == 0 and replies.measure() == []
    expected = [
        (
            Reply(ctx.request_id, ctx.tenant, ctx.tier.name, "completed"),
            reply_qoe(list(zip(e.times, e.counts, strict=True)), ctx.tier.ttft, ctx.tier.tds),
        )
        for ctx, e in streams
    ]
    assert got == expected  # exact: the same floats as each stream's own measure
    assert any(qoe.freezes.count for _, qoe in got)


def test_replies_past_the_limit_are_dropped():
    rng = random.Random(4)
    replies = Replies(limit=2)
    for i in range(3):
        ctx, emissions = _stream(rng, i)
        replies.add(ctx, "completed", emissions)
    assert [reply.request_id for reply, _ in replies.measure()] == [f"{0:032x}", f"{1:032x}"]
