"""The serveability warning: a tier whose TDS no batch size of a backend's latency profile
meets, from `tokenpace check-config` and from `tokenpace serve` at start-up."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from gateway.backends.serveability import unservable_tiers
from gateway.cli import check_config
from gateway.config.loader import parse_config
from tests.support.paths import EXAMPLES
from tests.support.ports import free_port

CONFIG = """
tenants:
  - {name: free, api_keys: [tp-key-free-000001], tiers: [chat]}
  - {name: ent, api_keys: [tp-key-ent-0000001], tiers: [chat, voice, fast]}
backends:
  - {name: big, kind: embedded, models: [m], options: {profile: opt-66b-4xa100}}
  - {name: small, kind: embedded, models: [m], options: {profile: llama-3.1-8b-h100}}
  - {name: remote, url: "http://127.0.0.1:9/v1", models: [m]}
"""


def test_a_tier_at_the_batch_1_speed_is_named_with_backend_and_speed():
    import yaml

    warnings = unservable_tiers(parse_config(yaml.safe_load(CONFIG)))
    assert len(warnings) == 1  # fast on the OPT-66B profile; llama serves it; http: unknown
    (warning,) = warnings
    assert "tier 'fast' promises 25 tokens/s" in warning
    assert "backend 'big' (latency profile opt-66b-4xa100)" in warning
    assert "at most 25 tokens/s per stream, at batch size 1 (40 ms a step)" in warning


def test_tiers_no_tenant_may_use_are_not_reported():
    import yaml

    data = yaml.safe_load(CONFIG)
    data["tenants"] = data["tenants"][:1]  # chat only
    assert unservable_tiers(parse_config(data)) == []


def test_check_config_warns_and_still_passes(tmp_path: Path, capsys):
    path = tmp_path / "gw.yaml"
    path.write_text(CONFIG)
    assert check_config([str(path)]) == 0
    captured = capsys.readouterr()
    assert "OK" in captured.out
    assert f"{path}: warning: tier 'fast' promises 25 tokens/s" in captured.err


def test_serve_warns_at_start_up(tmp_path: Path):
    path = tmp_path / "gw.yaml"
    port = free_port()
    path.write_text(f"server: {{host: 127.0.0.1, port: {port}}}\n{CONFIG}")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway.cli", "serve", "--config", str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    try:
        deadline = time.monotonic() + 60
        seen = []
        assert proc.stdout is not None
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            seen.append(line)
            if "tier 'fast' promises 25 tokens/s" in line:
                assert "backend 'big'" in line and "40 ms a step" in line
                break
        else:
            raise AssertionError(f"no warning within 60 s: {seen}")
        assert any("tier 'fast'" in line for line in seen), seen
        assert proc.poll() is None, "the gateway must keep running"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_the_price_tiering_example_is_valid_and_warns_about_its_fast_tier(capsys):
    example = EXAMPLES / "price_tiering" / "gateway.yaml"
    assert check_config([str(example)]) == 0
    err = capsys.readouterr().err
    assert "tier 'fast' promises 25 tokens/s, but backend 'sim'" in err
    assert "tier 'batch'" in err  # enterprise may use every tier


def test_the_price_tiering_example_engine_runs_weighted_andes_with_its_slack():
    from gateway.backends.kinds import build_backends
    from gateway.config.loader import load_config

    example = EXAMPLES / "price_tiering" / "gateway.yaml"
    (backend,) = build_backends(load_config(example))
    policy = backend.engine.policy
    assert policy.shares is not None and policy.shares.slack == 256.0
