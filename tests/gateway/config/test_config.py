"""Configuration loading and validation, and the gateway's CLI commands."""

from __future__ import annotations

import argparse
import inspect
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from gateway.cli import add_gateway_commands, banner, check_config, load_serve_config
from gateway.config.loader import demo_config, load_config, parse_config
from gateway.config.schema import DEFAULT_TIERS, OVERLOAD_AFTER_TTFTS, ConfigError, hash_key
from gateway.request.tiers import resolve_tier
from qos.policy.reader import ReaderGuard
from tests.support.paths import ROOT
from tests.support.ports import free_port

GOOD_YAML = """
server: {host: 0.0.0.0, port: 9000}
tiers:
  chat: {ttft: 0.8, tds: 5.0, priority: 1}
  premium: {ttft: 0.3, tds: 30, priority: 0}
tenants:
  - name: acme
    api_keys:
      - key_sha256: "{digest}"
      - key: "tp-plain-key-123"
    weight: 3
    tiers: [chat, voice, premium]
    default_tier: voice
    allow_custom: true
  - name: hobby
    api_keys: ["tp-hobby-key-456"]
backends:
  - name: vllm-1
    url: http://10.0.0.1:8000/v1
    models: [llama-3-8b]
    tokenpace: true
    supports_priority: true
  - name: openai-compat
    url: https://example.com/v1/
    models: ["*"]
    api_key_env: EXAMPLE_KEY
timeouts: {connect_s: 2, first_byte_s: 30, idle_s: 10, ping_interval_s: 3}
limits: {max_body_bytes: 100000, max_tokens: 8192}
"""

GOOD_TOML = """
[[tenants]]
name = "acme"
api_keys = [{ key = "tp-toml-key-0001" }]
default_tier = "fast"

[[backends]]
name = "local"
url = "http://127.0.0.1:8000/v1"
models = ["m"]
tokenpace = true

[tiers.batch]
ttft = 120
tds = 40
"""


def test_yaml_config_loads_with_hashed_keys(tmp_path: Path):
    path = tmp_path / "gw.yaml"
    path.write_text(GOOD_YAML.replace("{digest}", hash_key("tp-hashed-key-000")))
    config = load_config(path)
    acme = config.tenants[0]
    digests = [k.key_sha256 for k in acme.api_keys]
    assert digests == [hash_key("tp-hashed-key-000"), hash_key("tp-plain-key-123")]
    assert all(k.key is None for k in acme.api_keys)  # plain keys are forgotten after hashing
    assert (
        "tp-plain-key-123" not in repr(config)
        and "tp-plain-key-123" not in config.model_dump_json()
    )
    by_digest = config.tenant_by_digest()
    assert by_digest[hash_key("tp-hobby-key-456")].name == "hobby"
    # tier table: operator's entries merged over the contract's defaults
    assert config.tiers["chat"].ttft == 0.8 and config.tiers["voice"] == DEFAULT_TIERS["voice"]
    assert set(config.tiers) == {"chat", "voice", "fast", "batch", "premium"}
    assert config.backends[1].url == "https://example.com/v1"  # trailing slash dropped
    assert config.timeouts.ping_interval_s == 3 and config.limits.max_tokens == 8192
    assert config.tenants[1].default_tier == "chat" and config.tenants[1].weight == 1.0


def test_toml_config(tmp_path: Path):
    path = tmp_path / "gw.toml"
    path.write_text(GOOD_TOML)
    config = load_config(path)
    assert config.tenants[0].default_tier == "fast"
    assert config.tiers["batch"].ttft == 120 and config.tiers["chat"] == DEFAULT_TIERS["chat"]


def test_contract_default_tiers():
    assert {n: (t.ttft, t.tds) for n, t in DEFAULT_TIERS.items()} == {
        "chat": (1.0, 4.8),
        "voice": (1.0, 3.3),
        "fast": (0.5, 25.0),
        "batch": (60.0, 50.0),
    }


def test_the_overload_bound_is_the_reader_guards_overdue_multiple():
    """Ten TTFTs: where the engines' reader guard starts admitting a waiting request as
    overdue, the gateway stops letting one wait (unless the tier says otherwise)."""
    guard = inspect.signature(ReaderGuard).parameters["overdue_after_ttfts"].default
    assert OVERLOAD_AFTER_TTFTS == guard == 10.0
    config = parse_config(
        {
            "tenants": [{"name": "ok", "api_keys": ["tp-fine-key-1"]}],
            "tiers": {"chat": {"ttft": 1.0, "tds": 4.8, "overload_after_s": 4.0}},
        }
    )
    tenant = config.tenants[0]
    assert resolve_tier(config, tenant, "chat", None).wait_bound_s == 4.0
    assert resolve_tier(config, tenant, "fast", None).wait_bound_s == 5.0
    assert resolve_tier(config, tenant, "batch", None).wait_bound_s == 600.0
    assert config.admission.overload == "queue"


@pytest.mark.parametrize(
    ("patch", "expected"),
    [
        ({"tenants": [{"name": "a", "api_keys": ["short"]}]}, "tenants[0].api_keys[0].key"),
        (
            {"tenants": [{"name": "a", "api_keys": [{"key_sha256": "xyz"}]}]},
            "tenants[0].api_keys[0].key_sha256",
        ),
        (
            {"tenants": [{"name": "a", "api_keys": [{}]}]},
            "tenants[0].api_keys[0]: give exactly one",
        ),
        (
            {"tenants": [{"name": "a", "api_keys": ["tp-key-long-1"], "weight": 0}]},
            "tenants[0].weight",
        ),
        (
            {"tenants": [{"name": "a", "api_keys": ["tp-key-long-1"], "wieght": 2}]},
            "tenants[0].wieght: unknown key",
        ),
        (
            {"tenants": [{"name": "a", "api_keys": ["tp-key-long-1"], "default_tier": "gold"}]},
            "tenants[0].default_tier: unknown tier 'gold'",
        ),
        (
            {
                "tenants": [
                    {
                        "name": "a",
                        "api_keys": ["tp-key-long-1"],
                        "tiers": ["chat"],
                        "default_tier": "voice",
                    }
                ]
            },
            "tenants[0].default_tier: 'voice' is not in this tenant's tiers",
        ),
        (
            {
                "tenants": [
                    {"name": "a", "api_keys": ["tp-key-long-1"], "tiers": ["chat", "diamond"]}
                ]
            },
            "tenants[0].tiers[1]: unknown tier",
        ),
        (
            {
                "tenants": [
                    {"name": "a", "api_keys": ["tp-key-long-1"]},
                    {"name": "a", "api_keys": ["tp-key-long-2"]},
                ]
            },
            "tenants[1].name: duplicate",
        ),
        (
            {
                "tenants": [
                    {"name": "a", "api_keys": ["tp-key-long-1"]},
                    {"name": "b", "api_keys": ["tp-key-long-1"]},
                ]
            },
            "tenants[1].api_keys[0]: the same key",
        ),
        ({"tenants": []}, "tenants: List should have at least 1 item"),
        (
            {"backends": [{"name": "x", "models": ["m"]}]},
            "backends[0]: an http backend needs 'url'",
        ),
        ({"backends": [{"name": "x", "url": "ftp://h", "models": ["m"]}]}, "backends[0].url"),
        ({"backends": [{"name": "x", "url": "http://h/v1", "models": []}]}, "backends[0].models"),
        (
            {"backends": [{"name": "x", "url": "http://h/v1", "models": ["m"], "kind": "warp"}]},
            "backends[0].kind: unknown backend kind 'warp'",
        ),
        ({"tiers": {"chat": {"ttft": 1, "tds": -1}}}, "tiers.chat.tds"),
        ({"tiers": {"custom": {"ttft": 1, "tds": 1}}}, "reserved"),
        ({"tiers": {"chat": {"ttft": 1, "tds": 4.8, "overload_after_s": -1}}}, "overload_after_s"),
        ({"admission": {"overload": "drop"}}, "admission.overload"),
        ({"timeouts": {"idle_s": 0}}, "timeouts.idle_s"),
        ({"limits": {"max_body_bytes": "big"}}, "limits.max_body_bytes"),
        ({"colour": "blue"}, "colour: unknown key"),
    ],
)
def test_errors_name_the_bad_key(patch, expected):
    data = {"tenants": [{"name": "ok", "api_keys": ["tp-fine-key-1"]}], **patch}
    with pytest.raises(ConfigError) as err:
        parse_config(data, "test.yaml")
    assert expected in str(err.value), str(err.value)
    assert "test.yaml" in str(err.value)


def test_syntax_and_missing_file(tmp_path: Path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("tenants: [unclosed\n")
    with pytest.raises(ConfigError, match="syntax"):
        load_config(bad)
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.yaml")
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    with pytest.raises(ConfigError, match="tenants: Field required"):
        load_config(empty)


def test_example_config_is_valid():
    example = ROOT / "examples" / "gateway.example.yaml"
    config = load_config(example)
    assert config.tenants and config.backends


def test_check_config_cli(tmp_path: Path, capsys):
    good = tmp_path / "good.toml"
    good.write_text(GOOD_TOML)
    assert check_config([str(good)]) == 0
    assert "OK" in capsys.readouterr().out
    bad = tmp_path / "bad.yaml"
    bad.write_text("tenants:\n  - name: x\n    api_keys: [k]\n")
    assert check_config([str(bad)]) == 1
    assert "tenants[0].api_keys[0].key" in capsys.readouterr().err


def test_subparser_hook(tmp_path: Path, capsys):
    parser = argparse.ArgumentParser(prog="tokenpace")
    add_gateway_commands(parser.add_subparsers(dest="command", required=True))
    good = tmp_path / "good.toml"
    good.write_text(GOOD_TOML)
    ns = parser.parse_args(["check-config", str(good)])
    assert ns.func(ns) == 0
    ns = parser.parse_args(["hash-key", "secret-key"])
    assert ns.func(ns) == 0
    assert capsys.readouterr().out.strip().endswith(hash_key("secret-key"))
    ns = parser.parse_args(["serve", "--config", str(good), "--host", "0.0.0.0", "--port", "1"])
    assert (ns.config, ns.host, ns.port) == (str(good), "0.0.0.0", 1)


def test_demo_config_and_banner(monkeypatch):
    monkeypatch.delenv("TOKENPACE_CONFIG", raising=False)
    monkeypatch.setenv("TOKENPACE_DEMO_KEY", "tp-demo-fixed-key-1")
    monkeypatch.setenv("TOKENPACE_ADMIN_KEY", "tp-admin-fixed-key-1")
    config, key, admin_key = load_serve_config(None)
    assert key == "tp-demo-fixed-key-1"
    assert config.tenant_by_digest()[hash_key(key)].name == "demo"
    assert config.admin.key_sha256 == hash_key("tp-admin-fixed-key-1")
    text = banner(config, "http://127.0.0.1:8080", key, admin_key)
    assert key in text and "curl -N http://127.0.0.1:8080/v1/chat/completions" in text
    assert "tp-admin-fixed-key-1" in text
    assert 'OpenAI(base_url="http://127.0.0.1:8080/v1"' in text
    _, key2 = demo_config()
    assert key2.startswith("tp-demo-") and key2 != key


def test_serve_without_config_starts_and_prints_key(tmp_path: Path):
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "TOKENPACE_CONFIG"}
    env["TOKENPACE_DEMO_KEY"] = "tp-demo-subprocess-1"
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway.cli", "serve", "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=0.5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None, proc.stderr.read()
            assert time.monotonic() < deadline, "gateway did not start"
            time.sleep(0.05)
        headers = {"Authorization": "Bearer tp-demo-subprocess-1"}
        assert httpx.get(f"http://127.0.0.1:{port}/v1/models", headers=headers).status_code == 200
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=10)
    assert "tp-demo-subprocess-1" in out
    assert (
        f"http://127.0.0.1:{port}" in out and "curl" in out and "from openai import OpenAI" in out
    )


def test_serve_with_bad_config_exits_2(tmp_path: Path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("tenants: []\n")
    proc = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "serve", "--config", str(bad)],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=ROOT,
    )
    assert proc.returncode == 2 and "tenants" in proc.stderr
