"""``bench/routing_instructions.py``: what its subtraction rests on, without Valgrind.

A figure there is a run with N requests less a run with none, so the two runs must send
the same fill, and Cachegrind's totals must be read as the events they are.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.support.paths import ROOT

sys.path.insert(0, str(ROOT / "bench"))
from routing_instructions import per_request, summary, turns


def test_a_run_with_requests_sends_the_same_fill_as_one_without() -> None:
    with_requests = turns(5, 3)
    assert turns(5, 0) == with_requests[:5]
    assert turns(5, 3) == with_requests  # the same requests in every run
    # each measured request is a later turn of a conversation of the fill
    fill_names = {m[1]["content"].split("/")[0] for m in with_requests[:5]}
    assert {m[1]["content"].split("/")[0] for m in with_requests[5:]} <= fill_names


def test_cachegrind_totals_are_read_by_event_and_divided_per_request(tmp_path: Path) -> None:
    out = tmp_path / "cachegrind.out"
    out.write_text(
        "desc: I1 cache: 32768 B, 64 B, 8-way associative\n"
        "cmd: python child\n"
        "events: Ir I1mr ILmr Dr D1mr DLmr Dw D1mw DLmw\n"
        "fl=x.c\nfn=f\n1 5 0 0 1 0 0 0 0 0\n"
        "summary: 3000 40 2 900 60 4 300 8 1\n"
    )
    empty = tmp_path / "empty.out"
    empty.write_text(
        "events: Ir I1mr ILmr Dr D1mr DLmr Dw D1mw DLmw\nsummary: 1000 0 0 0 0 0 0 0 1\n"
    )
    full = summary(out)
    assert full["Ir"] == 3000 and full["D1mr"] == 60 and full["DLmw"] == 1
    assert per_request(full, summary(empty), 2) == {
        "Ir": 1000.0,
        "I1mr": 20.0,
        "ILmr": 1.0,
        "Dr": 450.0,
        "D1mr": 30.0,
        "DLmr": 2.0,
        "Dw": 150.0,
        "D1mw": 4.0,
        "DLmw": 0.0,
    }
    truncated = tmp_path / "truncated.out"
    truncated.write_text("events: Ir\n")
    with pytest.raises(RuntimeError, match="no Cachegrind summary"):
        summary(truncated)
