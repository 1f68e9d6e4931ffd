"""The typed values passed between a policy's stages and handed back to the engine.

Modelled on vLLM v1's scheduler (``vllm/v1/core/sched/interface.py``, ``output.py``): a
decision is a value, not a set of flags and counters left on the policy. The ranking
stage (Andes' solver, :mod:`qos.policy.andes`) returns a :class:`Ranking`; the reader
guard (:mod:`qos.policy.reader`) takes it and returns a :class:`Decision`: which rows
run, why each request left waiting was held, and the decision's counts.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

import numpy as np


class Hold(IntEnum):
    """Why a request with no token yet was not admitted by a decision."""

    NONE = 0  # admitted, or not a request waiting for its first token
    KV = 1  # the cache's room (its watermark less every committed reply's KV) is spent
    SLOTS = 2  # the batch is full
    READERS_RATE = 3  # the readers' rate room is spent: one more could not be paced
    PREFILL = 4  # its prefill would make a running reader wait past its deadline
    LINE = 5  # in line behind a held request (an overdue one, or a plan's line)


@dataclass(frozen=True)
class Ranking:
    """The ranking stage's result: the requests waiting for their first token in the
    order it would admit them, the decode latency τ it expects of the next iteration,
    and, where tenant weights act, each row's VTC level (lower first), which orders the
    replies due when the engine cannot run them all."""

    admissions: np.ndarray  # row indices, most preferred first
    tau: float
    levels: np.ndarray | None = None


@dataclass(frozen=True)
class Decision:
    """Which rows run in the next iteration (``run``, a bool mask over the table) and,
    for every row, why it was held (:class:`Hold`; NONE where it runs or was no fresh
    request). ``forced``: replies due (their readers about to wait) that the ranking
    had left out; ``preempted``: running rows left out."""

    run: np.ndarray
    holds: np.ndarray
    forced: int = 0
    preempted: int = 0

    @property
    def held(self) -> int:
        """Requests waiting for their first token that this decision did not admit."""
        return int(np.count_nonzero(self.holds))

    def held_for(self, reason: Hold) -> int:
        """How many were held for ``reason``."""
        return int(np.count_nonzero(self.holds == reason))

    @classmethod
    def of(cls, run: np.ndarray, running: np.ndarray) -> Decision:
        """A decision made without the guard: ``run``, no reasons, its preemptions."""
        holds = np.zeros(run.size, dtype=np.int8)
        return cls(run, holds, preempted=int(np.count_nonzero(running & ~run)))
