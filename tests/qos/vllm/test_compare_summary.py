"""``bench/vllm_compare.py``'s figures of one engine's run (``vllm_harness.summarize``):
freezes are counted over the replies someone reads, every reply's share beside, as the
random-workload sweep counts them."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from qos.metrics import andes_qoe, freezes, user_idle_latency
from tests.support.paths import ROOT

sys.path.insert(0, str(ROOT / "bench"))
from vllm_harness import Job, JobResult, summarize

TDS = 10.0


def reply(tier: str, at_s: float, times: list[tuple[float, int]]) -> JobResult:
    """A reply received at ``times`` (seconds after it was sent, tokens), measured as
    the harness measures it at the client."""
    tokens = sum(n for _, n in times)
    return JobResult(
        job=Job(at_s, tier, "hi", tokens),
        ttft_expected=1.0,
        tds_expected=TDS,
        times=times,
        completion_tokens=tokens,
        qoe=andes_qoe(times, 1.0, TDS),
        elapsed_s=times[-1][0],
        longest_freeze_s=freezes(times, TDS).longest_s,
        idle_s=user_idle_latency(times, 1.0, TDS),
    )


def steady(first_s: float, tokens: int) -> list[tuple[float, int]]:
    """``tokens`` tokens one at a time at the reader's pace from ``first_s``."""
    return [(first_s + i / TDS, 1) for i in range(tokens)]


def test_a_batch_reply_that_stalls_is_not_a_reader_frozen() -> None:
    chat = [reply("chat", float(i), steady(0.5 + 0.5 * i, 20)) for i in range(3)]
    stalled = steady(0.2, 10) + [(0.2 + 1.0 + 5.0 + i / TDS, 1) for i in range(10)]
    batch = reply("batch", 0.5, stalled)  # nothing for 5 s after its tenth token
    figures = summarize([*chat, batch], {})
    assert figures["frozen_over_2s"] == 0.0  # the readers' replies
    assert figures["longest_freeze_s"] < 0.01
    assert figures["frozen_over_2s_all"] == pytest.approx(0.25)  # every reply's
    assert figures["longest_freeze_all_s"] == pytest.approx(batch.longest_freeze_s)
    assert batch.longest_freeze_s > 4.0
    # the readers' TTFT leaves the batch reply out; everyone's keeps it
    assert figures["readers_p90_ttft_s"] == pytest.approx(0.5 + 0.5 * 1.8)
    assert figures["p90_ttft_s"] == pytest.approx(float(np.percentile([0.5, 1.0, 1.5, 0.2], 90)))


def test_a_reader_who_froze_is_counted() -> None:
    frozen = reply("chat", 0.0, steady(0.3, 5) + [(0.3 + 0.5 + 3.0 + i / TDS, 1) for i in range(5)])
    figures = summarize([frozen, reply("chat", 1.0, steady(0.4, 10))], {})
    assert figures["frozen_over_2s"] == pytest.approx(0.5)
    assert figures["frozen_over_2s_all"] == pytest.approx(0.5)
    assert figures["longest_freeze_s"] == pytest.approx(frozen.longest_freeze_s)
