"""HttpChunkStream's byte-level SSE parsing: line endings, split reads, batches, end of body."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import orjson
import pytest

from gateway.backends import BackendError
from gateway.backends.sse import HttpChunkStream


def _response(parts: list[bytes]) -> httpx.Response:
    async def body() -> AsyncIterator[bytes]:
        for part in parts:
            yield part

    return httpx.Response(200, content=body())


async def _chunks(parts: list[bytes]) -> list[dict]:
    stream = HttpChunkStream("b", _response(parts))
    try:
        return [chunk async for chunk in stream.chunks()]
    finally:
        await stream.aclose()


EVENTS = (
    b': keep-alive\n\ndata: {"n": 1}\n\nevent: x\nid: 7\ndata: {"n":\ndata: 2}\n\n'
    b'data:{"n": 3}\n\ndata: [DONE]\n\n'
)


@pytest.mark.parametrize("eol", [b"\n", b"\r\n", b"\r"])
@pytest.mark.parametrize("size", [1, 2, 3, 7, 1000])
async def test_events_across_reads_and_line_endings(eol: bytes, size: int) -> None:
    raw = EVENTS.replace(b"\n", eol)
    parts = [raw[i : i + size] for i in range(0, len(raw), size)]
    assert await _chunks(parts) == [{"n": 1}, {"n": 2}, {"n": 3}]


async def test_nothing_after_done_is_read() -> None:
    assert await _chunks([b'data: {"n": 1}\n\ndata: [DONE]\n\ndata: {"n": 2}\n\n']) == [{"n": 1}]


async def test_last_event_without_blank_line_then_truncated() -> None:
    stream = HttpChunkStream("b", _response([b'data: {"n": 1}\n\n', b'data: {"n": 2}']))
    assert (await stream.next_batch()).chunks == [{"n": 1}]
    assert (await stream.next_batch()).chunks == [{"n": 2}]
    with pytest.raises(BackendError) as err:
        await stream.next_batch()
    assert err.value.code == "upstream_truncated"
    await stream.aclose()


async def test_a_batch_is_what_one_read_brought() -> None:
    stream = HttpChunkStream(
        "b", _response([b'data: {"n": 1}\n\ndata: {"n": 2}\n\ndata: {"n"', b": 3}\n\n"])
    )
    assert (await stream.next_batch()).chunks == [{"n": 1}, {"n": 2}]
    assert (await stream.next_batch()).chunks == [{"n": 3}]
    await stream.aclose()


async def test_good_events_before_a_bad_one_come_first() -> None:
    """A read with good events then a malformed one: the good ones, then the error."""
    stream = HttpChunkStream("b", _response([b'data: {"n": 1}\n\ndata: {oops\n\n']))
    assert (await stream.next_batch()).chunks == [{"n": 1}]
    for _ in range(2):  # and it stays failed
        with pytest.raises(BackendError) as err:
            await stream.next_batch()
        assert err.value.code == "upstream_bad_response"
    await stream.aclose()


async def test_malformed_and_error_events() -> None:
    with pytest.raises(BackendError) as err:
        await _chunks([b"data: {not json\n\n"])
    assert err.value.code == "upstream_bad_response"
    with pytest.raises(BackendError) as err:
        await _chunks([b'data: {"error": {"message": "boom"}}\n\n'])
    assert err.value.message == "boom" and not err.value.retryable


async def test_an_event_that_is_not_a_chunk_fails_the_stream_saying_why() -> None:
    for event, why in [
        (b"data: [1, 2]\n\n", "Expected `object`, got `array`"),
        (b'data: {"choices": "abc"}\n\n', "at `$.choices`"),
    ]:
        with pytest.raises(BackendError) as err:
            await _chunks([b'data: {"n": 1}\n\n' + event])
        assert err.value.code == "upstream_bad_response"
        assert "not an OpenAI chunk" in err.value.message and why in err.value.message


async def test_last_event_is_the_event_as_received() -> None:
    """One-line events are relayed byte for byte; a multi-line one on one line."""
    stream = HttpChunkStream("b", _response([EVENTS.replace(b"\n", b"\r\n")]))
    seen = await stream.next_batch()
    assert (await stream.next_batch()).chunks == []
    await stream.aclose()
    assert seen.chunks == [{"n": 1}, {"n": 2}, {"n": 3}]
    assert seen.data == b'data: {"n": 1}\n\ndata: {"n":2}\n\ndata: {"n": 3}\n\n'


def _token(text: str, **extra: object) -> bytes:
    chunk = {"choices": [{"index": 0, "delta": {"content": text}}], **extra}
    return b"data: " + orjson.dumps(chunk) + b"\n\n"


async def test_a_read_of_whole_events_is_relayed_as_read() -> None:
    role = b'data: {"choices": [{"index": 0, "delta": {"role": "assistant"}}]}\n\n'
    first = role + _token("a") + _token("b")
    stream = HttpChunkStream("b", _response([first, _token("c")[:9], _token("c")[9:]]))
    batch = await stream.next_batch()
    assert batch.data is first  # not a copy
    assert (batch.tokens, batch.token_chunks, batch.usage) == (2, 2, None)
    batch = await stream.next_batch()  # one event over two reads: rebuilt, same bytes
    assert batch.data == _token("c") and batch.tokens == 1
    await stream.aclose()


async def test_a_batch_counts_tokens_with_running_usage() -> None:
    """Several tokens per chunk (vLLM's --stream-interval) counted from the running
    ``usage.completion_tokens``; [DONE] is not relayed."""
    usage = {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}
    final = b'data: {"choices": [], "usage": {"completion_tokens": 9}}\n\n'
    parts = [_token("abcd", usage=usage), _token("efgh") + final + b"data: [DONE]\n\n"]
    stream = HttpChunkStream("b", _response(parts))
    batch = await stream.next_batch()
    assert (batch.tokens, batch.token_chunks, batch.usage) == (4, 1, usage)
    batch = await stream.next_batch()
    assert (batch.tokens, batch.token_chunks) == (1, 1)  # no running count: one per choice
    assert batch.usage == {"completion_tokens": 9}
    assert batch.data == _token("efgh") + final
    assert (await stream.next_batch()).chunks == []
    await stream.aclose()


async def test_a_cancelled_wait_loses_nothing_on_any_transport() -> None:
    """The relay cancels waits at its ping deadline; the events still arrive, whole."""

    async def slow_body() -> AsyncIterator[bytes]:
        await asyncio.sleep(0.2)
        yield b'data: {"n": 1}\n\ndata: [DONE]\n\n'

    stream = HttpChunkStream("b", httpx.Response(200, content=slow_body()))
    for _ in range(2):
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.05):
                await stream.next_batch()
    assert (await stream.next_batch()).chunks == [{"n": 1}]
    assert (await stream.next_batch()).chunks == []
    await stream.aclose()
