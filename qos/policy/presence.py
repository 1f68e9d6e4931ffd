"""What the reader signals a table recorded say of each reply's reader, in columns.

:meth:`~qos.policy.table.RequestTable.reader_signal` keeps, per reply, what its client
last said: ``away_until`` (away while ``now`` is before it), ``reader_pace`` (at most the
tier's TDS), and the buffer it stated (``stated_buffer`` tokens received and not yet
shown at ``stated_at``, when the reply had sent ``stated_output``). This module turns
those into what the reader guard (:mod:`qos.policy.reader`) and operators need:

- :func:`held`: the tokens the client holds unshown now. While the reader is away
  nothing is shown (the SDKs' pacers stop), so every token sent since the statement is
  held: ``stated_buffer + (output - stated_output)``.
- :func:`yielding`: the started replies whose readers are away and hold their
  *return cushion*: they owe nobody a token until their reader comes back.
- :func:`away_share`, :func:`rate_given_back`: the operators' gauges.
"""

from __future__ import annotations

import numpy as np

from qos.policy.table import NO_TOKEN, RequestTable

SIGNAL_PATH_S = 0.05
"""The longest a signal takes from the client to the engine's table, beyond the engine's
own decision interval: one HTTP request to the gateway on a loaded internet path, and a
publish on the shared store (docs/architecture/reader-signals.md)."""

OPERATOR_RETURN_S = 1.0
"""The return latency :func:`rate_given_back` counts a cushion with by default: the order
of what the guard derives per reply (:meth:`~qos.policy.reader.ReaderGuard.return_s`,
0.1-1.1 s on the shipped profiles; it grows with the reply's context)."""


def signalled(table: RequestTable) -> np.ndarray:
    """The rows a signal may have changed anything for: away, a pace below the tier's,
    or a stated buffer (which counts only while away). Every other row is scheduled
    exactly as without signals."""
    mask: np.ndarray = (
        (table.col("away_until") > NO_TOKEN)
        | (table.col("reader_pace") < table.col("tds"))
        | (table.col("stated_buffer") >= 0)
    )
    return mask


def away(table: RequestTable, now: float) -> np.ndarray:
    """The rows whose reader is away (or gone: the reply is about to be ended) at ``now``."""
    mask: np.ndarray = table.col("away_until") > now
    return mask


def held(table: RequestTable) -> np.ndarray:
    """Tokens each client holds unshown, by its last statement and what was sent since
    (module doc); -1 where no buffer was ever stated."""
    stated = table.col("stated_buffer")
    tokens: np.ndarray = np.where(
        stated >= 0, stated + table.col("output") - table.col("stated_output"), -1
    )
    return tokens


def yielding(table: RequestTable, now: float, return_s: np.ndarray | float) -> np.ndarray:
    """The started replies whose readers are away holding at least their return cushion:
    ``return_s`` (per row, or one for all) times the reader's pace, the tokens it shows
    between coming back and the reply's next token. A reader away without a stated
    buffer does not yield: the server's model stands."""
    cushion = np.asarray(return_s) * table.col("reader_pace")
    mask: np.ndarray = (
        away(table, now) & (table.col("output") > 0) & (held(table) >= np.ceil(cushion))
    )
    return mask


def away_share(table: RequestTable, now: float) -> float:
    """The share of started replies whose readers are away at ``now`` (0 with none
    started)."""
    started = table.col("output") > 0
    count = int(np.count_nonzero(started))
    return int(np.count_nonzero(started & away(table, now))) / count if count else 0.0


def rate_given_back(table: RequestTable, now: float, return_s: float = OPERATOR_RETURN_S) -> float:
    """Tokens a second of tier pace (TDS) the replies of away readers no longer ask of
    the engine at ``now``: those holding their return cushion for ``return_s``
    (:func:`yielding`)."""
    return float(table.col("tds")[yielding(table, now, return_s)].sum())
