"""What a prefix cache holds: an LRU over prompt blocks named by a hash chain.

A prompt is cut into fixed blocks; block ``i`` is named by a hash of block ``i`` and the
name of block ``i - 1``, so a name stands for the whole prefix up to and including its
block (vLLM's automatic prefix caching names its KV blocks this way). Only whole blocks
count, as in vLLM.

:class:`BlockLRU` keeps at most ``capacity`` names, least recently used out first. A
prompt's blocks are touched last block first, so a prefix is always fresher than its
extensions: whenever block ``i`` of a chain is held, blocks ``0..i-1`` are too (each
touch of block ``i`` touched them after it, and eviction takes the stalest). The held
part of a chain is therefore a prefix of it, found by bisection in ``O(log n)``
look-ups. vLLM evicts in the same order (a freed request's tail blocks first).

The simulator's engine replicas use it as their KV cache's prefix cache; the gateway
uses it as its estimate of what each backend holds.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Sequence


class BlockLRU:
    """At most ``capacity`` block names, least recently used evicted first."""

    __slots__ = ("_held", "capacity", "evictions")

    def __init__(self, capacity: int) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"capacity: must be an integer >= 1, got {capacity!r}")
        self.capacity = capacity
        # an OrderedDict, not a dict: its oldest entry is found and moved in O(1) (a dict's
        # first live entry is found by stepping over every entry deleted before it)
        self._held: OrderedDict[Hashable, None] = OrderedDict()  # oldest first
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._held)

    def __contains__(self, block: Hashable) -> bool:
        return block in self._held

    def matched(self, chain: Sequence[Hashable]) -> int:
        """How many leading blocks of ``chain`` are held (the module docstring: a prefix)."""
        held = self._held
        lo, hi = 0, len(chain)  # chain[:lo] held; chain[hi:] not
        while lo < hi:
            mid = (lo + hi) // 2
            if chain[mid] in held:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def touch(self, chain: Sequence[Hashable]) -> int:
        """``chain``'s blocks were just used: hold them as the freshest, last block first.
        Returns how many leading blocks were held before (:meth:`matched`)."""
        chain = chain[: self.capacity]
        was_held = self.matched(chain)
        held = self._held
        for block in reversed(chain[was_held:]):  # new: each in at the freshest end
            held[block] = None
        freshest = held.move_to_end
        try:
            for block in reversed(chain[:was_held]):  # held (a prefix): each moved there
                freshest(block)
        except KeyError:  # not a prefix after all (names that collide): each held anew
            for block in reversed(chain):
                held[block] = None
                freshest(block)
        excess = len(held) - self.capacity
        if excess > 0:
            stalest = held.popitem
            for _ in range(excess):
                stalest(last=False)
            self.evictions += excess
        return was_held
