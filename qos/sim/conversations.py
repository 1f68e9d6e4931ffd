"""A multi-turn chat workload: conversations that resend their history at every turn.

Each conversation belongs to an app, and every app has one system prompt that all its
conversations start with. Turn ``k`` sends the system prompt, the earlier turns (each
user message and the reply to it) and a new user message; its reply streams back, the
user reads it and thinks (``think_s``, exponential), then sends the next turn. So the
next turn's arrival depends on when the reply ended: a closed loop per conversation,
which the cluster simulator (:mod:`qos.sim.cluster`) runs. Conversations start as a
Poisson process.

Token lengths are drawn per turn, uniformly in their ranges; everything is deterministic
for a seed. Prompt blocks are named as a prefix cache would name them
(:meth:`Turn.blocks`): a block wholly inside the system prompt by its app and place, any
later block by its conversation and place, which stands for its whole prefix since a
conversation's text only grows.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class ChatShape:
    """The workload's shape: apps, lengths in tokens, turns and think time."""

    apps: int = 4
    system_tokens: int = 1500
    user_tokens: tuple[int, int] = (40, 200)
    reply_tokens: tuple[int, int] = (80, 400)
    turns: tuple[int, int] = (2, 8)
    think_s: float = 8.0  # mean
    ttft: float = 1.0  # the chat tier
    tds: float = 4.8

    def __post_init__(self) -> None:
        if self.apps < 1 or self.system_tokens < 0 or self.think_s < 0:
            raise ValueError("apps >= 1, system_tokens >= 0 and think_s >= 0 are required")
        for name in ("user_tokens", "reply_tokens", "turns"):
            lo, hi = getattr(self, name)
            if not 1 <= lo <= hi:
                raise ValueError(f"{name}: need 1 <= low <= high, got {(lo, hi)}")


@dataclass(frozen=True)
class Turn:
    """One turn of a conversation: what it sends and what it gets back."""

    conversation: int
    app: int
    index: int  # 0 for the first turn
    system_tokens: int
    history_tokens: int  # the earlier turns' messages and replies
    user_tokens: int
    reply_tokens: int
    think_s: float  # the user's pause after this turn's reply, before the next turn

    @property
    def id(self) -> str:
        return f"c{self.conversation}-t{self.index}"

    @property
    def prompt_tokens(self) -> int:
        return self.system_tokens + self.history_tokens + self.user_tokens

    def blocks(self, block_size: int, tokens: int | None = None) -> tuple[tuple[int, ...], ...]:
        """The names of the whole blocks of the first ``tokens`` tokens of this turn's
        text (default: its prompt; up to the prompt and its reply)."""
        n = (self.prompt_tokens if tokens is None else tokens) // block_size
        in_system = self.system_tokens // block_size
        return tuple(
            (0, self.app, i) if i < in_system else (1, self.conversation, i) for i in range(n)
        )


@dataclass(frozen=True)
class Conversation:
    id: int
    app: int
    start: float
    turns: tuple[Turn, ...]


def build_conversations(shape: ChatShape, n: int, rate: float, seed: int = 0) -> list[Conversation]:
    """``n`` conversations starting as a Poisson process of ``rate`` per second."""
    if n < 1 or not rate > 0:
        raise ValueError(f"need n >= 1 and rate > 0, got n={n}, rate={rate}")
    rng = np.random.default_rng(seed)
    starts = np.cumsum(rng.exponential(1.0 / rate, size=n))
    out = []
    for c in range(n):
        app = int(rng.integers(shape.apps))
        turns: list[Turn] = []
        history = 0
        for k in range(int(rng.integers(shape.turns[0], shape.turns[1] + 1))):
            user = int(rng.integers(shape.user_tokens[0], shape.user_tokens[1] + 1))
            reply = int(rng.integers(shape.reply_tokens[0], shape.reply_tokens[1] + 1))
            think = float(rng.exponential(shape.think_s)) if shape.think_s > 0 else 0.0
            turns.append(Turn(c, app, k, shape.system_tokens, history, user, reply, think))
            history += user + reply
        out.append(Conversation(c, app, float(starts[c]), tuple(turns)))
    return out


def mean_turn(conversations: list[Conversation]) -> tuple[float, float, float]:
    """Mean prompt tokens, mean prompt tokens beyond the system prompt, and mean reply
    tokens per turn."""
    turns = [t for c in conversations for t in c.turns]
    prompt = float(np.mean([t.prompt_tokens for t in turns]))
    beyond = float(np.mean([t.history_tokens + t.user_tokens for t in turns]))
    return prompt, beyond, float(np.mean([t.reply_tokens for t in turns]))
