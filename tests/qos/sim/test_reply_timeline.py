"""bench/reply_timeline.py, the README's picture: the reply it draws is one FCFS froze
(the median of those), what it draws is what that reply's reader saw under each policy,
and the same run writes the same bytes (the committed SVGs are regenerated, not edited)."""

from __future__ import annotations

import json
import sys

import numpy as np

from tests.support.paths import ROOT

sys.path.insert(0, str(ROOT / "bench"))

import reply_timeline as rt

SMALL = rt.Settings(rate=3.0, n=600)  # past FCFS's capacity: some replies freeze


def test_the_reply_is_the_median_of_those_fcfs_froze_and_its_timelines_are_what_was_seen():
    runs = rt.run_policies(SMALL)
    rid = rt.pick_reply(runs)
    frozen = sorted(
        (r for r in runs[rt.BASELINE].values() if r.freezes.longest_s > rt.FROZEN_S),
        key=lambda r: (r.freezes.longest_s, r.id),
    )
    assert frozen and rid == frozen[len(frozen) // 2].id
    data = rt.figure_data(runs, SMALL)
    for name, seen in data["policies"].items():
        reply = runs[name][rid]
        shown = np.asarray(seen["shown_s"])
        # the release rule: never before arrival, never faster than the reader's pace
        assert np.all(shown >= reply.times - 1e-3)
        assert np.all(np.diff(shown) >= 1 / reply.tds - 1e-3)
        assert seen["longest_freeze_s"] == round(reply.freezes.longest_s, 3)
    assert data["policies"][rt.SHIPPED]["longest_freeze_s"] <= rt.FROZEN_S


def test_the_same_run_writes_the_same_bytes(tmp_path):
    for out in (tmp_path / "a", tmp_path / "b"):
        assert rt.main(["--out", str(out), "--n", "200", "--rate", "2.6"]) == 0
    for name in ("reply_timeline.svg", "longest_freeze.svg", "reply_timeline.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    data = json.loads((tmp_path / "a" / "reply_timeline.json").read_text())
    assert set(data["policies"]) == {rt.BASELINE, rt.SHIPPED}


def test_the_committed_figures_match_their_data():
    data = json.loads((ROOT / "docs" / "img" / "reply_timeline.json").read_text())
    assert data["settings"] == rt.Settings().__dict__  # the defaults drew them
    svg = (ROOT / "docs" / "img" / "reply_timeline.svg").read_text()
    for pol in data["policies"].values():
        assert f"longest freeze {pol['longest_freeze_s']:.1f} s, QoE {pol['andes_qoe']:.2f}" in svg
