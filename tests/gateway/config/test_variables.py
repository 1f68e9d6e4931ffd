"""``${NAME}`` in a configuration file: filled in from the environment after parsing,
``$$`` a literal ``$``, and every variable that is not set named with its key."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.config.loader import load_config
from gateway.config.schema import ConfigError, hash_key
from gateway.config.variables import expand_variables

SECRETS_YAML = """
server: {port: "${GW_PORT}"}
store:
  redis_url: "redis://:${GW_REDIS_PASSWORD}@127.0.0.1:6379/0"
admin: {key: "${GW_ADMIN_KEY}"}
metrics: {token: "${GW_METRICS_TOKEN}"}
telemetry: {token_secret: "${GW_TOKEN_SECRET}"}
tenants:
  - name: acme
    api_keys: [{key: "${GW_ACME_KEY}"}, "tp-literal-$$-dollar"]
backends:
  - name: up
    url: http://127.0.0.1:9/v1
    models: [m]
    api_key: "${GW_UPSTREAM_KEY}"
"""

ENV = {
    "GW_PORT": "9123",
    "GW_REDIS_PASSWORD": "s3cret",
    "GW_ADMIN_KEY": "tp-admin-from-env-0001",
    "GW_METRICS_TOKEN": "metrics-token-from-env",
    "GW_TOKEN_SECRET": "x" * 40,
    "GW_ACME_KEY": "tp-acme-from-env-0001",
    "GW_UPSTREAM_KEY": "upstream: {not: yaml}",
}


def test_every_secret_comes_from_the_environment(tmp_path: Path) -> None:
    path = tmp_path / "gw.yaml"
    path.write_text(SECRETS_YAML)
    config = load_config(path, environ=ENV)
    assert config.server.port == 9123  # a string filled in, validated as the field's type
    assert config.store.redis_url == "redis://:s3cret@127.0.0.1:6379/0"
    assert config.admin.key_sha256 == hash_key("tp-admin-from-env-0001")
    assert config.metrics.token_sha256 == hash_key("metrics-token-from-env")
    assert config.telemetry.token_secret == "x" * 40
    digests = [k.digest for k in config.tenants[0].api_keys]
    assert digests == [hash_key("tp-acme-from-env-0001"), hash_key("tp-literal-$-dollar")]
    # a value is never read as YAML
    assert config.backends[0].resolved_api_key() == "upstream: {not: yaml}"


def test_toml_files_are_filled_in_too(tmp_path: Path) -> None:
    path = tmp_path / "gw.toml"
    path.write_text('[[tenants]]\nname = "acme"\napi_keys = ["${GW_ACME_KEY}"]\n')
    config = load_config(path, environ=ENV)
    assert config.tenants[0].api_keys[0].digest == hash_key("tp-acme-from-env-0001")


def test_the_process_environment_is_the_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GW_ACME_KEY", "tp-acme-from-process-01")
    path = tmp_path / "gw.yaml"
    path.write_text('tenants: [{name: acme, api_keys: ["${GW_ACME_KEY}"]}]\n')
    assert load_config(path).tenants[0].api_keys[0].digest == hash_key("tp-acme-from-process-01")


def test_unset_variables_are_named_with_their_keys_in_one_pass(tmp_path: Path) -> None:
    path = tmp_path / "gw.yaml"
    path.write_text(SECRETS_YAML)
    env = {k: v for k, v in ENV.items() if k not in ("GW_ACME_KEY", "GW_REDIS_PASSWORD")}
    env["GW_PORT"] = "not a port"
    with pytest.raises(ConfigError) as err:
        load_config(path, environ=env)
    assert err.value.problems == [
        "store.redis_url: ${GW_REDIS_PASSWORD} is not set (an environment variable the value "
        "names)",
        "tenants[0].api_keys[0].key: ${GW_ACME_KEY} is not set (an environment variable the "
        "value names)",
        "server.port: Input should be a valid integer, unable to parse string as an integer",
    ]
    assert all(line.startswith(f"{path}: ") for line in err.value.lines())
    for value in env.values():  # no value of a variable is ever shown
        assert value not in str(err.value)


def test_a_lone_dollar_is_refused() -> None:
    data, problems = expand_variables({"admin": {"key": "abc$def"}, "n": 3, "$k": "x"}, {})
    assert problems == {
        "admin.key": "a '$' must start ${NAME} (an environment variable); write '$$' for a "
        "literal '$'"
    }
    assert data == {"admin": {"key": "abc$def"}, "n": 3, "$k": "x"}  # keys are left alone


def test_several_variables_in_one_value() -> None:
    env = {"USER": "u", "PASSWORD": "p"}
    data, problems = expand_variables(["redis://${USER}:${PASSWORD}@h/0", "$${USER}"], env)
    assert (data, problems) == (["redis://u:p@h/0", "${USER}"], {})
    _, problems = expand_variables({"url": "${A}${B}${A}"}, {})
    assert problems == {"url": "${A}, ${B} are not set (an environment variable the value names)"}
