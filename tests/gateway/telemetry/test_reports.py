"""QoE telemetry: strict validation, recomputation, ownership, summaries, persistence."""

from __future__ import annotations

import asyncio
import json

import pytest

from qos.metrics import andes_qoe, freezes, monotone_qoe
from tests.support.fake_upstream import MODEL, upstream
from tests.support.gateway import KEY, KEY_BASIC, backend_entry, gateway, make_config

ADMIN = "admin-key-0000001"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True}
ON_TIME = [[1.0 + i / 4.8, 1] for i in range(6)]
LATE = [[3.0, 6]]


def config(fake, **overrides):
    return make_config([backend_entry(fake, "up")], admin={"key": ADMIN}, **overrides)


def report(rid: str, arrivals=ON_TIME, displayed=ON_TIME, **extra) -> dict:
    return {
        "request_id": rid,
        "expected": {"ttft": 1.0, "tds": 4.8},
        "arrivals": arrivals,
        "displayed": displayed,
        "outcome": "completed",
        "sdk": {"name": "tokenpace-python", "version": "0.1.0"},
        **extra,
    }


async def serve(gw, key: str = KEY, tier: str = "chat") -> str:
    async with gw.client(key) as c:
        r = await c.post("/v1/chat/completions", json=CHAT, headers={"X-TokenPace-Tier": tier})
        assert r.status_code == 200
        return r.headers["x-request-id"]


async def test_report_is_validated_recomputed_and_owned() -> None:
    async with upstream() as fake, gateway(config(fake)) as gw:
        rid = await serve(gw)
        async with gw.client() as acme, gw.client(KEY_BASIC) as basic, gw.client("") as anon:
            url = "/v1/tokenpace/telemetry"
            # a number the client claims is ignored: the tier served (chat) is used
            r = await acme.post(url, json=report(rid, LATE, ON_TIME))
            assert r.status_code == 200, r.text
            qoe = r.json()["qoe"]
            assert qoe["andes"] == pytest.approx(andes_qoe(LATE, 1.0, 4.8))
            assert qoe["monotone"] == pytest.approx(monotone_qoe(LATE, 1.0, 4.8))
            assert qoe["displayed_andes"] == pytest.approx(1.0)
            assert (await acme.post(url, json=report(rid))).status_code == 409
            # another tenant's request, or one nobody served: 404, same answer
            other = await basic.post(url, json=report(rid))
            unknown = await acme.post(url, json=report("0" * 32))
            assert other.status_code == unknown.status_code == 404
            assert other.json()["error"]["code"] == "request_not_found"
            assert (await anon.post(url, json=report(rid))).status_code == 401
            bad = [
                report(rid, arrivals=[[1.0, 1], [0.5, 1]]),  # not non-decreasing
                report(rid, arrivals=[[1.0, 0]]),  # no tokens in a chunk
                report(rid, expected={"ttft": "1", "tds": 4.8}),  # strict types
                report(rid, outcome="great"),
                report(rid, qoe=0.99),  # a client's own number is not a field
                report("not-an-id"),
            ]
            rid2 = await serve(gw)
            for body in bad:
                body["request_id"] = rid2 if body["request_id"] == rid else body["request_id"]
                r = await acme.post(url, json=body)
                assert r.status_code == 400, (body, r.text)
                assert r.json()["error"]["type"] == "invalid_request_error"
            huge = report(rid2, arrivals=[[1.0, 1]] * 30000)
            assert (await acme.post(url, json=huge)).status_code == 413
            # malformed reports were not stored: the id can still be reported once
            assert (await acme.post(url, json=report(rid2))).status_code == 200


async def test_reports_are_rate_limited() -> None:
    async with (
        upstream() as fake,
        gateway(config(fake, telemetry={"requests_per_minute": 2})) as gw,
    ):
        rids = [await serve(gw) for _ in range(3)]
        async with gw.client() as c:
            codes = [
                (await c.post("/v1/tokenpace/telemetry", json=report(rid))).status_code
                for rid in rids
            ]
            assert codes == [200, 200, 429]
            last = await c.post("/v1/tokenpace/telemetry", json=report(rids[2]))
            assert int(last.headers["retry-after"]) >= 1


async def test_summary_sides_tenants_and_metrics() -> None:
    async with upstream() as fake, gateway(config(fake)) as gw:
        rid = await serve(gw, tier="voice")
        await serve(gw, KEY_BASIC)
        async with gw.client() as acme, gw.client(KEY_BASIC) as basic, gw.client(ADMIN) as admin:
            assert (await acme.post("/v1/tokenpace/telemetry", json=report(rid))).status_code == 200
            await asyncio.sleep(0.4)  # gateway-side records are written in batches
            mine = (await acme.get("/v1/tokenpace/qoe", params={"window": 60})).json()
            assert list(mine["tenants"]) == ["acme"]
            voice = mine["tenants"]["acme"]["tiers"]["voice"]
            assert voice["gateway"]["count"] == 1 and voice["client"]["count"] == 1
            assert voice["client"]["andes"]["mean"] == pytest.approx(andes_qoe(ON_TIME, 1.0, 3.3))
            assert 0 < voice["gateway"]["andes"]["p50"] <= 1
            assert "displayed_andes" in voice["client"]
            theirs = await basic.get("/v1/tokenpace/qoe", params={"tenant": "acme"})
            assert theirs.status_code == 403
            everyone = (await admin.get("/v1/tokenpace/qoe")).json()
            assert sorted(everyone["tenants"]) == ["acme", "basic"]
            assert (await admin.get("/v1/tokenpace/qoe", params={"window": 0})).status_code == 400
            metrics = (await acme.get("/metrics")).text
            line = (
                'tokenpace_qoe_window{metric="andes",side="client",stat="mean",'
                'tenant="acme",tier="voice"}'
            )
            assert line in metrics


async def test_telemetry_survives_a_gateway_restart(redis_server, key_prefix) -> None:
    store = {"redis_url": redis_server.url, "key_prefix": key_prefix}
    async with upstream() as fake:
        async with gateway(config(fake, store=store)) as first:
            rid_a, rid_b = await serve(first), await serve(first)
            async with first.client() as c:
                r = await c.post("/v1/tokenpace/telemetry", json=report(rid_a))
                assert r.status_code == 200
        async with (
            gateway(config(fake, store=store)) as second,
            second.client() as acme,
            second.client(KEY_BASIC) as basic,
        ):
            summary = (await acme.get("/v1/tokenpace/qoe")).json()
            chat = summary["tenants"]["acme"]["tiers"]["chat"]
            assert chat["client"]["count"] == 1 and chat["gateway"]["count"] == 2
            # ownership survived too: acme's other request, but not for basic
            url = "/v1/tokenpace/telemetry"
            assert (await basic.post(url, json=report(rid_b))).status_code == 404
            assert (await acme.post(url, json=report(rid_b))).status_code == 200
            assert (await acme.post(url, json=report(rid_a))).status_code == 409
            body = json.loads((await basic.get("/v1/tokenpace/qoe")).text)
            assert "acme" not in body["tenants"]


# tokens at the tier's pace, then none for 5 s while the reader was away, then the rest
GAPPED = [[1.0 + i / 4.8, 1] for i in range(6)] + [[7.2 + i / 4.8, 1] for i in range(6)]


@pytest.mark.parametrize("shared", [False, True], ids=["memory", "redis"])
async def test_freezes_count_only_while_the_reader_watched(
    shared: bool, redis_server, key_prefix
) -> None:
    store = {"redis_url": redis_server.url, "key_prefix": key_prefix} if shared else {}
    async with upstream() as fake, gateway(config(fake, store=store)) as gw:
        rids = [await serve(gw) for _ in range(3)]
        async with gw.client() as acme:
            url = "/v1/tokenpace/telemetry"
            for away in ([[1.0, 2.0], [1.5, 3.0]], [[3.0, 2.0]], [[-1.0, 2.0]], [[1.0]]):
                r = await acme.post(url, json=report(rids[0], GAPPED, GAPPED, away=away))
                assert r.status_code == 400, (away, r.text)
                assert r.json()["error"]["param"].startswith("away"), r.text
            watched = await acme.post(url, json=report(rids[0], GAPPED, GAPPED, away=[[2.1, 7.2]]))
            assert watched.status_code == 200, watched.text
            qoe = watched.json()["qoe"]
            assert (qoe["freezes"], qoe["longest_freeze_s"]) == (0, 0.0)
            assert qoe["away_s"] == pytest.approx(5.1)
            seen = await acme.post(url, json=report(rids[1], GAPPED, GAPPED, away=[]))
            assert seen.json()["qoe"]["freezes"] == 1
            tds = seen.json()["expected"]["tds"]
            assert seen.json()["qoe"]["longest_freeze_s"] == freezes(GAPPED, tds).longest_s > 4
            silent = await acme.post(url, json=report(rids[2], GAPPED, GAPPED))
            assert silent.json()["qoe"]["away_s"] is None  # an SDK that does not say
            client = (await acme.get("/v1/tokenpace/qoe")).json()
            client = client["tenants"]["acme"]["tiers"]["chat"]["client"]
            assert client["count"] == 3
            assert client["away"] == {
                "replies": 2,
                "away_share": 0.5,
                "mean_away_s": pytest.approx(5.1 / 2),
            }
            assert client["reader"]["frozen_over_2s"] == pytest.approx(2 / 3)
            metrics = (await acme.get("/metrics")).text
            assert (
                'tokenpace_qoe_window{metric="away",side="client",stat="away_share",'
                'tenant="acme",tier="chat"} 0.5'
            ) in metrics
