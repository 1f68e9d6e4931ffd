"""The Kubernetes manifests under deploy/kubernetes, rendered as they ship
(``kubectl kustomize``): Kubernetes' own schemas, the gateway configuration they carry,
Secrets referenced and never inlined, and the selectors and ports that tie the pieces
together."""

from __future__ import annotations

import copy
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from gateway.relay.drain import EXIT_S
from qos.vllm.config import PluginConfig
from tests.support.deploy import (
    DEPLOY,
    KUBERNETES_VERSION,
    KUSTOMIZATIONS,
    container,
    environment,
    find,
    gateway_config,
    render,
)

EXAMPLE = "overlays/example"
TOKENPACE = Path(sys.executable).parent / "tokenpace"  # the image's entrypoint, installed
PLACEHOLDER = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def check_schema(doc: dict[str, Any]) -> None:
    """Kubernetes' schema, unknown fields rejected. The ServiceMonitor is a custom
    resource whose schema no package here ships: what it must match is checked in
    :func:`test_backends_redis_and_ports_meet`."""
    if doc["kind"] != "ServiceMonitor":
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


@pytest.mark.parametrize("kustomization", [str(k) for k in KUSTOMIZATIONS])
def test_every_kustomization_renders_to_valid_objects(kustomization: str) -> None:
    docs = render(kustomization)
    assert docs
    for doc in docs:
        check_schema(doc)


def test_schema_check_rejects_a_misspelt_field() -> None:
    docs = render(EXAMPLE)
    deployment = copy.deepcopy(find(docs, "Deployment", "tokenpace-gateway"))
    container(deployment, "gateway")["readinesProbe"] = {"httpGet": {"path": "/readyz"}}
    with pytest.raises(kubernetes_validate.ValidationError):
        check_schema(deployment)


def run_gateway_command(
    args: list[str], config: Path, env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    """``tokenpace ARGS`` (the image's entrypoint) with the ConfigMap's configuration at
    ``$TOKENPACE_CONFIG`` and the environment ``env`` (the container's)."""
    return subprocess.run(
        [str(TOKENPACE), *args],
        env={"PATH": os.environ["PATH"], **env, "TOKENPACE_CONFIG": str(config)},
        capture_output=True,
        text=True,
    )


def test_gateway_configuration_passes_check_config(tmp_path: Path) -> None:
    """With the Deployment's environment (its Secrets' values), as the pod reads it."""
    docs = render(EXAMPLE)
    config = tmp_path / "gateway.yaml"
    config.write_text(gateway_config(docs))
    env = environment(container(find(docs, "Deployment", "tokenpace-gateway"), "gateway"))
    done = run_gateway_command(["check-config", str(config)], config, env)
    assert done.returncode == 0, done.stderr
    assert "OK: 2 tenant(s), 2 backend(s)" in done.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gateway.yaml"]  # nothing written


def test_a_variable_that_is_not_set_stops_the_gateway(tmp_path: Path) -> None:
    docs = render(EXAMPLE)
    config = tmp_path / "gateway.yaml"
    config.write_text(gateway_config(docs))
    env = environment(container(find(docs, "Deployment", "tokenpace-gateway"), "gateway"))
    del env["TOKENPACE_KEY_GLOBEX"]
    done = run_gateway_command(["serve"], config, env)
    assert done.returncode == 2
    assert "tenants[1].api_keys[0].key: ${TOKENPACE_KEY_GLOBEX} is not set" in done.stderr
    assert "tp-acme-deploy-test-0001" not in done.stderr  # no value is ever shown


def test_the_image_runs_tokenpace_on_the_mounted_configuration() -> None:
    """The Containerfile's entrypoint and configuration path are what the Deployment
    mounts and the tests above run."""
    text = (DEPLOY / "gateway" / "Containerfile").read_text()
    assert 'ENTRYPOINT ["tokenpace"]' in text and 'CMD ["serve"]' in text
    deployment = find(render(EXAMPLE), "Deployment", "tokenpace-gateway")
    mounts = container(deployment, "gateway")["volumeMounts"]
    (config_mount,) = [m for m in mounts if m["name"] == "config"]
    assert f"TOKENPACE_CONFIG={config_mount['mountPath']}/gateway.yaml" in text


def test_no_secret_is_inlined() -> None:
    """No Secret object ships; every secret in the gateway configuration is a variable
    that the gateway's container takes from a Secret; every secret-like variable of
    every container comes from a Secret."""
    docs = render(EXAMPLE)
    assert not [d for d in docs if d["kind"] == "Secret"]
    gateway = container(find(docs, "Deployment", "tokenpace-gateway"), "gateway")
    from_secrets = {v["name"] for v in gateway["env"] if "secretKeyRef" in v.get("valueFrom", {})}
    config = yaml.safe_load(gateway_config(docs))
    secrets = [
        config["admin"]["key"],
        config["telemetry"]["token_secret"],
        config["store"]["redis_url"],
        *(k["key"] for t in config["tenants"] for k in t["api_keys"]),
    ]
    for value in secrets:
        names = PLACEHOLDER.findall(value)
        assert names, f"{value!r}: a secret written into the ConfigMap"
        assert set(names) <= from_secrets, f"{value!r}: not from a Secret"
    for b in config["backends"]:
        assert "api_key" not in b and b["api_key_env"] in from_secrets
    secret_like = {"KEY", "PASSWORD", "TOKEN", "SECRET", "AUTH"}
    for workload in (d for d in docs if d["kind"] in ("Deployment", "StatefulSet")):
        for c in workload["spec"]["template"]["spec"]["containers"]:
            for var in c.get("env", []):
                if secret_like & set(var["name"].split("_")):
                    assert "secretKeyRef" in var.get("valueFrom", {}), var["name"]


def pods(docs: list[dict[str, Any]]) -> dict[str, dict[str, str]]:
    """Each workload's name and its pods' labels."""
    return {
        d["metadata"]["name"]: d["spec"]["template"]["metadata"]["labels"]
        for d in docs
        if d["kind"] in ("Deployment", "StatefulSet")
    }


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def chosen(selector: dict[str, str], docs: list[dict[str, Any]]) -> set[str]:
    """The workloads whose pods ``selector`` selects."""
    return {name for name, labels in pods(docs).items() if selects(selector, labels)}


def test_network_policies_let_only_the_gateway_reach_redis_and_the_engines() -> None:
    docs = render(EXAMPLE)
    guarded = {
        "tokenpace-redis": {"tokenpace-redis"},
        "tokenpace-engines": {"vllm-llama-a", "vllm-llama-b"},
    }
    for policy, workloads in guarded.items():
        spec = find(docs, "NetworkPolicy", policy)["spec"]
        assert chosen(spec["podSelector"]["matchLabels"], docs) == workloads
        assert spec["policyTypes"] == ["Ingress"]
        (rule,) = spec["ingress"]
        (peer,) = rule["from"]
        assert set(peer) == {"podSelector"}
        assert chosen(peer["podSelector"]["matchLabels"], docs) == {"tokenpace-gateway"}
    metrics = find(docs, "NetworkPolicy", "tokenpace-gateway")["spec"]
    assert chosen(metrics["podSelector"]["matchLabels"], docs) == {"tokenpace-gateway"}


def test_backends_redis_and_ports_meet() -> None:
    """Each URL in the gateway configuration is a Service of the rendered manifests whose
    port leads to a container port of the pods it selects; the gateway's own ports are
    the configuration's; the ServiceMonitor finds the gateway's metrics port."""
    docs = render(EXAMPLE)
    config = yaml.safe_load(gateway_config(docs))
    urls = [b["url"] for b in config["backends"]] + [config["store"]["redis_url"]]
    for url in urls:
        host, port = re.search(r"(?:@|//)([^:/@]+):(\d+)", url).groups()
        service = find(docs, "Service", host)["spec"]
        (service_port,) = [p for p in service["ports"] if p["port"] == int(port)]
        (workload,) = chosen(service["selector"], docs)
        pod = next(d for d in docs if d["metadata"]["name"] == workload and "template" in d["spec"])
        names = {
            p["name"] for c in pod["spec"]["template"]["spec"]["containers"] for p in c["ports"]
        }
        assert service_port["targetPort"] in names
    gateway = container(find(docs, "Deployment", "tokenpace-gateway"), "gateway")
    ports = {p["name"]: p["containerPort"] for p in gateway["ports"]}
    assert ports == {"http": config["server"]["port"], "metrics": config["metrics"]["port"]}
    assert config["server"]["host"] == "0.0.0.0"
    monitor = find(docs, "ServiceMonitor", "tokenpace-gateway")["spec"]
    service = find(docs, "Service", "tokenpace-gateway")
    assert selects(monitor["selector"]["matchLabels"], service["metadata"]["labels"])
    assert [e["port"] for e in monitor["endpoints"]] == ["metrics"]
    assert "metrics" in {p["name"] for p in service["spec"]["ports"]}


def test_gateway_pod_fits_its_workers_and_its_drain() -> None:
    docs = render(EXAMPLE)
    deployment = find(docs, "Deployment", "tokenpace-gateway")
    pod = deployment["spec"]["template"]["spec"]
    gateway = container(deployment, "gateway")
    workers = int(gateway["args"][gateway["args"].index("--workers") + 1])
    assert int(gateway["resources"]["requests"]["cpu"]) == workers
    assert gateway["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert gateway["livenessProbe"]["httpGet"]["path"] == "/healthz"
    pre_stop = gateway["lifecycle"]["preStop"]["sleep"]["seconds"]
    drain_s = yaml.safe_load(gateway_config(docs))["server"]["drain_s"]
    # the endpoints let go of the pod, open streams end, the processes exit: then SIGKILL
    assert pod["terminationGracePeriodSeconds"] >= pre_stop + drain_s + EXIT_S
    hpa = find(docs, "HorizontalPodAutoscaler", "tokenpace-gateway")["spec"]
    assert hpa["scaleTargetRef"]["name"] == "tokenpace-gateway"
    pdb = find(docs, "PodDisruptionBudget", "tokenpace-gateway")["spec"]
    assert chosen(pdb["selector"]["matchLabels"], docs) == {"tokenpace-gateway"}
    assert hpa["minReplicas"] > pdb["maxUnavailable"]


def test_engines_run_the_plugin_on_a_gpu() -> None:
    docs = render(EXAMPLE)
    for name in ("vllm-llama-a", "vllm-llama-b"):
        engine = container(find(docs, "Deployment", name), "vllm")
        assert engine["resources"]["limits"]["nvidia.com/gpu"] == 1
        assert engine["args"][engine["args"].index("--served-model-name") + 1] == "llama-3.1-8b"
        env = environment(engine)
        plugin = PluginConfig.from_env(env)  # the plugin's own reading of its settings
        assert plugin.policy == "andes-tp" and plugin.pause
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert engine[probe]["httpGet"]["path"] == "/health"


def test_redis_keeps_an_append_only_file_on_a_volume() -> None:
    docs = render(EXAMPLE)
    redis = find(docs, "StatefulSet", "tokenpace-redis")
    args = container(redis, "redis")["args"]
    assert args[args.index("--appendonly") + 1] == "yes"
    data_dir = args[args.index("--dir") + 1]
    (mount,) = [m for m in container(redis, "redis")["volumeMounts"] if m["mountPath"] == data_dir]
    (claim,) = redis["spec"]["volumeClaimTemplates"]
    assert claim["metadata"]["name"] == mount["name"]
