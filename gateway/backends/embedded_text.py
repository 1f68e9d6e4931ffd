"""The embedded engine's reply text: deterministic placeholder tokens, cut at stops.

The text of token *i* depends only on the prompt and the choice index
(:func:`text_seed`): ``Simulated reply:`` then lorem-ipsum words, one word per token.
"""

from __future__ import annotations

import hashlib
import random

_LABEL = ("Simulated", " reply", ":")
_LOREM = """lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor
incididunt ut labore et dolore magna aliqua enim ad minim veniam quis nostrud exercitation
ullamco laboris nisi aliquip ex ea commodo consequat duis aute irure in reprehenderit
voluptate velit esse cillum fugiat nulla pariatur excepteur sint occaecat cupidatat non
proident sunt culpa qui officia deserunt mollit anim id est laborum"""
_WORDS = tuple(_LOREM.split())


def text_seed(*parts: str) -> int:
    return int.from_bytes(hashlib.sha256("\x00".join(parts).encode()).digest()[:8], "big")


class Placeholder:
    """Deterministic placeholder tokens: ``Simulated reply:`` then lorem-ipsum words."""

    def __init__(self, seed: int) -> None:
        self._rng = random.Random(seed)
        self._i = 0
        self._words_in_sentence = 0

    def next(self) -> str:
        i = self._i
        self._i += 1
        if i < len(_LABEL):
            return _LABEL[i]
        word = self._rng.choice(_WORDS)
        if self._words_in_sentence == 0:
            word = word.capitalize()
        self._words_in_sentence += 1
        if self._words_in_sentence >= 5 and self._rng.random() < 0.25:
            word += "."
            self._words_in_sentence = 0
        return " " + word


class StopText:
    """A choice's text as it streams, cut at the first ``stop`` string.

    Text that may be the start of a stop string is held back until the next token
    shows whether it is (vLLM does the same); the stop string itself is never sent.
    """

    def __init__(self, stops: tuple[str, ...]) -> None:
        self._stops = stops
        self._pending = ""

    def push(self, token: str) -> tuple[str, bool]:
        """Add a token; return the text that can be sent now and whether a stop matched."""
        self._pending += token
        if not self._stops:
            out, self._pending = self._pending, ""
            return out, False
        hits = [p for s in self._stops if (p := self._pending.find(s)) >= 0]
        if hits:
            out, self._pending = self._pending[: min(hits)], ""
            return out, True
        hold = 0
        for s in self._stops:
            for k in range(min(len(s) - 1, len(self._pending)), hold, -1):
                if self._pending.endswith(s[:k]):
                    hold = k
                    break
        cut = len(self._pending) - hold
        out, self._pending = self._pending[:cut], self._pending[cut:]
        return out, False

    def flush(self) -> str:
        out, self._pending = self._pending, ""
        return out
