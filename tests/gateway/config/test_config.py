"""Configuration loading and validation, and the gateway's CLI commands."""

from __future__ import annotations

import argparse
import os
import socket
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
from gateway.version import VERSION
from qos.policy.reader import GuardSettings
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
    guard = GuardSettings().overdue_after_ttfts
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
    assert f"version: {VERSION}" in out and "workers: 1" in out


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


THREE_ROUNDS_YAML = """
backend:
  - {name: sim, kind: embedded, models: [m]}
server: {port: 70000}
tenants:
  - name: acme
    api_keys: ["tp-key-long-1"]
    default_tier: chatt
  - name: hobby
    api_keys: [short]
backends:
  - name: sim
    kind: embedded
    models: [m]
    options: {profil: llama-3.1-8b-h100, time_scale: 0}
"""


def test_check_config_reports_every_problem_in_one_pass(tmp_path: Path, capsys):
    """Field errors, the checks across fields and a backend's options, together; each
    line names the file, and a typo gets the nearest key."""
    path = tmp_path / "gw.yaml"
    path.write_text(THREE_ROUNDS_YAML)
    assert check_config([str(path)]) == 1
    lines = capsys.readouterr().err.splitlines()
    assert lines == [
        f"{path}: server.port: Input should be less than or equal to 65535",
        f"{path}: tenants[1].api_keys[0].key: String should have at least 8 characters",
        f"{path}: backend: unknown key; did you mean 'backends'?",
        f"{path}: tenants[0].default_tier: unknown tier 'chatt'; known: batch, chat, fast, voice",
        f"{path}: backends[0].options.time_scale: Input should be greater than 0",
        f"{path}: backends[0].options.profil: unknown key; did you mean 'profile'?",
        f"{path}: invalid: 6 problems",
    ]


@pytest.mark.parametrize(
    ("patch", "expected"),
    [
        ({"tenant": []}, "tenant: unknown key; did you mean 'tenants'?"),
        ({"server": {"prot": 1}}, "server.prot: unknown key; did you mean 'port'?"),
        ({"logging": {"jsn": True}}, "logging.jsn: unknown key; did you mean 'json'?"),
        ({"tiers": {"gold": {"ttft": 1, "tdss": 2}}}, "tiers.gold.tdss: unknown key; did you"),
        ({"zzz": 1}, "zzz: unknown key (typo?)"),
    ],
)
def test_a_typo_gets_the_nearest_key(patch, expected):
    data = {"tenants": [{"name": "ok", "api_keys": ["tp-fine-key-1"]}], **patch}
    with pytest.raises(ConfigError) as err:
        parse_config(data, "test.yaml")
    assert f"test.yaml: {expected}" in str(err.value), str(err.value)


def test_a_syntax_error_names_the_file_and_line(tmp_path: Path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("tenants:\n  - name: a\n    api_keys: [unclosed\n")
    assert check_config([str(bad)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"{bad}: (syntax): line 4, column 1:"), err
    assert "<unicode string>" not in err


def test_version_flag():
    tokenpace = str(Path(sys.executable).parent / "tokenpace")  # the installed command
    for argv in ([tokenpace], [sys.executable, "-m", "gateway.cli"]):
        done = subprocess.run([*argv, "--version"], capture_output=True, text=True, cwd=ROOT)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == f"tokenpace {VERSION}"
    assert VERSION[0].isdigit()


def test_banner_names_version_and_workers(monkeypatch):
    monkeypatch.delenv("TOKENPACE_CONFIG", raising=False)
    monkeypatch.delenv("TOKENPACE_REDIS_URL", raising=False)
    config, key, admin_key = load_serve_config(None)
    text = banner(config, "http://127.0.0.1:8000", key, admin_key)
    assert f"\n  version: {VERSION}\n  workers: 1 (shared state in memory)\n" in text
    config, key, admin_key = load_serve_config(None, "redis://127.0.0.1:6390/0")
    assert config.store.redis_url == "redis://127.0.0.1:6390/0"
    assert "workers: 2 (shared state Redis)" in banner(config, "u", key, admin_key, 2)


def test_redis_url_from_flag_or_environment(tmp_path: Path, monkeypatch):
    good = tmp_path / "good.toml"
    good.write_text(GOOD_TOML)
    monkeypatch.setenv("TOKENPACE_REDIS_URL", "redis://127.0.0.1:6391/1")
    config, _, _ = load_serve_config(str(good))
    assert config.store.redis_url == "redis://127.0.0.1:6391/1"  # replaces the file's
    config, _, _ = load_serve_config(None, "redis://127.0.0.1:6392/2")  # the flag wins
    assert config.store.redis_url == "redis://127.0.0.1:6392/2"
    with pytest.raises(ConfigError, match=r"--redis-url \(or \$TOKENPACE_REDIS_URL\): redis_url"):
        load_serve_config(None, "http://not-redis")


def test_the_default_port_is_8000():
    assert (
        parse_config({"tenants": [{"name": "a", "api_keys": ["tp-fine-key-1"]}]}).server.port
        == 8000
    )


def test_a_busy_port_is_named(tmp_path: Path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "gateway.cli", "serve", "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=ROOT,
            env={k: v for k, v in os.environ.items() if k != "TOKENPACE_CONFIG"},
        )
    assert done.returncode == 2
    assert f"cannot listen on 127.0.0.1:{port} (port): Address already in use" in done.stderr
