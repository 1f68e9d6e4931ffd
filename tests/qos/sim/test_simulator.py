"""The engine simulator (qos.sim.engine) and its workloads (qos.sim.workload)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from qos.latency import LatencyProfile, get_profile
from qos.policy.base import Policy, pack_in_order
from qos.policy.fcfs import FCFS
from qos.policy.table import Capacity, RequestTable
from qos.sim import (
    PROMPT_TOKEN_ESTIMATE,
    Engine,
    SimRequest,
    Tier,
    TraceEntry,
    build_workload,
    default_trace_path,
    gamma_arrivals,
    load_andes_trace,
    poisson_arrivals,
    simulate,
)
from qos.sim.workload import DEFAULT_TRACE

# A small engine: 512 KV tokens (32 blocks of 16), batch <= 8.
SMALL = LatencyProfile(
    name="small-test",
    source="test",
    batch_sizes=(1, 8),
    decode_s_at=(0.02, 0.04),
    kv_capacity_tokens=512,
    max_batch=8,
    prefill_per_token_s=1e-4,
    prefill_base_s=0.005,
    swap_per_token_s=2e-4,
)


class Thrash(Policy):
    """Waiting requests first (oldest first), then running ones: preempts all the time."""

    name = "thrash"

    def schedule(self, table: RequestTable, capacity: Capacity, now: float) -> np.ndarray:
        running = table.running
        arrival = table.col("arrival")
        order = np.lexsort((arrival, running))  # waiting (False) first
        return pack_in_order(order, table.demand, capacity.kv_tokens, capacity.max_batch, table.n)


class Everything(Policy):
    """Garbage: asks to run every request, whatever fits."""

    name = "everything"

    def schedule(self, table: RequestTable, capacity: Capacity, now: float) -> np.ndarray:
        return np.ones(table.n, dtype=bool)


class Nothing(Policy):
    name = "nothing"

    def schedule(self, table: RequestTable, capacity: Capacity, now: float) -> np.ndarray:
        return np.zeros(table.n, dtype=bool)


class WrongShape(Policy):
    name = "wrong-shape"

    def schedule(self, table: RequestTable, capacity: Capacity, now: float) -> np.ndarray:
        return np.ones(table.n + 1, dtype=bool)


class Recording(FCFS):
    """FCFS that counts the hook calls."""

    def __init__(self) -> None:
        self.arrivals = self.prefills = self.tokens = self.finishes = 0
        self.prefill_tokens = 0

    def on_arrival(self, table, row, now):
        self.arrivals += 1
        assert table.col("arrival")[row] == now

    def on_prefill(self, table, row, tokens):
        self.prefills += 1
        self.prefill_tokens += tokens
        assert table.col("output")[row] == 0

    def on_tokens(self, table, row, tokens):
        self.tokens += tokens

    def on_finish(self, table, row, now):
        self.finishes += 1


def synthetic(n=40, rate=20.0, seed=0, prompt=(8, 120), output=(4, 60), tds=5.0):
    rng = np.random.default_rng(seed)
    arrivals = poisson_arrivals(n, rate, rng)
    return [
        SimRequest(
            id=f"q{i}",
            arrival=float(arrivals[i]),
            prompt_tokens=int(rng.integers(*prompt)),
            output_tokens=int(rng.integers(*output)),
            ttft=1.0,
            tds=tds,
        )
        for i in range(n)
    ]


def check_invariants(res, workload, kv_tokens):
    it = res.iterations
    assert it["kv_used"].max() <= kv_tokens
    assert it["batch_size"].max() <= SMALL.max_batch
    assert np.all(it["duration"] > 0)
    starts = it["start"]
    assert np.all(starts[1:] >= starts[:-1] + it["duration"][:-1] - 1e-12)  # no overlap
    assert not res.unfinished
    by_id = {r.id: r for r in res.requests}
    assert sorted(by_id) == sorted(r.id for r in workload)
    for req in workload:
        got = by_id[req.id]
        assert got.times.size == req.output_tokens  # none lost, none duplicated
        assert np.all(np.diff(got.times) >= 0)
        assert got.times[0] >= 0
    assert sum(r.output_tokens for r in res.requests) == it["batch_size"].sum()


# -- engine invariants --------------------------------------------------------------------
@pytest.mark.parametrize("pause", [False, True])
@pytest.mark.parametrize("preemption", ["recompute", "swap"])
@pytest.mark.parametrize("policy_cls", [FCFS, Thrash, Everything])
def test_invariants(policy_cls, preemption, pause):
    wl = synthetic()
    res = simulate(wl, policy_cls(), SMALL, preemption=preemption, pause=pause)
    check_invariants(res, wl, 512)
    assert res.kv_tokens == 512
    if policy_cls is Thrash:
        assert res.preemptions_per_request > 1


def test_preempted_requests_resume_with_full_output():
    wl = synthetic(n=30)
    rec = simulate(wl, Thrash(), SMALL, preemption="recompute")
    swp = simulate(wl, Thrash(), SMALL, preemption="swap")
    for res in (rec, swp):
        preempted = [r for r in res.requests if r.preemptions > 0]
        assert preempted
        want = {r.id: r.output_tokens for r in wl}
        assert all(r.times.size == want[r.id] for r in preempted)
    # Swap resumes without prefill: only first prefills (the prompts) are computed.
    assert swp.iterations["prefill_tokens"].sum() == sum(r.prompt_tokens for r in wl)
    assert rec.iterations["prefill_tokens"].sum() > sum(r.prompt_tokens for r in wl)


def test_a_paused_request_keeps_its_kv_and_resumes_without_a_prefill():
    """With the plugin's pause, a request left out keeps its KV while the cache has room
    (here always): nothing is recomputed, nothing is preempted."""
    wl = synthetic(n=30)
    roomy = Engine(Thrash(), SMALL, kv_tokens=16 * 512, record=True, pause=True)
    for req in wl:
        roomy.submit(req)
    now = 0.0
    while roomy.has_work():
        res = roomy.step(now)
        now = res.end if res.batch_size else (roomy.next_arrival_time() or now)
    assert roomy.total_pauses > 0 and roomy.total_preemptions == 0
    prefilled = roomy.iteration_stats()["prefill_tokens"].sum()
    assert prefilled == sum(r.prompt_tokens for r in wl)


def test_paused_requests_lose_their_kv_when_what_runs_needs_it():
    """A small cache: paused requests are preempted (the one whose reader needs its next
    token last first), and the KV the running and paused requests hold never passes M."""
    wl = synthetic(n=30)
    res = simulate(wl, Thrash(), SMALL, pause=True)
    check_invariants(res, wl, 512)
    assert res.preemptions_per_request > 0
    assert res.iterations["prefill_tokens"].sum() > sum(r.prompt_tokens for r in wl)


def test_over_full_mask_is_clipped_to_capacity():
    wl = [SimRequest(f"b{i}", 0.0, 100, 50, 1.0, 5.0) for i in range(12)]
    res = simulate(wl, Everything(), SMALL, kv_tokens=400)
    assert res.kv_tokens == 400
    assert res.iterations["kv_used"].max() <= 400
    assert res.iterations["dropped"].sum() > 0
    # 3 x ceil(101/16) blocks fit at first (336 tokens), only 2 once contexts pass 127.
    assert res.iterations["batch_size"].max() == 3
    assert res.iterations["preemptions"].sum() > 0
    # Everything never un-chooses a running request: every preemption is the engine's.
    assert res.iterations["forced_preemptions"].sum() == res.iterations["preemptions"].sum()
    check_invariants(res, wl, 400)


def test_max_batch_enforced():
    wl = [SimRequest(f"b{i}", 0.0, 1, 3, 1.0, 5.0) for i in range(20)]
    eng = Engine(Everything(), SMALL, record=True)
    for r in wl:
        eng.submit(r)
    res = eng.step(0.0)
    assert res.batch_size == SMALL.max_batch and res.dropped == 12


def test_bad_policies_raise():
    wl = synthetic(n=3)
    with pytest.raises(RuntimeError, match="shape"):
        simulate(wl, WrongShape(), SMALL)
    with pytest.raises(RuntimeError, match="stalled"):
        simulate(wl, Nothing(), SMALL)


def test_request_that_can_never_fit_is_rejected():
    eng = Engine(FCFS(), SMALL)
    with pytest.raises(ValueError, match="never finish"):
        eng.submit(SimRequest("big", 0.0, 400, 200, 1.0, 5.0))
    eng.submit(SimRequest("ok", 0.0, 400, 112, 1.0, 5.0))  # exactly 512
    with pytest.raises(ValueError, match="already"):
        eng.submit(SimRequest("ok", 1.0, 1, 1, 1.0, 5.0))


def test_engine_validation():
    with pytest.raises(ValueError, match="preemption"):
        Engine(FCFS(), SMALL, preemption="drop")
    with pytest.raises(ValueError, match="block_size"):
        Engine(FCFS(), SMALL, block_size=0)
    with pytest.raises(ValueError, match="kv_tokens"):
        Engine(FCFS(), SMALL, kv_tokens=8)
    no_swap = LatencyProfile("ns", "t", (1,), (0.01,), 512, 8, 1e-4)
    with pytest.raises(ValueError, match="swap"):
        Engine(FCFS(), no_swap, preemption="swap")
    assert Engine(FCFS(), SMALL, kv_tokens=100).kv_tokens == 96  # whole blocks


def test_hooks_are_called():
    wl = synthetic(n=25)
    pol = Recording()
    res = simulate(wl, pol, SMALL)
    assert pol.arrivals == pol.prefills == pol.finishes == len(wl)
    assert pol.prefill_tokens == sum(r.prompt_tokens for r in wl)
    assert pol.tokens == sum(r.output_tokens for r in wl) == res.output_tokens


# -- online API ---------------------------------------------------------------------------
def test_step_emits_expected_tokens():
    eng = Engine(FCFS(), SMALL)
    assert not eng.has_work() and eng.next_arrival_time() is None
    eng.submit(SimRequest("a", 0.5, 10, 3, 1.0, 5.0))
    assert eng.has_work() and eng.next_arrival_time() == 0.5
    idle = eng.step(0.0)  # before the arrival: nothing to do
    assert idle.batch_size == 0 and idle.duration == 0
    s1 = eng.step(0.5)
    assert s1.duration == pytest.approx(SMALL.prefill_s(10))
    assert s1.emitted == [("a", 0, False)] and s1.admitted == ["a"] and s1.prefill_tokens == 10
    assert s1.kv_used == 16
    s2 = eng.step(s1.end)
    assert s2.duration == pytest.approx(SMALL.decode_s(1))
    assert s2.emitted == [("a", 1, False)] and s2.prefill_tokens == 0
    s3 = eng.step(s2.end + 0.1)  # the driver may start later than the previous end
    assert s3.emitted == [("a", 2, True)] and s3.finished == ["a"]
    assert not eng.has_work() and eng.kv_used == 0
    with pytest.raises(ValueError, match="before the end"):
        eng.step(s3.end - 1.0)


def test_mixed_iteration_duration():
    eng = Engine(FCFS(), SMALL)
    eng.submit(SimRequest("a", 0.0, 10, 5, 1.0, 5.0))
    s1 = eng.step(0.0)
    eng.submit(SimRequest("b", s1.end, 30, 5, 1.0, 5.0))
    s2 = eng.step(s1.end)  # a decodes, b prefills
    want = SMALL.iteration_s(decode_batch=1, decode_context_tokens=11, prefill_tokens=30)
    assert s2.duration == pytest.approx(want)
    assert sorted(s2.emitted) == [("a", 1, False), ("b", 0, False)]


def test_abort_frees_kv_and_stops_tokens():
    eng = Engine(FCFS(), SMALL, record=True)
    eng.submit(SimRequest("a", 0.0, 100, 50, 1.0, 5.0))
    eng.submit(SimRequest("b", 0.0, 100, 50, 1.0, 5.0))
    eng.submit(SimRequest("later", 100.0, 10, 5, 1.0, 5.0))
    now = 0.0
    for _ in range(3):
        now = eng.step(now).end
    used = eng.kv_used
    assert eng.num_running == 2 and used == 2 * 112
    eng.abort("a")
    assert eng.kv_used == used - 112 and "a" not in eng.table
    eng.abort("a")  # idempotent
    eng.abort("nobody")
    eng.abort("later")  # still pending: never arrives
    assert eng.next_arrival_time() is None
    seen = set()
    while eng.has_work():
        res = eng.step(now)
        seen.update(res.request_ids)
        now = res.end
    assert seen == {"b"}
    assert [r.id for r in eng.results] == ["b"] and sorted(eng.aborted) == ["a", "later"]
    assert eng.results[0].times.size == 50


def test_vectorised_tokens_match_table():
    a, b = RequestTable(), RequestTable()
    for t in (a, b):
        t.add("x", arrival=0.0, prompt_tokens=5, ttft=1.0, tds=4.0)
        t.add("y", arrival=0.3, prompt_tokens=7, ttft=0.5, tds=2.5, tenant="t2")
        t.admit(0)
        t.admit(1)
    for now in (0.2, 0.25, 0.9, 3.0, 3.1):
        for r in (0, 1):
            a.record_tokens(r, now, 1)
        b.record_next_token(np.array([0, 1]), now)
    for name in ("dig_sum", "dig_last", "held_sum", "held_last", "first_token_at"):
        np.testing.assert_allclose(a.col(name), b.col(name), err_msg=name)
    for name in ("output", "computed"):
        np.testing.assert_array_equal(a.col(name), b.col(name), err_msg=name)
    assert a.emitted == b.emitted


# -- offline results ----------------------------------------------------------------------
def test_deterministic_for_a_seed():
    wl1, wl2 = synthetic(seed=3), synthetic(seed=3)
    r1, r2 = simulate(wl1, Thrash(), SMALL), simulate(wl2, Thrash(), SMALL)
    s1, s2 = r1.summary(), r2.summary()
    for s in (s1, s2):
        for k in [k for k in s["iterations"] if k.startswith("decision")]:
            del s["iterations"][k]
    assert s1 == s2
    for x, y in zip(r1.requests, r2.requests, strict=True):
        assert x.id == y.id and np.array_equal(x.times, y.times)
    assert synthetic(seed=4)[0].arrival != wl1[0].arrival


def test_fcfs_qoe_low_vs_high_load():
    low = simulate(synthetic(n=40, rate=0.5, output=(4, 30)), FCFS(), SMALL)
    high = simulate(synthetic(n=80, rate=50.0, output=(4, 30)), FCFS(), SMALL)
    assert low.avg_qoe > 0.99 and low.avg_monotone_qoe > 0.99
    assert high.avg_qoe < 0.6 and high.avg_monotone_qoe < 0.6


def test_summary_is_json_and_consistent():
    wl = synthetic(n=30)
    res = simulate(wl, FCFS(), SMALL)
    s = res.summary()
    json.dumps(s, allow_nan=False)
    assert s["requests"] == s["completed"] == 30 and s["unfinished"] == 0
    assert s["avg_qoe"] == pytest.approx(np.mean([r.andes_qoe for r in res.requests]))
    assert 0 < s["qoe"]["p5"] <= s["qoe"]["p50"] <= s["qoe"]["p99"] <= 1
    assert s["throughput_tok_s"] == pytest.approx(res.output_tokens / res.makespan)
    assert s["serving"]["completed"] == 30
    assert s["serving"]["total_output_tokens"] == res.output_tokens
    assert s["ttft_s"]["p50"] > 0 and s["tds"]["p50"] > 0
    assert s["smooth_goodput"] <= res.output_tokens / res.makespan + 1e-9
    r = res.requests[0]
    n = r.times.size
    assert r.actual_tds == pytest.approx((n - 1) / (r.times[-1] - r.times[0]))


def test_max_time_leaves_requests_unfinished():
    wl = synthetic(n=40, rate=50.0)
    res = simulate(wl, FCFS(), SMALL, max_time=0.5)
    assert res.unfinished and len(res.requests) + len(res.unfinished) == 40
    assert res.iterations["start"].max() < 0.5
    assert res.summary()["unfinished"] == len(res.unfinished)


def test_real_profile_on_trace_slice():
    entries = trace_entries()
    wl = build_workload(entries, 1.0, n=150, seed=1)
    res = simulate(wl, FCFS(), get_profile("opt-66b-4xa100"))
    assert len(res.requests) == 150 and res.avg_qoe > 0.95


# -- workloads ----------------------------------------------------------------------------
def trace_entries():
    return load_andes_trace()


def test_shipped_trace_numbers():
    entries = trace_entries()
    assert default_trace_path() == DEFAULT_TRACE and DEFAULT_TRACE.suffix == ".csv"
    assert len(entries) == 3000 and len({e.id for e in entries}) == 3000
    assert "chars/4" in PROMPT_TOKEN_ESTIMATE
    assert np.mean([e.output_len for e in entries]) == pytest.approx(332, abs=1)
    assert np.mean([e.prompt_tokens for e in entries]) == pytest.approx(163, abs=1)
    assert max(e.prompt_tokens for e in entries) == 2323
    assert all(e.ttft == 1.0 and 3.7 < e.tds < 5.2 for e in entries)


def test_trace_loader_json_with_prompt_text(tmp_path, monkeypatch):
    p = tmp_path / "t.json"
    p.write_text(
        json.dumps([{"prompt": "abcdefghij", "output_len": 7, "ttft": 1, "latency": 0.25}])
    )
    monkeypatch.setenv("TOKENPACE_TRACE", str(p))
    assert default_trace_path() == p
    (e,) = load_andes_trace()
    assert (e.prompt_tokens, e.output_len, e.ttft, e.tds) == (2, 7, 1.0, 4.0)
    p.write_text("[]")
    with pytest.raises(ValueError, match="path"):
        load_andes_trace(p)
    p.write_text(json.dumps([{"prompt": "x"}]))
    with pytest.raises(ValueError, match="malformed"):
        load_andes_trace(p)
    p.write_text(json.dumps([{"output_len": 3, "ttft": 1, "latency": 0.2}]))
    with pytest.raises(ValueError, match="no prompt text"):
        load_andes_trace(p)
    with pytest.raises(FileNotFoundError, match="TOKENPACE_TRACE"):
        load_andes_trace(tmp_path / "missing.json")


def test_trace_loader_csv_matches_the_json_it_came_from(tmp_path):
    prompts = ["abcdefghij", "x" * 401]
    raw = [
        {"id": f"q{i}", "prompt": t, "output_len": 5 + i, "ttft": 1, "latency": 0.21 + i / 100}
        for i, t in enumerate(prompts)
    ]
    (tmp_path / "t.json").write_text(json.dumps(raw))
    (tmp_path / "t.csv").write_text(
        "# a comment\nid,prompt_tokens,output_len,ttft_s,latency_s\n"
        "q0,2,5,1.0,0.21\nq1,100,6,1.0,0.22\n"
    )
    from_json = load_andes_trace(tmp_path / "t.json")
    assert [e.prompt_tokens for e in from_json] == [2, 100]
    assert load_andes_trace(tmp_path / "t.csv") == from_json
    (tmp_path / "bad.csv").write_text("id,prompt_tokens,output_len,ttft_s,latency_s\nq,2,0,1,0.2\n")
    with pytest.raises(ValueError, match="output_len >= 1"):
        load_andes_trace(tmp_path / "bad.csv")
    (tmp_path / "bad.csv").write_text("id,prompt_tokens\nq,2\n")
    with pytest.raises(ValueError, match="malformed"):
        load_andes_trace(tmp_path / "bad.csv")


def test_poisson_arrival_statistics():
    t = poisson_arrivals(200_000, 5.0, np.random.default_rng(0))
    gaps = np.diff(np.concatenate([[0.0], t]))
    assert np.all(gaps > 0)
    assert gaps.mean() == pytest.approx(0.2, rel=0.01)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.02)


def test_gamma_arrival_statistics():
    t = gamma_arrivals(200_000, 4.0, 3.0, np.random.default_rng(0))
    gaps = np.diff(np.concatenate([[0.0], t]))
    assert np.all(np.diff(t) >= 0)
    assert 1 / gaps.mean() == pytest.approx(4.0, rel=0.03)
    assert gaps.std() / gaps.mean() == pytest.approx(3.0, rel=0.06)
    one = gamma_arrivals(100_000, 4.0, 1.0, np.random.default_rng(1))
    g1 = np.diff(np.concatenate([[0.0], one]))
    assert g1.std() / g1.mean() == pytest.approx(1.0, rel=0.03)


def fake_entries(n=10):
    return [TraceEntry(str(i), i + 1, 10 + i, 1.0, 0.25) for i in range(n)]


def test_build_workload_defaults_and_cycling():
    entries = fake_entries()
    wl = build_workload(entries, 2.0, seed=7)
    assert [r.id for r in wl] == [f"r{i}" for i in range(10)]
    assert all(r.arrival > 0 for r in wl)
    assert np.all(np.diff([r.arrival for r in wl]) > 0)
    assert [r.output_tokens for r in wl] == [e.output_len for e in entries]
    assert all(
        (r.ttft, r.tds, r.tier, r.tenant, r.weight) == (1, 4.0, "chat", "default", 1) for r in wl
    )
    assert build_workload(entries, 2.0, seed=7) == wl
    assert build_workload(entries, 2.0, seed=8) != wl
    long = build_workload(entries, 2.0, n=25)
    assert len(long) == 25 and long[13].prompt_tokens == entries[3].prompt_tokens
    bursty = build_workload(entries, 2.0, arrivals="gamma", cv=3.0, n=25)
    assert [r.prompt_tokens for r in bursty] == [r.prompt_tokens for r in long]


def test_build_workload_tiers_and_tenants():
    entries = fake_entries()
    mix = {"chat": (1.0, 4.8, 0.7), "voice": (1.0, 3.3, 0.3)}
    wl = build_workload(entries, 2.0, n=4000, tier_mix=mix, seed=1)
    voice = [r for r in wl if r.tier == "voice"]
    assert len(voice) / len(wl) == pytest.approx(0.3, abs=0.03)
    assert all(r.tds == 3.3 and r.ttft == 1.0 for r in voice)
    assert all(r.tds == 4.8 for r in wl if r.tier == "chat")
    plain = build_workload(entries, 2.0, n=4000, seed=1)
    assert [r.arrival for r in plain] == [r.arrival for r in wl]  # independent streams
    as_tiers = build_workload(
        entries,
        2.0,
        n=4000,
        tier_mix=[(Tier("chat", 1.0, 4.8), 0.7), (Tier("voice", 1.0, 3.3), 0.3)],
        seed=1,
    )
    assert [r.tier for r in as_tiers] == [r.tier for r in wl]
    all_voice = build_workload(entries, 2.0, tier_mix={"voice": (1.0, 3.3, 1.0)})
    assert {(r.tier, r.tds) for r in all_voice} == {("voice", 3.3)}
    ten = build_workload(entries, 2.0, n=4000, tenants=[("a", 1.0, 0.5), ("b", 2.0, 0.5)], seed=2)
    a = [r for r in ten if r.tenant == "a"]
    assert len(a) / len(ten) == pytest.approx(0.5, abs=0.03)
    assert {r.weight for r in a} == {1.0} and {r.weight for r in ten if r.tenant == "b"} == {2.0}


@pytest.mark.parametrize(
    ("kwargs", "arg"),
    [
        ({"rate": 0.0}, "rate"),
        ({"rate": -1.0}, "rate"),
        ({"rate": math.inf}, "rate"),
        ({"arrivals": "gamma", "cv": 0.0}, "cv"),
        ({"arrivals": "uniform"}, "arrivals"),
        ({"n": 0}, "n"),
        ({"tier_mix": {"chat": (1.0, 4.8, 0.5)}}, "tier_mix"),
        ({"tier_mix": {"chat": (1.0, -4.8, 1.0)}}, "tier_mix"),
        ({"tier_mix": {"chat": (1.0, 4.8)}}, "tier_mix"),
        ({"tenants": [("a", 1.0, 0.6), ("b", 1.0, 0.6)]}, "tenants"),
        ({"tenants": [("a", 0.0, 1.0)]}, "tenants"),
        ({"tenants": [("a", 1.0, 0.5), ("a", 1.0, 0.5)]}, "tenants"),
    ],
)
def test_build_workload_validation(kwargs, arg):
    args = {"rate": 1.0, **kwargs}
    rate = args.pop("rate")
    with pytest.raises(ValueError, match=arg):
        build_workload(fake_entries(), rate, **args)


def test_workload_validation_misc():
    with pytest.raises(ValueError, match="entries"):
        build_workload([], 1.0)
    with pytest.raises(ValueError, match="rate"):
        poisson_arrivals(5, 0.0, np.random.default_rng())
    with pytest.raises(ValueError, match="cv"):
        gamma_arrivals(5, 1.0, -1.0, np.random.default_rng())
    with pytest.raises(ValueError, match="output_tokens"):
        SimRequest("x", 0.0, 5, 0, 1.0, 5.0)
    with pytest.raises(ValueError, match="tds"):
        SimRequest("x", 0.0, 5, 5, 1.0, 0.0)
    with pytest.raises(ValueError, match="arrival"):
        SimRequest("x", -1.0, 5, 5, 1.0, 1.0)
