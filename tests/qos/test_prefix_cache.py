"""The block LRU behind both the simulator's prefix caches and the gateway's index."""

from __future__ import annotations

import time

import pytest

from qos.prefix_cache import BlockLRU


def test_a_chain_is_held_up_to_its_first_missing_block() -> None:
    lru = BlockLRU(100)
    assert lru.matched([1, 2, 3]) == 0  # empty: a miss
    lru.touch([1, 2, 3])
    assert lru.matched([1, 2, 3]) == 3  # the whole chain
    assert lru.matched([1, 2, 3, 4, 5]) == 3  # the next turn: its history is held
    # (a name stands for its whole prefix: a chain that parts never meets again)
    assert lru.matched([1, 9, 10]) == 1  # a chain that parts after its first block
    assert lru.matched([7, 8, 9]) == 0
    assert lru.matched([]) == 0


def test_the_least_recently_used_blocks_go_first_and_prefixes_outlive_their_tails() -> None:
    lru = BlockLRU(5)
    lru.touch([1, 2, 3])  # conversation a
    lru.touch([10, 11])  # conversation b: full
    assert len(lru) == 5 and lru.evictions == 0
    lru.touch([1, 2])  # a's first two blocks used again (another turn sharing them)
    lru.touch([20])  # one more: the stalest goes, a's tail block 3
    assert 3 not in lru and lru.evictions == 1
    assert lru.matched([1, 2, 3]) == 2
    lru.touch([30, 31])  # two more: b's blocks, the stalest, tail first order kept
    assert lru.matched([10, 11]) == 0
    assert lru.matched([1, 2]) == 2
    # within one touch the tail is older than the head: evicting one block leaves a prefix
    lru.touch([40, 41, 42, 43, 44])
    lru.touch([50])
    assert lru.matched([40, 41, 42, 43, 44]) == 4


def test_memory_is_bounded_by_the_capacity() -> None:
    lru = BlockLRU(1000)
    for conv in range(500):
        lru.touch([conv * 100 + i for i in range(8)])
    assert len(lru) == 1000
    assert lru.evictions == 500 * 8 - 1000
    assert lru.matched([499 * 100 + i for i in range(8)]) == 8  # the newest is whole
    assert lru.matched([0 * 100 + i for i in range(8)]) == 0  # the oldest is gone
    lru.touch(list(range(10_000, 13_000)))  # a chain longer than the whole index
    assert len(lru) == 1000
    assert lru.matched(list(range(10_000, 13_000))) == 1000


@pytest.mark.parametrize("capacity", [0, -1, 1.5, True])
def test_capacity_must_be_a_positive_integer(capacity: object) -> None:
    with pytest.raises(ValueError, match="capacity"):
        BlockLRU(capacity)  # type: ignore[arg-type]


def test_a_full_index_costs_a_touch_no_more_than_one_with_room() -> None:
    """Evicting the stalest is O(1): a full index (where every touch evicts, as in a
    serving gateway after its first few thousand conversations) is not slower to touch.
    Timed, interleaved in small batches so that a loaded machine slows both alike; a
    plain dict's first-entry scan made the full one about 7 times slower."""
    full, roomy = BlockLRU(65_536), BlockLRU(10_000_000)  # the gateway's default
    times = {id(full): 0.0, id(roomy): 0.0}
    for batch in range(40):
        for lru in (full, roomy) if batch % 2 else (roomy, full):
            started = time.perf_counter()
            for n in range(batch * 500, batch * 500 + 500):
                lru.touch([hash((n, i)) for i in range(11)])
            times[id(lru)] += time.perf_counter() - started
    assert full.evictions > 150_000 and roomy.evictions == 0  # every touch evicts
    assert times[id(full)] < 2.0 * times[id(roomy)], times


def test_a_touch_tells_what_was_held_before_it() -> None:
    lru = BlockLRU(100)
    assert lru.touch([1, 2, 3]) == 0
    assert lru.touch([1, 2, 3, 4]) == 3  # the next turn: its history was held
    assert lru.touch([1, 2, 3, 4]) == 4
    assert lru.touch([1, 7]) == 1


def test_a_held_part_that_is_not_a_prefix_is_held_anew() -> None:
    """Names that collide could leave a chain's later blocks held and an earlier one not:
    the touch still holds the whole chain, in its order, rather than fail."""
    lru = BlockLRU(100)
    lru.touch([1, 2, 3])
    assert lru.touch([9, 2, 3]) == 3  # the bisection sees 2 and 3 held
    assert lru.matched([9, 2, 3]) == 3 and len(lru) == 4
    lru.touch([5])
    assert list(lru._held)[-4:] == [3, 2, 9, 5]  # 9 freshest of its chain, then 5
