"""``tokenpace keys``: the admin API's key routes from the command line, against a
running gateway (real uvicorn, the in-memory store), the admin key from the environment."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from gateway.cli import main
from gateway.config.schema import hash_key
from tests.support.gateway import KEY, Gateway, backend_entry, gateway_in_thread, make_config

ADMIN = "tp-admin-keys-cli-0001"


@pytest.fixture(scope="module")
def running() -> Iterator[Gateway]:
    def config(fake):  # type: ignore[no-untyped-def]
        return make_config([backend_entry(fake, "up")], admin={"key": ADMIN})

    with gateway_in_thread(config) as (gw, _):
        yield gw


def keys(
    gw: Gateway, capsys: pytest.CaptureFixture[str], *args: str, admin: str | None = ADMIN
) -> tuple[int, str, str]:
    with pytest.MonkeyPatch.context() as env:
        if admin is None:
            env.delenv("TOKENPACE_ADMIN_KEY", raising=False)
        else:
            env.setenv("TOKENPACE_ADMIN_KEY", admin)
        env.setenv("TOKENPACE_BASE_URL", gw.base_url)
        code = main(["keys", *args])
    out, err = capsys.readouterr()
    return code, out, err


def models_status(gw: Gateway, key: str) -> int:
    headers = {"Authorization": f"Bearer {key}"}
    return httpx.get(f"{gw.base_url}/models", headers=headers, timeout=5).status_code


def test_add_list_rotate_revoke(running: Gateway, capsys: pytest.CaptureFixture[str]) -> None:
    gw = running
    code, out, err = keys(gw, capsys, "add", "basic")
    assert code == 0, err
    fields = dict(line.split(":", 1) for line in out.splitlines())
    new_key, new_id = fields["key"].strip(), fields["id"].strip()
    assert new_id == hash_key(new_key) and "shown only now" in err
    assert models_status(gw, new_key) == 200

    code, out, _ = keys(gw, capsys, "list")
    assert code == 0
    assert "acme (weight 2): 1 key(s)" in out and f"  {new_id}" in out
    assert new_key not in out  # ids only, never keys
    code, out, _ = keys(gw, capsys, "--json", "list")
    listed = {t["name"]: t["keys"] for t in json.loads(out)}
    assert listed["acme"] == [hash_key(KEY)] and new_id in listed["basic"]

    code, out, _ = keys(gw, capsys, "--json", "rotate", "basic", new_id)
    rotated = json.loads(out)
    assert code == 0 and rotated["revoked"] == new_id
    assert models_status(gw, new_key) == 401 and models_status(gw, rotated["key"]) == 200

    code, out, _ = keys(gw, capsys, "revoke", "basic", rotated["id"])
    assert code == 0 and out.strip() == f"revoked {rotated['id']} of tenant basic"
    assert models_status(gw, rotated["key"]) == 401


def test_mistakes_say_what_to_fix(running: Gateway, capsys: pytest.CaptureFixture[str]) -> None:
    gw = running
    code, _, err = keys(gw, capsys, "list", admin=None)
    assert code == 2 and "set TOKENPACE_ADMIN_KEY" in err
    code, _, err = keys(gw, capsys, "list", admin="tp-wrong-admin-key-01")
    assert code == 1
    assert err.startswith("tokenpace keys list: 401: ") and "not admin.key" in err
    code, _, err = keys(gw, capsys, "add", "nobody")
    assert (code, err.strip()) == (1, "tokenpace keys add: 404: No tenant 'nobody'.")
    code, _, err = keys(gw, capsys, "revoke", "acme", "0" * 64)
    assert code == 1 and "404: No live key" in err
    code, _, err = keys(gw, capsys, "--base-url", "http://127.0.0.1:9/v1", "list")
    assert code == 1 and "No tokenpace gateway answers at http://127.0.0.1:9/v1" in err


def test_options_go_before_or_after_the_action(
    running: Gateway, capsys: pytest.CaptureFixture[str]
) -> None:
    code, before, _ = keys(running, capsys, "--json", "list")
    assert code == 0
    code, after, _ = keys(running, capsys, "list", "--json")
    assert code == 0 and json.loads(after) == json.loads(before)
    code, _, err = keys(running, capsys, "list", "--base-url", "http://127.0.0.1:9/v1")
    assert code == 1 and "No tokenpace gateway answers at http://127.0.0.1:9/v1" in err
