"""The admin API: keys added, rotated and revoked in Redis, seen by every replica."""

from __future__ import annotations

from gateway.config.schema import hash_key
from tests.support.cluster import capped_upstream, chat, cluster_config, replicas

ADMIN = "admin-key-0000001"
KEY = "key-acme-00000000"


async def test_add_rotate_revoke_across_replicas(redis_server, key_prefix) -> None:
    async with capped_upstream(n_tokens=2, token_interval=0.001) as up:
        tenants = [{"name": "acme", "api_keys": [KEY]}, {"name": "basic", "api_keys": ["b" * 12]}]
        store = {"redis_url": redis_server.url, "key_prefix": key_prefix, "key_cache_s": 0}
        config = cluster_config(
            up.url,
            tenants,
            redis_url=redis_server.url,
            prefix=key_prefix,
            admin={"key": ADMIN},
            store=store,
        )
        base = "/v1/tokenpace/admin/tenants"
        async with (
            replicas(config) as (g0, g1),
            g0.client(ADMIN) as admin,
            g0.client(KEY) as acme,
        ):
            assert (await acme.get(base)).status_code == 401  # a tenant key is not enough
            assert (await admin.post(f"{base}/nobody/keys")).status_code == 404
            made = await admin.post(f"{base}/basic/keys")
            assert made.status_code == 201
            new_key, new_id = made.json()["key"], made.json()["id"]
            assert new_id == hash_key(new_key)
            async with g1.client(new_key) as c:  # the other replica knows it
                assert (await c.post("/v1/chat/completions", json=chat())).status_code == 200
            listed = (await admin.get(base)).json()["data"]
            basic = next(t for t in listed if t["name"] == "basic")
            assert new_id in basic["keys"] and new_key not in str(listed)
            rotated = await admin.post(f"{base}/basic/keys/{new_id}/rotate")
            assert rotated.status_code == 201 and rotated.json()["revoked"] == new_id
            newer = rotated.json()["key"]
            for gw in (g0, g1):
                async with gw.client(new_key) as old, gw.client(newer) as cur:
                    assert (await old.get("/v1/models")).status_code == 401
                    assert (await cur.get("/v1/models")).status_code == 200
            # a configured key revoked stays revoked after a restart
            acme_id = hash_key(KEY)
            gone = await admin.delete(f"{base}/acme/keys/{acme_id}")
            assert gone.status_code == 200
            assert (await admin.delete(f"{base}/acme/keys/{acme_id}")).status_code == 404
        async with replicas(config, 1) as (g2,), g2.client(KEY) as acme:
            assert (await acme.get("/v1/models")).status_code == 401
