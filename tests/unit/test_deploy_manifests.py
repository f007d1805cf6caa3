"""The Kubernetes install under ``deploy/``: every overlay builds with ``kubectl kustomize``,
every object it makes is valid for Kubernetes :data:`K8S_VERSION` with no unknown field,
and the install does what ``deploy/README.md`` says:

- the policy ConfigMap loads with ebbtide's own loader and names the overlay's profile, and
  each overlay's policy differs from the base's only in ``kubernetes:``;
- the agent may create and delete pods only in ``ebbtide-jobs``, and the admission policy
  narrows that to ebbtide's pods on the agent's own node; the scheduler has no Kubernetes
  API access at all;
- the NetworkPolicy keeps attempt pods from every port in ``ebbtide-system``, where
  ebbtide's own pods still reach each other and Prometheus the metrics;
- every container has resources and a security context; no Secret value sits in a
  ConfigMap; the agent runs in the host's PID namespace with the shared state directory;
- an attempt pod the executor would create for the overlay's policy is valid and fits the
  install (namespace, priority class, state directory, runtime class).

Without ``kubectl`` these tests skip, or fail when ``CI=true``.
"""

from __future__ import annotations

import base64
import functools
import os
import re
import shutil
import subprocess
from functools import cache
from pathlib import Path
from typing import Any, get_args

import kubernetes_validate
import pytest
import yaml

from ebbtide.config.policy import ProfileName, parse_policy

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
BASE = DEPLOY / "kubernetes" / "base"
OVERLAYS = DEPLOY / "kubernetes" / "overlays"

#: The Kubernetes version the objects are validated against: the newest 1.3x release
#: kubernetes-validate ships schemas for.  ValidatingAdmissionPolicy v1 needs >= 1.30.
K8S_VERSION = "1.37"

PROFILES: tuple[str, ...] = get_args(ProfileName)
SYSTEM_NS = "ebbtide-system"
JOBS_NS = "ebbtide-jobs"
STATE_DIR = "/var/lib/ebbtide"
#: The host's cgroup tree, which the agent mounts to pause attempt pods.
CGROUP_DIR = "/sys/fs/cgroup"
POLICY_PATH = "/etc/ebbtide/ebbtide.yaml"
IMAGE = "ghcr.io/ebbtide/ebbtide"
AGENT_USER = f"system:serviceaccount:{SYSTEM_NS}:ebbtide-agent"
MANAGED_BY = ("app.kubernetes.io/managed-by", "ebbtide")
#: What a profile overlay may change in the base policy's ``kubernetes:`` section.
PROFILE_KEYS = {"profile", "scheduler_name", "runtime_class", "mig_profiles"}
WORKLOADS = {"Deployment", "DaemonSet", "StatefulSet", "ReplicaSet", "Job", "CronJob", "Pod"}

OVERLAY_NAMES = sorted(p.name for p in OVERLAYS.iterdir() if (p / "kustomization.yaml").is_file())
BUILDS = ["base", *OVERLAY_NAMES]
IN_CI = os.environ.get("CI", "").lower() == "true"


# -- building --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def kubectl() -> str:
    path = shutil.which("kubectl")
    if path is None:
        message = "kubectl is not installed (the manifests are built with `kubectl kustomize`)"
        if IN_CI:
            pytest.fail(f"{message}; CI=true requires it", pytrace=False)
        pytest.skip(message)
    return path


def _directory(name: str) -> Path:
    return BASE if name == "base" else OVERLAYS / name


@cache
def _build(kubectl: str, name: str) -> tuple[dict[str, Any], ...]:
    done = subprocess.run(
        [kubectl, "kustomize", str(_directory(name))],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, f"kubectl kustomize {name} failed:\n{done.stderr}"
    return tuple(d for d in yaml.safe_load_all(done.stdout) if d)


@pytest.fixture(params=BUILDS)
def built(request: pytest.FixtureRequest, kubectl: str) -> tuple[str, tuple[dict[str, Any], ...]]:
    return request.param, _build(kubectl, request.param)


@pytest.fixture(params=OVERLAY_NAMES)
def overlay(request: pytest.FixtureRequest, kubectl: str) -> tuple[str, tuple[dict[str, Any], ...]]:
    return request.param, _build(kubectl, request.param)


def _all(docs: tuple[dict[str, Any], ...], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def _find(
    docs: tuple[dict[str, Any], ...], kind: str, name: str, namespace: str | None = None
) -> dict[str, Any] | None:
    for d in docs:
        meta = d["metadata"]
        if d["kind"] == kind and meta["name"] == name and meta.get("namespace") == namespace:
            return d
    return None


def _one(
    docs: tuple[dict[str, Any], ...], kind: str, name: str, namespace: str | None = None
) -> dict[str, Any]:
    found = _find(docs, kind, name, namespace)
    assert found is not None, f"no {kind} {namespace + '/' if namespace else ''}{name}"
    return found


def _pod_spec(workload: dict[str, Any]) -> dict[str, Any]:
    if workload["kind"] == "Pod":
        return workload["spec"]
    if workload["kind"] == "CronJob":
        return workload["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    return workload["spec"]["template"]["spec"]


def _containers(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [*spec.get("initContainers", []), *spec["containers"]]


def _expected_profile(name: str) -> str:
    return "whole" if name == "dev" else name


def _agent(docs: tuple[dict[str, Any], ...]) -> dict[str, Any]:
    return _one(docs, "DaemonSet", "ebbtide-agent", SYSTEM_NS)


def _scheduler(docs: tuple[dict[str, Any], ...]) -> dict[str, Any]:
    return _one(docs, "Deployment", "ebbtide-scheduler", SYSTEM_NS)


def _policy_text(docs: tuple[dict[str, Any], ...]) -> str:
    return str(_one(docs, "ConfigMap", "ebbtide-policy", SYSTEM_NS)["data"]["ebbtide.yaml"])


# -- the set of overlays and strict validity -------------------------------------------


def test_there_is_an_overlay_for_every_profile_and_one_for_trying_it_out() -> None:
    assert set(OVERLAY_NAMES) == {*PROFILES, "dev"}


def test_every_object_is_valid_kubernetes(built: tuple[str, tuple[dict[str, Any], ...]]) -> None:
    name, docs = built
    problems = []
    seen: set[tuple[str, str | None, str]] = set()
    for doc in docs:
        meta = doc["metadata"]
        key = (doc["kind"], meta.get("namespace"), meta["name"])
        assert key not in seen, f"{name}: {key} twice"
        seen.add(key)
        try:
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            where = ".".join(str(p) for p in exc.path)
            problems.append(f"{doc['kind']} {meta['name']}: {where}: {exc.message}")
        except kubernetes_validate.SchemaNotFoundError as exc:
            problems.append(exc.message)
    assert not problems, f"{name} is not valid for Kubernetes {K8S_VERSION}:\n" + "\n".join(
        problems
    )


# -- the policy ------------------------------------------------------------------------


def test_the_policy_loads_and_names_the_overlays_profile(
    overlay: tuple[str, tuple[dict[str, Any], ...]],
) -> None:
    name, docs = overlay
    policy = parse_policy(_policy_text(docs), f"{name}: ConfigMap ebbtide-policy")
    k8s = policy.kubernetes
    assert k8s is not None, f"{name}: the policy has no kubernetes: section"
    assert k8s.profile == _expected_profile(name)
    # ... and it agrees with the rest of the install
    assert _find(docs, "Role", "ebbtide-agent", k8s.namespace), (
        f"{name}: attempt pods go to {k8s.namespace!r}, where the agent has no Role"
    )
    assert k8s.priority_class is not None
    assert _one(docs, "PriorityClass", k8s.priority_class)["value"] < 0
    host_paths = [
        v["hostPath"]["path"] for v in _pod_spec(_agent(docs))["volumes"] if "hostPath" in v
    ]
    assert host_paths == [k8s.state_dir, CGROUP_DIR]
    agent_image = _pod_spec(_agent(docs))["containers"][0]["image"]
    assert k8s.image == agent_image, (
        f"{name}: the policy's kubernetes.image {k8s.image} is not the install's {agent_image}"
    )
    if k8s.profile == "direct":
        assert k8s.runtime_class == _pod_spec(_agent(docs))["runtimeClassName"] == "nvidia"


def test_each_overlays_policy_differs_from_the_bases_only_in_its_profile(
    overlay: tuple[str, tuple[dict[str, Any], ...]], kubectl: str
) -> None:
    name, docs = overlay
    base = yaml.safe_load(_policy_text(_build(kubectl, "base")))
    mine = yaml.safe_load(_policy_text(docs))
    base_k8s, my_k8s = base.pop("kubernetes"), mine.pop("kubernetes")
    assert mine == base, f"{name}: the policy differs from base/ebbtide.yaml outside kubernetes:"
    for key in PROFILE_KEYS:
        base_k8s.pop(key, None)
        my_k8s.pop(key, None)
    assert my_k8s == base_k8s, f"{name}: kubernetes: differs from the base's beyond the profile"


def test_no_secret_value_is_in_a_configmap(
    built: tuple[str, tuple[dict[str, Any], ...]], kubectl: str
) -> None:
    name, docs = built
    secrets: set[str] = set()
    for build in BUILDS:
        for secret in _all(_build(kubectl, build), "Secret"):
            secrets.update(str(v) for v in (secret.get("stringData") or {}).values())
            secrets.update(
                base64.b64decode(v).decode() for v in (secret.get("data") or {}).values()
            )
    secrets = {s for s in secrets if len(s) >= 6}
    assert secrets, "no Secret found to compare with"
    credentials = re.compile(r"://[^/\s:@]+:[^/\s@]+@")
    for cm in _all(docs, "ConfigMap"):
        for key, value in (cm.get("data") or {}).items():
            where = f"{name}: ConfigMap {cm['metadata']['name']} key {key}"
            assert not any(s in value for s in secrets), f"{where} holds a Secret's value"
            assert not credentials.search(value), f"{where} holds a URL with a password"


# -- who may do what -------------------------------------------------------------------


def _bound_rules(
    docs: tuple[dict[str, Any], ...], namespace: str, account: str
) -> list[tuple[str, dict[str, Any]]]:
    """Every rule bound to the ServiceAccount, with its scope: the RoleBinding's
    namespace, or ``*`` for a ClusterRoleBinding."""

    def names_account(subject: dict[str, Any], binding_ns: str | None) -> bool:
        if subject.get("kind") == "ServiceAccount":
            ns = subject.get("namespace", binding_ns)
            return bool(subject.get("name") == account and ns == namespace)
        groups = {"system:serviceaccounts", f"system:serviceaccounts:{namespace}"}
        groups.add("system:authenticated")
        return subject.get("kind") == "Group" and subject.get("name") in groups

    rules = []
    for binding in docs:
        if binding["kind"] not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        binding_ns = binding["metadata"].get("namespace")
        if not any(names_account(s, binding_ns) for s in binding.get("subjects") or []):
            continue
        ref = binding["roleRef"]
        role = _one(docs, ref["kind"], ref["name"], binding_ns if ref["kind"] == "Role" else None)
        scope = "*" if binding["kind"] == "ClusterRoleBinding" else binding_ns
        rules += [(scope, rule) for rule in role.get("rules") or []]
    return rules


def _scopes(rules: list[tuple[str, dict[str, Any]]], verb: str, resource: str) -> set[str]:
    """Where the rules allow ``verb`` on core ``resource``."""

    def has(values: list[str], value: str) -> bool:
        return value in values or "*" in values

    return {
        scope
        for scope, rule in rules
        if has(rule.get("apiGroups", []), "")
        and has(rule.get("resources", []), resource)
        and has(rule.get("verbs", []), verb)
    }


def test_the_agent_may_create_and_delete_pods_only_in_the_jobs_namespace(
    built: tuple[str, tuple[dict[str, Any], ...]],
) -> None:
    name, docs = built
    rules = _bound_rules(docs, SYSTEM_NS, "ebbtide-agent")
    assert _scopes(rules, "delete", "pods") == {JOBS_NS}, name
    assert _scopes(rules, "create", "pods") == {JOBS_NS}, name
    assert _scopes(rules, "deletecollection", "pods") == set(), name
    for verb in ("get", "list", "watch", "patch", "update", "create"):
        assert _scopes(rules, verb, "secrets") == set(), f"{name}: agent may {verb} secrets"
    for scope, rule in rules:
        assert "*" not in rule.get("verbs", []) + rule.get("resources", []), (scope, rule)
    # ... and it has what the executor needs
    for verb in ("get", "list", "watch"):
        assert JOBS_NS in _scopes(rules, verb, "pods")
        assert "*" in _scopes(rules, verb, "pods"), "online pods are named cluster-wide"
        assert "*" in _scopes(rules, verb, "nodes")
    assert JOBS_NS in _scopes(rules, "get", "pods/log")
    # only direct advertises spare capacity in its node's status
    assert _scopes(rules, "patch", "nodes/status") == ({"*"} if name == "direct" else set())
    assert _scopes(rules, "patch", "nodes") == set()


def test_the_admission_policy_narrows_the_agent_to_ebbtides_pods(
    built: tuple[str, tuple[dict[str, Any], ...]],
) -> None:
    name, docs = built
    policy = _one(docs, "ValidatingAdmissionPolicy", "ebbtide-agent-pods")["spec"]
    binding = _one(docs, "ValidatingAdmissionPolicyBinding", "ebbtide-agent-pods")["spec"]
    assert binding["policyName"] == "ebbtide-agent-pods"
    assert binding["validationActions"] == ["Deny"]
    assert policy["failurePolicy"] == "Fail"
    (rule,) = policy["matchConstraints"]["resourceRules"]
    assert rule["resources"] == ["pods"] and set(rule["operations"]) == {"CREATE", "DELETE"}
    (condition,) = policy["matchConditions"]
    assert condition["expression"] == f"request.userInfo.username == '{AGENT_USER}'"
    checks = [" ".join(v["expression"].split()) for v in policy["validations"]]
    label = f"['{MANAGED_BY[0]}'] == '{MANAGED_BY[1]}'"
    delete = [c for c in checks if c.startswith("request.operation != 'DELETE' ||")]
    create = [c for c in checks if c.startswith("request.operation != 'CREATE' ||")]
    assert len(delete) + len(create) == len(checks), name
    assert any(f"oldObject.metadata.labels{label}" in c for c in delete), "DELETE: the label"
    assert any(
        "oldObject.spec.nodeName" in c
        and "oldObject.spec.affinity" in c
        and "request.userInfo.extra['authentication.kubernetes.io/node-name'][0]" in c
        for c in delete
    ), "DELETE: the agent's own node"
    assert any(f"object.metadata.labels{label}" in c for c in create), "CREATE: the label"
    assert not any("oldObject" in c for c in create)
    assert any("privileged" in c for c in create)
    assert any("hostPID" in c and "hostNetwork" in c and "hostIPC" in c for c in create)
    assert any(f"'{STATE_DIR}/'" in c and "hostPath" in c for c in create)
    # ... and the rest of the attempt pod's shape (evaluated below, with cel-python)
    for needed in (
        "'ALL' in c.securityContext.capabilities.drop",
        "c.securityContext.allowPrivilegeEscalation == false",
        "object.spec.securityContext.runAsNonRoot == true",
        "['RuntimeDefault', 'Localhost']",
        "object.spec.automountServiceAccountToken == false",
        "has(v.hostPath) || has(v.persistentVolumeClaim) || has(v.emptyDir)",
        "request.userInfo.extra['authentication.kubernetes.io/node-name'][0]",
        "ephemeralContainers",
    ):
        assert any(needed in c for c in create), f"{name}: no CREATE check has {needed}"


@pytest.mark.parametrize("component", ["scheduler", "server"])
def test_the_scheduler_and_the_api_server_have_no_kubernetes_api_access(
    built: tuple[str, tuple[dict[str, Any], ...]], component: str
) -> None:
    name, docs = built
    account_name = f"ebbtide-{component}"
    assert _bound_rules(docs, SYSTEM_NS, account_name) == [], name
    for binding in docs:
        if binding["kind"] in ("RoleBinding", "ClusterRoleBinding"):
            assert all(s.get("name") != account_name for s in binding.get("subjects") or []), (
                f"{name}: {binding['kind']} {binding['metadata']['name']} names {account_name}"
            )
    account = _one(docs, "ServiceAccount", account_name, SYSTEM_NS)
    assert account["automountServiceAccountToken"] is False
    spec = _pod_spec(_one(docs, "Deployment", account_name, SYSTEM_NS))
    assert spec["serviceAccountName"] == account_name
    assert spec["automountServiceAccountToken"] is False


# -- the workloads ---------------------------------------------------------------------


def test_every_container_has_resources_and_a_security_context(
    built: tuple[str, tuple[dict[str, Any], ...]],
) -> None:
    name, docs = built
    workloads = [d for d in docs if d["kind"] in WORKLOADS]
    assert len(workloads) >= 2
    for workload in workloads:
        spec = _pod_spec(workload)
        pod_security = spec.get("securityContext") or {}
        agent = workload is _agent(docs)
        for c in _containers(spec):
            where = f"{name}: {workload['kind']} {workload['metadata']['name']}/{c['name']}"
            requests = c.get("resources", {}).get("requests", {})
            limits = c.get("resources", {}).get("limits", {})
            assert {"cpu", "memory"} <= requests.keys(), f"{where}: requests"
            assert "memory" in limits, f"{where}: no memory limit"
            ctx = c.get("securityContext")
            assert ctx, f"{where}: no securityContext"
            assert ctx.get("allowPrivilegeEscalation") is False, where
            assert ctx.get("privileged", False) is False, where
            assert ctx.get("readOnlyRootFilesystem") is True, where
            assert "ALL" in ctx.get("capabilities", {}).get("drop", []), where
            non_root = ctx.get("runAsNonRoot", pod_security.get("runAsNonRoot"))
            if agent:
                assert ctx.get("runAsUser") == 0, f"{where}: the agent reads the host's /proc"
            else:
                assert non_root is True, f"{where}: runs as root"
                assert c.get("livenessProbe") or c.get("readinessProbe"), f"{where}: no probe"


def test_the_agent_runs_on_gpu_nodes_in_the_hosts_pid_namespace_with_the_state_directory(
    built: tuple[str, tuple[dict[str, Any], ...]],
) -> None:
    _, docs = built
    agent = _agent(docs)
    spec = _pod_spec(agent)
    assert spec["hostPID"] is True
    assert spec["nodeSelector"] == {"ebbtide.io/gpu-node": "true"}
    assert spec["runtimeClassName"] == "nvidia"
    assert spec["serviceAccountName"] == "ebbtide-agent"
    assert spec["terminationGracePeriodSeconds"] >= 60
    priority = spec["priorityClassName"]
    assert (
        priority == "system-node-critical"
        or _one(docs, "PriorityClass", priority)["value"] >= 1_000_000
    )
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec[
        "tolerations"
    ]
    assert agent["spec"]["updateStrategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxUnavailable": 1},
    }
    # a bad image stops the rollout: ready only once it serves its metrics, for a while
    assert agent["spec"]["minReadySeconds"] >= 10
    if priority != "system-node-critical":
        # installing the agent evicts no online pod from a full node
        assert _one(docs, "PriorityClass", priority)["preemptionPolicy"] == "Never"
    (state, cgroup) = [v for v in spec["volumes"] if "hostPath" in v]
    assert state["hostPath"] == {"path": STATE_DIR, "type": "DirectoryOrCreate"}
    assert cgroup["hostPath"] == {"path": CGROUP_DIR, "type": "Directory"}  # the freezer
    (container,) = spec["containers"]
    assert {"name": state["name"], "mountPath": STATE_DIR} in container["volumeMounts"]
    assert container["args"] == [
        "worker",
        "--node",
        "$(NODE_NAME)",
        "--headroom",
        "nvml",
        "--executor",
        "kubernetes",
        "--policy",
        POLICY_PATH,
        "--metrics-port",
        METRICS_PORT,
    ]
    _check_metrics(agent, container)
    for probe in ("startupProbe", "readinessProbe"):  # served once it claimed its name
        assert container[probe]["httpGet"] == {"path": "/metrics", "port": "metrics"}, probe
    liveness = container["livenessProbe"]
    assert liveness["httpGet"] == {"path": "/healthz", "port": "metrics"}  # its loop ticks
    assert liveness["periodSeconds"] * liveness["failureThreshold"] >= 60, "a restart evicts"
    env = {e["name"]: e for e in container["env"]}
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert env["EBBTIDE_HOME"]["value"] == STATE_DIR
    assert env["NVIDIA_VISIBLE_DEVICES"]["value"] == "all"
    assert env["NVIDIA_DRIVER_CAPABILITIES"]["value"] == "utility,compute"
    _check_store_env(env)
    _check_policy_mount(spec, container)
    assert container["securityContext"]["privileged"] is False


METRICS_PORT = "9108"


def _check_metrics(workload: dict[str, Any], container: dict[str, Any]) -> None:
    """Prometheus finds the metrics port by the pod's annotations and its named port."""
    annotations = workload["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == METRICS_PORT
    assert {"name": "metrics", "containerPort": int(METRICS_PORT)} in container["ports"]


def test_the_scheduler_runs_with_a_standby_and_a_disruption_budget(
    built: tuple[str, tuple[dict[str, Any], ...]],
) -> None:
    name, docs = built
    scheduler = _scheduler(docs)
    spec = _pod_spec(scheduler)
    (container,) = spec["containers"]
    assert container["args"] == [
        "scheduler",
        "--policy",
        POLICY_PATH,
        "--metrics-port",
        METRICS_PORT,
    ]
    _check_metrics(scheduler, container)
    _check_store_env({e["name"]: e for e in container["env"]})
    _check_policy_mount(spec, container)
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    # its loop goes round (a store outage is no reason to restart); the store answers it
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    replicas = scheduler["spec"]["replicas"]
    budget = _find(docs, "PodDisruptionBudget", "ebbtide-scheduler", SYSTEM_NS)
    if name == "dev":
        assert replicas == 1 and budget is None, "one scheduler: a budget would block drains"
    else:
        assert replicas == 2
        assert budget is not None and budget["spec"]["minAvailable"] == 1
        # two schedulers not ready in a store outage must not block the nodes' drains
        assert budget["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
        labels = scheduler["spec"]["template"]["metadata"]["labels"]
        assert budget["spec"]["selector"]["matchLabels"].items() <= labels.items()


def test_users_reach_the_api_server_with_a_token_over_tls(
    built: tuple[str, tuple[dict[str, Any], ...]],
) -> None:
    """``ebb server`` holds the store's URL so that users need not: two replicas behind
    a Service, TLS from the Secret ebbtide-server-tls (plain HTTP in ``dev`` alone), its
    probes asking for no token, and the image's user an admin so that ``kubectl exec``
    into the scheduler issues tokens."""
    name, docs = built
    server = _one(docs, "Deployment", "ebbtide-server", SYSTEM_NS)
    spec = _pod_spec(server)
    (container,) = spec["containers"]
    args = container["args"]
    assert args[:3] == ["server", "--listen", "0.0.0.0:8786"]
    assert args[-2:] == ["--metrics-port", METRICS_PORT]
    _check_metrics(server, container)
    env = {e["name"]: e for e in container["env"]}
    _check_store_env(env)
    assert env["EBBTIDE_POLICY"]["value"] == POLICY_PATH
    _check_policy_mount(spec, container)
    scheme = "HTTP" if name == "dev" else "HTTPS"
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        assert container[probe]["httpGet"] == {"path": path, "port": "api", "scheme": scheme}
    volumes = {v["name"]: v for v in spec["volumes"]}
    if name == "dev":
        assert "--tls-cert" not in args and "tls" not in volumes
    else:
        tls = "/etc/ebbtide-tls"
        assert args[3:7] == ["--tls-cert", f"{tls}/tls.crt", "--tls-key", f"{tls}/tls.key"]
        assert volumes["tls"]["secret"] == {"secretName": "ebbtide-server-tls"}
        assert {"name": "tls", "mountPath": tls, "readOnly": True} in container["volumeMounts"]
        assert server["spec"]["replicas"] == 2
    service = _one(docs, "Service", "ebbtide-server", SYSTEM_NS)["spec"]
    labels = server["spec"]["template"]["metadata"]["labels"]
    assert service["selector"].items() <= labels.items()
    assert service["ports"] == [{"name": "api", "port": 8786, "targetPort": "api"}]
    assert {"name": "api", "containerPort": 8786} in container["ports"]
    # the image's user (Dockerfile: useradd ... ebbtide) issues the tokens
    assert "ebbtide" in parse_policy(_policy_text(docs), "ebbtide-policy").admins
    dockerfile = " ".join((ROOT / "deploy" / "image" / "Dockerfile").read_text().split())
    assert re.search(r"useradd --uid 10001 [^&]* ebbtide &&", dockerfile.replace("\\ ", ""))


def _check_store_env(env: dict[str, dict[str, Any]]) -> None:
    for key in ("EBBTIDE_DB_URL", "EBBTIDE_REDIS_URL"):
        ref = env[key]["valueFrom"]["secretKeyRef"]
        assert ref == {"name": "ebbtide-store", "key": key}


def _check_policy_mount(spec: dict[str, Any], container: dict[str, Any]) -> None:
    (volume,) = [v for v in spec["volumes"] if "configMap" in v]
    assert volume["configMap"]["name"] == "ebbtide-policy"
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == volume["name"]]
    assert "subPath" not in mount, "a subPath mount never sees the ConfigMap change"
    assert f"{mount['mountPath']}/ebbtide.yaml" == POLICY_PATH


def test_the_offline_priority_class_preempts_nobody(
    built: tuple[str, tuple[dict[str, Any], ...]],
) -> None:
    _, docs = built
    offline = _one(docs, "PriorityClass", "ebbtide-offline")
    assert offline["value"] == -10
    assert offline["preemptionPolicy"] == "Never"
    assert offline["globalDefault"] is False


def test_only_the_dev_overlay_writes_the_store_secret(
    overlay: tuple[str, tuple[dict[str, Any], ...]],
) -> None:
    name, docs = overlay
    secret = _find(docs, "Secret", "ebbtide-store", SYSTEM_NS)
    if name != "dev":
        assert secret is None, f"{name}: `kubectl apply -k` would overwrite the real Secret"
        return
    assert secret is not None
    for key, url in secret["stringData"].items():
        host = re.match(r"\w+://(?:[^@/]*@)?([^:/]+):(\d+)", url)
        assert host, f"{key}: {url}"
        service, namespace = host.group(1).split(".")[:2]
        found = _one(docs, "Service", service, namespace)
        assert int(host.group(2)) in [p["port"] for p in found["spec"]["ports"]], url


def test_the_base_secret_is_an_obvious_placeholder(kubectl: str) -> None:
    secret = _one(_build(kubectl, "base"), "Secret", "ebbtide-store", SYSTEM_NS)
    assert set(secret["stringData"]) == {"EBBTIDE_DB_URL", "EBBTIDE_REDIS_URL"}
    for url in secret["stringData"].values():
        assert "REPLACE-ME" in url and ".invalid" in url


def test_every_ebbtide_container_runs_the_overlays_image(
    overlay: tuple[str, tuple[dict[str, Any], ...]],
) -> None:
    name, docs = overlay
    kustomization = yaml.safe_load((OVERLAYS / name / "kustomization.yaml").read_text())
    assert [i["name"] for i in kustomization["images"]] == [IMAGE], (
        f"{name}: `kustomize edit set image {IMAGE}=...` needs its images: entry"
    )
    for workload in (_agent(docs), _scheduler(docs)):
        for c in _containers(_pod_spec(workload)):
            assert c["image"] == f"{IMAGE}:0.1.0", (name, c["name"])


# -- the pods the executor makes fit the install ---------------------------------------


def test_an_attempt_pod_for_the_overlays_policy_fits_the_install(
    overlay: tuple[str, tuple[dict[str, Any], ...]],
) -> None:
    from ebbtide.kube.pods import PodRequest, pod_manifest
    from ebbtide.kube.profiles import Slice, grant_for

    name, docs = overlay
    policy = parse_policy(_policy_text(docs), f"{name}: ConfigMap ebbtide-policy")
    k8s = policy.kubernetes
    assert k8s is not None and k8s.image is not None
    request = PodRequest(
        job_id=7,
        attempt=1,
        owner="alice",
        queue="default",
        node="gpu-a",
        argv=["python", "/opt/ebbtide/examples/count.py", "100"],
        env={"EBBTIDE_JOB_ID": "7"},
        cwd=None,
        image=k8s.image,
        deadline_s=policy.deadline_for("default"),
        grant=grant_for(Slice(25.0, 0, 4096), k8s),
        profile=k8s.profile,
        device_uuids=("GPU-00000000-0000-0000-0000-000000000000",),
    )
    pod = pod_manifest(request, k8s)
    kubernetes_validate.validate(pod, K8S_VERSION, strict=True)
    meta, spec = pod["metadata"], pod["spec"]
    assert _find(docs, "Role", "ebbtide-agent", meta["namespace"]), "no Role where pods go"
    assert meta["labels"][MANAGED_BY[0]] == MANAGED_BY[1], "admission would refuse it"
    assert _find(docs, "PriorityClass", spec["priorityClassName"])
    assert not any(spec.get(k) for k in ("hostPID", "hostIPC", "hostNetwork"))
    assert not any(c.get("securityContext", {}).get("privileged") for c in _containers(spec))
    host_paths = {v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    agent_paths = {
        v["hostPath"]["path"] for v in _pod_spec(_agent(docs))["volumes"] if "hostPath" in v
    }
    assert agent_paths == {STATE_DIR, CGROUP_DIR}
    # the attempt's own directories, below the agent's: where admission lets pods mount
    assert host_paths and all(p.startswith(f"{STATE_DIR}/") for p in host_paths)
    if k8s.profile == "direct":
        assert spec["runtimeClassName"] == "nvidia"
    schedulers = {"hami": "hami-scheduler", "volcano": "volcano", "koordinator": "koord-scheduler"}
    assert spec.get("schedulerName") == schedulers.get(k8s.profile)


# -- the image -------------------------------------------------------------------------


def test_the_image_builds_the_wheel_on_slim_python_and_runs_ebb_as_a_user() -> None:
    dockerfile = (DEPLOY / "image" / "Dockerfile").read_text()
    lines = [line.strip() for line in dockerfile.splitlines() if not line.startswith("#")]
    stages = [line.split()[1] for line in lines if line.startswith("FROM ")]
    assert stages == ["python:3.11-slim", "python:3.11-slim"]
    assert any(line.startswith("RUN pip wheel") for line in lines)
    assert 'ENTRYPOINT ["ebb"]' in lines
    (user,) = [line.split()[1] for line in lines if line.startswith("USER ")]
    assert user.split(":")[0] not in ("0", "root")
    assert not any(line.startswith("HEALTHCHECK") for line in lines)
    # the build context keeps what `pip wheel .` needs
    ignore = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert ignore[0] == "*", "the context is an allow-list"
    for needed in ("pyproject.toml", "README.md", "src/", "examples/"):
        assert f"!{needed}" in ignore


# -- the admission policy, evaluated -----------------------------------------------------
#
# celpy (cel-python) evaluates the policy's CEL as the API server would, on the JSON of
# the request: the pods the executor renders for every overlay must pass, and each
# hostile variant of them must be refused.

OWN_NODE = "gpu-a"
NODE_NAME_EXTRA = "authentication.kubernetes.io/node-name"


def _agent_request(operation: str, node: str | None = OWN_NODE) -> dict[str, Any]:
    extra = {NODE_NAME_EXTRA: [node]} if node is not None else {}
    return {"operation": operation, "userInfo": {"username": AGENT_USER, "extra": extra}}


def _refusals(
    docs: tuple[dict[str, Any], ...],
    request: dict[str, Any],
    obj: dict[str, Any] | None,
    old: dict[str, Any] | None = None,
    policy_name: str = "ebbtide-agent-pods",
) -> list[str]:
    """The messages of every validation of the policy that refuses the request (a CEL
    error refuses too: the policy's failurePolicy is Fail)."""
    celpy = pytest.importorskip("celpy")
    policy = _one(docs, "ValidatingAdmissionPolicy", policy_name)["spec"]
    env = celpy.Environment()
    activation = {
        "request": celpy.json_to_cel(request),
        "object": celpy.json_to_cel(obj),
        "oldObject": celpy.json_to_cel(old),
    }
    for condition in policy.get("matchConditions", []):
        matched = env.program(env.compile(condition["expression"])).evaluate(activation)
        if matched is not True and not (isinstance(matched, celpy.celtypes.BoolType) and matched):
            return []
    refused = []
    for validation in policy["validations"]:
        result = env.program(env.compile(validation["expression"])).evaluate(activation)
        if not (isinstance(result, celpy.celtypes.BoolType) and bool(result)):
            refused.append(validation["message"])
    return refused


def _rendered_pods(docs: tuple[dict[str, Any], ...], name: str) -> list[dict[str, Any]]:
    """The attempt pods the executor makes under the overlay's policy: on a node share,
    on whole cards, and with a checkpoint claim."""
    from dataclasses import replace

    from ebbtide.kube.pods import PodRequest, pod_manifest
    from ebbtide.kube.profiles import ProfileError, Slice, grant_for

    policy = parse_policy(_policy_text(docs), f"{name}: ConfigMap ebbtide-policy")
    k8s = policy.kubernetes
    assert k8s is not None and k8s.image is not None
    pods = []
    for grant_slice, claim in (
        (Slice(25.0, 0, 4096), None),
        (Slice(100.0, 1, 81920), None),
        (Slice(25.0, 0, 4096), "ebbtide-checkpoints"),
    ):
        try:
            grant = grant_for(grant_slice, k8s)
        except ProfileError:  # mig gives no whole GPU
            continue
        request = PodRequest(
            job_id=7,
            attempt=1,
            owner="alice",
            queue="default",
            node=OWN_NODE,
            argv=["python", "/opt/ebbtide/examples/count.py", "100"],
            env={"EBBTIDE_JOB_ID": "7"},
            cwd="/tmp",
            image=k8s.image,
            deadline_s=policy.deadline_for("default"),
            grant=grant,
            profile=k8s.profile,
            device_uuids=("GPU-00000000-0000-0000-0000-000000000000",),
            checkpoint_claim=claim,
        )
        pods.append(pod_manifest(request, k8s))
    # ... and with no uid named (the image's user, runAsNonRoot still true)
    plain = k8s.model_copy(update={"run_as_user": None, "run_as_group": None})
    pods.append(pod_manifest(replace(request, checkpoint_claim=None), plain))
    return pods


def test_the_admission_policy_admits_every_pod_the_executor_makes(
    overlay: tuple[str, tuple[dict[str, Any], ...]],
) -> None:
    name, docs = overlay
    for pod in _rendered_pods(docs, name):
        assert _refusals(docs, _agent_request("CREATE"), pod) == [], (name, pod)
        assert _refusals(docs, _agent_request("DELETE"), None, old=pod) == [], name
        bound = _bound(pod, OWN_NODE)
        assert _refusals(docs, _agent_request("DELETE"), None, old=bound) == [], name


def _job(pod: dict[str, Any]) -> dict[str, Any]:
    return pod["spec"]["containers"][0]


def _init_container(pod: dict[str, Any], security: dict[str, Any]) -> None:
    init = {**_job(pod), "name": "init", "securityContext": security}
    pod["spec"]["initContainers"] = [init]


HOSTILE: dict[str, Any] = {
    "no managed-by label": lambda p: p["metadata"]["labels"].pop(MANAGED_BY[0]),
    "privileged": lambda p: _job(p)["securityContext"].update(privileged=True),
    "host PID": lambda p: p["spec"].update(hostPID=True),
    "host network": lambda p: p["spec"].update(hostNetwork=True),
    "adds SYS_ADMIN": lambda p: _job(p)["securityContext"]["capabilities"].update(
        add=["SYS_ADMIN"]
    ),
    "drops nothing": lambda p: _job(p)["securityContext"].pop("capabilities"),
    "drops less than ALL": lambda p: _job(p)["securityContext"].update(
        capabilities={"drop": ["NET_RAW"]}
    ),
    "no container security context": lambda p: _job(p).pop("securityContext"),
    "privilege escalation": lambda p: _job(p)["securityContext"].update(
        allowPrivilegeEscalation=True
    ),
    "privilege escalation unset": lambda p: _job(p)["securityContext"].pop(
        "allowPrivilegeEscalation"
    ),
    "pod uid 0": lambda p: p["spec"]["securityContext"].update(runAsUser=0),
    "container uid 0": lambda p: _job(p)["securityContext"].update(runAsUser=0),
    "pod runAsNonRoot false": lambda p: p["spec"]["securityContext"].update(runAsNonRoot=False),
    "pod runAsNonRoot unset": lambda p: p["spec"].pop("securityContext"),
    "container runAsNonRoot false": lambda p: _job(p)["securityContext"].update(runAsNonRoot=False),
    "seccomp Unconfined": lambda p: _job(p)["securityContext"].update(
        seccompProfile={"type": "Unconfined"}
    ),
    "seccomp unset": lambda p: _job(p)["securityContext"].pop("seccompProfile"),
    "AppArmor Unconfined": lambda p: _job(p)["securityContext"].update(
        appArmorProfile={"type": "Unconfined"}
    ),
    "pod AppArmor Unconfined": lambda p: p["spec"]["securityContext"].update(
        appArmorProfile={"type": "Unconfined"}
    ),
    "host port": lambda p: _job(p).update(ports=[{"containerPort": 22, "hostPort": 22}]),
    "service account token": lambda p: p["spec"].update(automountServiceAccountToken=True),
    "service account token by default": lambda p: p["spec"].pop("automountServiceAccountToken"),
    "Secret volume": lambda p: p["spec"]["volumes"].append(
        {"name": "s", "secret": {"secretName": "ebbtide-store"}}
    ),
    "projected token volume": lambda p: p["spec"]["volumes"].append(
        {"name": "t", "projected": {"sources": [{"serviceAccountToken": {"path": "t"}}]}}
    ),
    "hostPath /etc": lambda p: p["spec"]["volumes"].append(
        {"name": "h", "hostPath": {"path": "/etc"}}
    ),
    "hostPath out by ..": lambda p: p["spec"]["volumes"].append(
        {"name": "h", "hostPath": {"path": f"{STATE_DIR}/../../etc"}}
    ),
    "hostPath beside the state dir": lambda p: p["spec"]["volumes"].append(
        {"name": "h", "hostPath": {"path": f"{STATE_DIR}-x"}}
    ),
    "another node's nodeName": lambda p: p["spec"].update(nodeName="gpu-b"),
    "another node's affinity": lambda p: _pin(p, [_name_term("gpu-b")]),
    "a second affinity term": lambda p: _pin(p, [_name_term(OWN_NODE), _name_term("gpu-b")]),
    "two nodes in the term": lambda p: _pin(p, [_name_term(OWN_NODE, "gpu-b")]),
    "affinity by label only": lambda p: _pin(
        p,
        [
            {
                "matchExpressions": [
                    {"key": "kubernetes.io/hostname", "operator": "In", "values": [OWN_NODE]}
                ]
            }
        ],
    ),
    "no affinity": lambda p: p["spec"].pop("affinity"),
    "init container adds SYS_ADMIN": lambda p: _init_container(
        p,
        {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"], "add": ["SYS_ADMIN"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
    ),
    "init container as root": lambda p: _init_container(
        p, {**_job(p)["securityContext"], "runAsUser": 0}
    ),
    "init container unconfined": lambda p: _init_container(
        p, {**_job(p)["securityContext"], "seccompProfile": {"type": "Unconfined"}}
    ),
    "ephemeral container": lambda p: p["spec"].update(
        ephemeralContainers=[{"name": "debug", "image": "busybox"}]
    ),
}


def _name_term(*nodes: str) -> dict[str, Any]:
    return {"matchFields": [{"key": "metadata.name", "operator": "In", "values": list(nodes)}]}


def _pin(pod: dict[str, Any], terms: list[dict[str, Any]]) -> None:
    required = {"nodeSelectorTerms": terms}
    pod["spec"]["affinity"] = {
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required}
    }


@pytest.mark.parametrize("hostile", sorted(HOSTILE))
def test_the_admission_policy_refuses_a_hostile_pod(hostile: str, kubectl: str) -> None:
    import copy

    docs = _build(kubectl, "whole")
    for pod in _rendered_pods(docs, "whole"):
        pod = copy.deepcopy(pod)
        HOSTILE[hostile](pod)
        assert _refusals(docs, _agent_request("CREATE"), pod), f"{hostile}: admitted"


def test_the_admission_policy_refuses_a_token_without_a_node(kubectl: str) -> None:
    docs = _build(kubectl, "whole")
    (pod, *_) = _rendered_pods(docs, "whole")
    assert _refusals(docs, _agent_request("CREATE", node=None), pod)
    assert _refusals(docs, _agent_request("CREATE", node="gpu-b"), pod)


def test_the_admission_policy_refuses_deleting_other_pods_and_ignores_other_users(
    kubectl: str,
) -> None:
    docs = _build(kubectl, "whole")
    (pod, *_) = _rendered_pods(docs, "whole")
    foreign = {"metadata": {"name": "online", "labels": {"app": "online"}}, "spec": {}}
    assert _refusals(docs, _agent_request("DELETE"), None, old=foreign)
    someone = {"operation": "CREATE", "userInfo": {"username": "alice", "extra": {}}}
    hostile = {**pod, "spec": {**pod["spec"], "hostPID": True}}
    assert _refusals(docs, someone, hostile) == []


def _bound(pod: dict[str, Any], node: str) -> dict[str, Any]:
    """``pod`` as stored once the scheduler bound it to ``node``."""
    return {**pod, "spec": {**pod["spec"], "nodeName": node}}


#: Deletes of an ebbtide pod on another node than the requesting agent's (the executor's
#: pods name OWN_NODE in their node affinity).
HOSTILE_DELETES: dict[str, Any] = {
    "bound to another node": lambda p: _bound(p, "gpu-b"),
    "pending, pinned to another node": lambda p: _repinned(p, [_name_term("gpu-b")]),
    "pending, pinned to ours or another": lambda p: _repinned(
        p, [_name_term(OWN_NODE), _name_term("gpu-b")]
    ),
    "pending, two nodes in the term": lambda p: _repinned(p, [_name_term(OWN_NODE, "gpu-b")]),
    "pending, not pinned": lambda p: {
        **p,
        "spec": {k: v for k, v in p["spec"].items() if k != "affinity"},
    },
    "pending, nodeName empty, not pinned": lambda p: {
        **p,
        "spec": {**{k: v for k, v in p["spec"].items() if k != "affinity"}, "nodeName": ""},
    },
}


def _repinned(pod: dict[str, Any], terms: list[dict[str, Any]]) -> dict[str, Any]:
    import copy

    pod = copy.deepcopy(pod)
    _pin(pod, terms)
    return pod


@pytest.mark.parametrize("hostile", sorted(HOSTILE_DELETES))
def test_the_admission_policy_refuses_deleting_another_nodes_pod(
    hostile: str, kubectl: str
) -> None:
    docs = _build(kubectl, "whole")
    for pod in _rendered_pods(docs, "whole"):
        old = HOSTILE_DELETES[hostile](pod)
        refusals = _refusals(docs, _agent_request("DELETE"), None, old=old)
        assert any("its own node" in r for r in refusals), f"{hostile}: admitted"
        # ... which that node's agent may delete
        if hostile.startswith("bound") or hostile == "pending, pinned to another node":
            mine = _agent_request("DELETE", node="gpu-b")
            assert _refusals(docs, mine, None, old=old) == [], hostile


def test_the_admission_policy_refuses_deletes_by_a_token_without_a_node(kubectl: str) -> None:
    docs = _build(kubectl, "whole")
    (pod, *_) = _rendered_pods(docs, "whole")
    for old in (pod, _bound(pod, OWN_NODE)):
        assert _refusals(docs, _agent_request("DELETE", node=None), None, old=old)


def test_only_direct_may_patch_node_status_and_only_its_own_nodes(
    built: tuple[str, tuple[dict[str, Any], ...]],
) -> None:
    name, docs = built
    policy = _find(docs, "ValidatingAdmissionPolicy", "ebbtide-agent-node-status")
    if name != "direct":
        assert policy is None, name
        return
    assert policy is not None
    (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
    assert rule["resources"] == ["nodes/status"] and rule["operations"] == ["UPDATE"]
    binding = _one(docs, "ValidatingAdmissionPolicyBinding", "ebbtide-agent-node-status")
    assert binding["spec"]["validationActions"] == ["Deny"]
    node = {"metadata": {"name": OWN_NODE}, "status": {}}
    other = {"metadata": {"name": "gpu-b"}, "status": {}}
    refusals = functools.partial(_refusals, docs, policy_name="ebbtide-agent-node-status")
    assert refusals(_agent_request("UPDATE"), node, old=node) == []
    assert refusals(_agent_request("UPDATE"), other, old=other)
    assert refusals(_agent_request("UPDATE", node=None), node, old=node)


#: What a stopping agent needs beside the deadline: the journal hand-over, in seconds.
HANDOVER_S = 30


def test_every_queue_caps_deadlines_below_the_agents_grace(
    overlay: tuple[str, tuple[dict[str, Any], ...]],
) -> None:
    name, docs = overlay
    policy = parse_policy(_policy_text(docs), f"{name}: ConfigMap ebbtide-policy")
    grace = _pod_spec(_agent(docs))["terminationGracePeriodSeconds"]
    for queue, config in policy.queues.items():
        assert config.max_deadline_s is not None, f"{name}: queue {queue} has no max_deadline_s"
        assert config.max_deadline_s + HANDOVER_S <= grace, f"{name}: queue {queue}"
        assert policy.deadline_for(queue) <= config.max_deadline_s


# -- the network -----------------------------------------------------------------------
#
# NetworkPolicy ingress into ebbtide-system, evaluated as a network plugin that enforces it
# would (for the matchLabels selectors and numbered ports the install uses): attempt pods
# reach nothing there, ebbtide's own pods reach each other, Prometheus only the metrics.

STORE_CLIENT_LABEL = ("ebbtide.io/store-client", "true")
METRICS_SCRAPER_LABEL = ("ebbtide.io/metrics-scraper", "true")
API_CLIENT_LABEL = ("ebbtide.io/api-client", "true")


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    assert set(selector) <= {"matchLabels"}, f"not evaluated here: {selector}"
    return bool(selector.get("matchLabels", {}).items() <= labels.items())


def _namespace_labels(docs: tuple[dict[str, Any], ...], namespace: str) -> dict[str, str]:
    """A namespace's labels, with the one the API server sets on every namespace."""
    found = _find(docs, "Namespace", namespace)
    labels = dict((found or {}).get("metadata", {}).get("labels") or {})
    return {**labels, "kubernetes.io/metadata.name": namespace}


def _ingress_admits(
    docs: tuple[dict[str, Any], ...],
    source: tuple[str, dict[str, str], dict[str, str]],
    target: tuple[str, dict[str, str]],
    port: int,
) -> bool:
    """Whether a TCP connection from ``source`` (namespace, its labels, the pod's labels)
    to port ``port`` of ``target`` (namespace, the pod's labels) passes ingress policy."""
    src_ns, src_ns_labels, src_labels = source
    dst_ns, dst_labels = target
    policies = [
        p["spec"]
        for p in _all(docs, "NetworkPolicy")
        if p["metadata"]["namespace"] == dst_ns
        and "Ingress" in p["spec"].get("policyTypes", ["Ingress"])
        and _selects(p["spec"]["podSelector"], dst_labels)
    ]
    if not policies:
        return True
    for rule in (r for p in policies for r in p.get("ingress") or []):
        ports = rule.get("ports")
        if ports and not any(
            x.get("protocol", "TCP") == "TCP" and x.get("port", port) == port for x in ports
        ):
            continue
        if "from" not in rule:
            return True
        for peer in rule["from"]:
            assert "ipBlock" not in peer, "an ipBlock may admit the attempt pods' addresses"
            if "namespaceSelector" in peer:
                in_namespace = _selects(peer["namespaceSelector"], src_ns_labels)
            else:
                in_namespace = src_ns == dst_ns
            if in_namespace and _selects(peer.get("podSelector", {}), src_labels):
                return True
    return False


def _system_pods(docs: tuple[dict[str, Any], ...]) -> list[tuple[str, dict[str, str], list[int]]]:
    """Every workload of ebbtide-system: its name, its pods' labels, their ports."""
    pods = []
    for workload in docs:
        if workload["kind"] not in WORKLOADS or workload["metadata"]["namespace"] != SYSTEM_NS:
            continue
        labels = workload["spec"]["template"]["metadata"]["labels"]
        ports = [
            p["containerPort"] for c in _containers(_pod_spec(workload)) for p in c.get("ports", [])
        ]
        pods.append((workload["metadata"]["name"], labels, ports))
    return pods


def test_attempt_pods_reach_nothing_in_the_system_namespace(
    overlay: tuple[str, tuple[dict[str, Any], ...]],
) -> None:
    name, docs = overlay
    system = _system_pods(docs)
    assert {"ebbtide-scheduler", "ebbtide-agent"} <= {n for n, _, _ in system}
    if name == "dev":
        assert {"ebbtide-postgres", "ebbtide-redis"} <= {n for n, _, _ in system}
    jobs_ns = _namespace_labels(docs, JOBS_NS)
    for pod in _rendered_pods(docs, name):
        source = (JOBS_NS, jobs_ns, pod["metadata"]["labels"])
        for target, labels, ports in system:
            for port in ports:
                assert not _ingress_admits(docs, source, (SYSTEM_NS, labels), port), (
                    f"{name}: an attempt pod reaches {target}:{port}"
                )


def test_ebbtides_own_pods_and_prometheus_still_reach_what_they_need(
    overlay: tuple[str, tuple[dict[str, Any], ...]],
) -> None:
    name, docs = overlay
    system = _system_pods(docs)
    own_ns = _namespace_labels(docs, SYSTEM_NS)
    monitoring = {"kubernetes.io/metadata.name": "monitoring"}
    scraper = {**monitoring, METRICS_SCRAPER_LABEL[0]: METRICS_SCRAPER_LABEL[1]}
    client = {"kubernetes.io/metadata.name": "research", STORE_CLIENT_LABEL[0]: "true"}
    prometheus = {"app.kubernetes.io/name": "prometheus"}
    for _, source_labels, _ in system:  # the scheduler and the agents reach the store
        for target, labels, ports in system:
            for port in ports:
                source = (SYSTEM_NS, own_ns, source_labels)
                assert _ingress_admits(docs, source, (SYSTEM_NS, labels), port), (name, target)
    for target, labels, ports in system:
        for port in ports:
            metrics = port == int(METRICS_PORT)
            admitted = _ingress_admits(
                docs, ("monitoring", scraper, prometheus), (SYSTEM_NS, labels), port
            )
            assert admitted == metrics, f"{name}: Prometheus and {target}:{port}"
            unlabelled = ("monitoring", monitoring, prometheus)
            assert not _ingress_admits(docs, unlabelled, (SYSTEM_NS, labels), port)
            source = ("research", client, {})
            assert _ingress_admits(docs, source, (SYSTEM_NS, labels), port), (name, target)
            # users' namespaces (or the Ingress controller's) reach the API server only
            api = ("users", {API_CLIENT_LABEL[0]: API_CLIENT_LABEL[1]}, {})
            admitted = _ingress_admits(docs, api, (SYSTEM_NS, labels), port)
            assert admitted == (target == "ebbtide-server" and port == 8786), (name, target, port)


def test_the_network_policy_isolates_the_system_namespace_for_ingress_only(
    built: tuple[str, tuple[dict[str, Any], ...]],
) -> None:
    name, docs = built
    policy = _one(docs, "NetworkPolicy", "ebbtide-system-ingress", SYSTEM_NS)["spec"]
    assert policy["podSelector"] == {}, "every pod of ebbtide-system"
    assert policy["policyTypes"] == ["Ingress"], "egress (the API server, the store) stays open"
    assert all("from" in rule and rule["from"] for rule in policy["ingress"]), name
    # no policy isolates the attempt pods: jobs keep DNS, registries and other services
    assert not [p for p in _all(docs, "NetworkPolicy") if p["metadata"]["namespace"] == JOBS_NS]
    jobs_ns = _namespace_labels(docs, JOBS_NS)
    for key, value in (STORE_CLIENT_LABEL, METRICS_SCRAPER_LABEL):
        assert jobs_ns.get(key) != value, f"{name}: {JOBS_NS} is labelled {key}"
