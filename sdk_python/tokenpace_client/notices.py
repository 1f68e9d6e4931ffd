"""Queue notices: the SSE comments a gateway sends while a streamed request waits for an engine.

The wire format (docs/protocol.md, "Queue notices"): a comment line
``: queued position=<int> eta_s=<float>`` and a blank line, about once a second, before
the first chunk; ``position`` counts from 1 (next to be admitted), ``eta_s`` is the
gateway's estimate of the wait in seconds. Other comments (``: ping``) and malformed
notices are ignored, as every SSE client ignores comments.

openai's SSE decoder drops comments; :func:`listen` has an openai ``Stream`` or
``AsyncStream`` hand its queue notices to a callback as it decodes them.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

_INT = re.compile(r"[0-9]+")
_NUMBER = re.compile(r"[0-9]+(\.[0-9]*)?([eE][+-]?[0-9]+)?")


@dataclass(frozen=True)
class QueueNotice:
    """The request waits for an engine: ``position`` (1: next) and the gateway's ``eta_s``."""

    position: int
    eta_s: float


def parse_queue_notice(comment: str) -> QueueNotice | None:
    """The notice in an SSE comment's text (after the ``:``), else ``None``.

    ``queued position=<int> eta_s=<float>``; fields it does not know are skipped, so the
    gateway may add some. ``None`` unless position >= 1 and eta_s a finite number >= 0.
    """
    words = comment.split()
    if not words or words[0] != "queued":
        return None
    fields = dict(word.partition("=")[::2] for word in words[1:])
    position, eta = fields.get("position", ""), fields.get("eta_s", "")
    if not _INT.fullmatch(position) or not _NUMBER.fullmatch(eta):
        return None
    eta_s = float(eta)
    if int(position) < 1 or not math.isfinite(eta_s):
        return None
    return QueueNotice(int(position), eta_s)


def listen(stream: Any, on_notice: Callable[[QueueNotice], None]) -> None:
    """Have ``stream``'s SSE decoder call ``on_notice`` with each queue notice it reads.

    For an openai ``Stream``/``AsyncStream`` (its decoder, pinned: openai 3.x, decodes one
    line at a time with ``decode(line)``) that has not been read yet; anything else is
    left as it is. The notices come in the task or thread that reads the stream.
    """
    decoder: Any = getattr(stream, "_decoder", None)
    decode = getattr(decoder, "decode", None)
    if not callable(decode):
        return

    def decode_line(line: str) -> Any:
        if line.startswith(":"):
            notice = parse_queue_notice(line[1:])
            if notice is not None:
                on_notice(notice)
        return decode(line)

    decoder.decode = decode_line
