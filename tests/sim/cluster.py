# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""A Kubernetes control plane for the simulated fleet (a test fixture).

Real etcd, kube-apiserver, kube-controller-manager and kube-scheduler, built from the
Go modules pinned in tests/sim/controlplane (see its build.sh), plus kwok standing in
for the kubelets: it keeps the Node objects Ready and brings pods scheduled on them
(DaemonSet pods included) to Running without running any container.

The Prometheus operator's ServiceMonitor and PrometheusRule CRDs are installed too
(from its published Go module), as a cluster with a Prometheus operator has them.
Everything listens on 127.0.0.1 only. Certificates, keys and the etcd data are made
per cluster under .cache/cluster and removed by `down`; the admin kubeconfig is
.cache/cluster/kubeconfig. Each process's pid is kept in .cache/cluster/pids, and
`down` stops exactly those processes.

Used by `tests/sim/fleet.py cluster | cluster-down` (`make cluster | cluster-down`)
and by the tests.
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import fcntl
import ipaddress
import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

SIM_DIR = Path(__file__).resolve().parent
PROJECT = SIM_DIR.parent.parent
BUILD_SCRIPT = SIM_DIR / "controlplane" / "build.sh"
BUILD_MODULE = SIM_DIR / "controlplane"
CLUSTER_DIR = Path(os.environ.get("GPUFLEET_CACHE", PROJECT / ".cache")) / "cluster"
KUBECONFIG = CLUSTER_DIR / "kubeconfig"
# Held by whoever uses the test control plane from start to stop (a test module, a
# molecule scenario), so that suites run side by side take turns with it:
# `flock .cache/cluster.lock ...` in the Makefile, exclusive() in Python.
LOCK_FILE = CLUSTER_DIR.parent / "cluster.lock"

# Ports on 127.0.0.1, away from the usual ones so that a real cluster on the same
# machine is not disturbed; GPUFLEET_CLUSTER_PORT moves the API server.
API_PORT = int(os.environ.get("GPUFLEET_CLUSTER_PORT", "16443"))
ETCD_PORT, ETCD_PEER_PORT = 12379, 12380
CONTROLLER_MANAGER_PORT, SCHEDULER_PORT = 16257, 16259
SERVICE_CIDR = "10.96.0.0/16"
# Nodes registered here carry this annotation; kwok manages those and no others.
FAKE_NODE_ANNOTATION = ("kwok.x-k8s.io/node", "fake")
# The Stage definitions kwok runs with (node heartbeat and pod lifecycle), read from
# the kwok module that the binaries were built from.
KWOK_STAGES = (
    "kustomize/stage/node/fast/node-initialize.yaml",
    "kustomize/stage/node/heartbeat-with-lease/node-heartbeat-with-lease.yaml",
    "kustomize/stage/pod/fast/pod-ready.yaml",
    "kustomize/stage/pod/fast/pod-complete.yaml",
    "kustomize/stage/pod/fast/pod-delete.yaml",
)
START_TIMEOUT = 90.0
# The Prometheus operator's ServiceMonitor CRD, installed so that the cluster side's
# `k8s_manifests_service_monitor: auto` finds it: taken from the operator's published
# Go module at this version, held to this module hash (go.sum's h1: form).
PROMETHEUS_OPERATOR = (
    "github.com/prometheus-operator/prometheus-operator",
    "v0.85.0",
    "h1:M5xLCLEoaW2IJfnuCwFzzpL+jSVQu3KGT84Pye+fW8s=",
)
# Its ServiceMonitor and PrometheusRule CRDs: the kinds the cluster side applies when
# they exist (k8s_manifests_service_monitor, k8s_manifests_alert_rules: auto).
OPERATOR_CRDS = {
    "servicemonitors.monitoring.coreos.com": (
        "example/prometheus-operator-crd/monitoring.coreos.com_servicemonitors.yaml"
    ),
    "prometheusrules.monitoring.coreos.com": (
        "example/prometheus-operator-crd/monitoring.coreos.com_prometheusrules.yaml"
    ),
}


class ClusterError(RuntimeError):
    pass


@dataclass(frozen=True)
class Component:
    name: str
    argv: list[str]
    # https://127.0.0.1:PORT/PATH that answers "ok" when the component is serving.
    health: str


# --- binaries ---------------------------------------------------------------------


def build() -> Path:
    """Build the control plane (or find it in the cache); the directory of its binaries."""
    result = subprocess.run(
        ["bash", str(BUILD_SCRIPT)], stdout=subprocess.PIPE, text=True, check=False
    )
    if result.returncode != 0:
        raise ClusterError(f"building the control plane failed ({result.returncode})")
    return Path(result.stdout.strip().splitlines()[-1])


def kwok_stages() -> str:
    """kwok's own Stage definitions, from the module its binary was built from."""
    env = {**os.environ, "GOFLAGS": "-mod=readonly", "GOSUMDB": "off", "GOTOOLCHAIN": "local"}
    listed = subprocess.run(
        ["go", "mod", "download", "-json", "sigs.k8s.io/kwok"],
        cwd=BUILD_MODULE,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if listed.returncode != 0:
        raise ClusterError(f"cannot find the kwok module: {listed.stderr.strip()}")
    module = Path(json.loads(listed.stdout)["Dir"])
    return "\n---\n".join((module / stage).read_text() for stage in KWOK_STAGES)


def operator_crds() -> str:
    """The Prometheus operator's CRDs (OPERATOR_CRDS) from its module, hash checked."""
    module, version, digest = PROMETHEUS_OPERATOR
    env = {**os.environ, "GOFLAGS": "-mod=mod", "GOSUMDB": "off", "GOTOOLCHAIN": "local"}
    listed = subprocess.run(
        ["go", "mod", "download", "-json", f"{module}@{version}"],
        cwd="/",  # outside any Go module
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if listed.returncode != 0:
        raise ClusterError(f"cannot download {module}@{version}: {listed.stderr.strip()}")
    info = json.loads(listed.stdout)
    if info.get("Sum") != digest:
        raise ClusterError(f"{module}@{version} has hash {info.get('Sum')}, expected {digest}")
    return "\n---\n".join((Path(info["Dir"]) / crd).read_text() for crd in OPERATOR_CRDS.values())


# --- certificates -----------------------------------------------------------------


def _pki(directory: Path) -> None:
    """A CA, the API server's serving certificate, client certificates for each
    component and the admin, and the service-account signing key: made once per
    cluster."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec, rsa
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    if (directory / "ca.crt").exists():
        return
    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)

    def name(common: str, org: str | None = None) -> x509.Name:
        parts = [x509.NameAttribute(NameOID.COMMON_NAME, common)]
        if org:
            parts.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
        return x509.Name(parts)

    def write_key(path: Path, key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> None:
        path.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        path.chmod(0o600)

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = name("gpufleet-test-cluster-ca")

    def certificate(
        subject: x509.Name, key: ec.EllipticCurvePrivateKey, ca: bool
    ) -> x509.CertificateBuilder:
        """Signed by the cluster's CA, valid for 30 days."""
        return (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(ca_name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=30))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )

    ca = (
        certificate(ca_name, ca_key, ca=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    (directory / "ca.crt").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    write_key(directory / "ca.key", ca_key)

    def issue(
        stem: str, subject: x509.Name, usage: x509.ObjectIdentifier, sans: list[x509.GeneralName]
    ) -> None:
        key = ec.generate_private_key(ec.SECP256R1())
        builder = certificate(subject, key, ca=False).add_extension(
            x509.ExtendedKeyUsage([usage]), critical=False
        )
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = builder.sign(ca_key, hashes.SHA256())
        (directory / f"{stem}.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        write_key(directory / f"{stem}.key", key)

    service_ip = next(ipaddress.ip_network(SERVICE_CIDR).hosts())
    issue(
        "apiserver",
        name("kube-apiserver"),
        ExtendedKeyUsageOID.SERVER_AUTH,
        [
            x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
            x509.IPAddress(service_ip),
            x509.DNSName("localhost"),
            *(
                x509.DNSName(n)
                for n in (
                    "kubernetes",
                    "kubernetes.default",
                    "kubernetes.default.svc",
                    "kubernetes.default.svc.cluster.local",
                )
            ),
        ],
    )
    # The identities Kubernetes' default RBAC grants each component's permissions to.
    clients = {
        "admin": name("gpufleet-test-admin", "system:masters"),
        "kube-controller-manager": name("system:kube-controller-manager"),
        "kube-scheduler": name("system:kube-scheduler"),
        "kwok": name("kwok-controller", "system:masters"),
    }
    for stem, subject in clients.items():
        issue(stem, subject, ExtendedKeyUsageOID.CLIENT_AUTH, [])
    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    write_key(directory / "sa.key", sa_key)
    (directory / "sa.pub").write_bytes(
        sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )


def _kubeconfig(path: Path, pki: Path, user: str) -> None:
    def data(file: str) -> str:
        return base64.b64encode((pki / file).read_bytes()).decode()

    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "gpufleet-test",
                "cluster": {
                    "server": f"https://127.0.0.1:{API_PORT}",
                    "certificate-authority-data": data("ca.crt"),
                },
            }
        ],
        "users": [
            {
                "name": user,
                "user": {
                    "client-certificate-data": data(f"{user}.crt"),
                    "client-key-data": data(f"{user}.key"),
                },
            }
        ],
        "contexts": [
            {"name": "gpufleet-test", "context": {"cluster": "gpufleet-test", "user": user}}
        ],
        "current-context": "gpufleet-test",
    }
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(config, indent=2))
    tmp.chmod(0o600)
    tmp.replace(path)


# --- processes --------------------------------------------------------------------


def _serving(name: str, port: int) -> list[str]:
    """What the controller manager and the scheduler share: 127.0.0.1 only, and one
    kubeconfig (their own identity) for the API and for checking their callers."""
    kubeconfig = CLUSTER_DIR / f"{name}.kubeconfig"
    return [
        "--bind-address=127.0.0.1",
        f"--secure-port={port}",
        f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        "--leader-elect=false",
        f"--cert-dir={CLUSTER_DIR / (name + '-certs')}",
    ]


def components(bin_dir: Path) -> list[Component]:
    d, pki = CLUSTER_DIR, CLUSTER_DIR / "pki"
    return [
        Component(
            "etcd",
            [
                str(bin_dir / "etcd"),
                "--name=gpufleet-test",
                f"--data-dir={d / 'etcd'}",
                f"--listen-client-urls=http://127.0.0.1:{ETCD_PORT}",
                f"--advertise-client-urls=http://127.0.0.1:{ETCD_PORT}",
                f"--listen-peer-urls=http://127.0.0.1:{ETCD_PEER_PORT}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{ETCD_PEER_PORT}",
                f"--initial-cluster=gpufleet-test=http://127.0.0.1:{ETCD_PEER_PORT}",
                "--unsafe-no-fsync",
            ],
            f"http://127.0.0.1:{ETCD_PORT}/health",
        ),
        Component(
            "kube-apiserver",
            [
                str(bin_dir / "kube-apiserver"),
                "--bind-address=127.0.0.1",
                f"--secure-port={API_PORT}",
                f"--etcd-servers=http://127.0.0.1:{ETCD_PORT}",
                f"--client-ca-file={pki / 'ca.crt'}",
                f"--tls-cert-file={pki / 'apiserver.crt'}",
                f"--tls-private-key-file={pki / 'apiserver.key'}",
                f"--service-account-key-file={pki / 'sa.pub'}",
                f"--service-account-signing-key-file={pki / 'sa.key'}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--authorization-mode=Node,RBAC",
                "--allow-privileged=true",
                f"--cert-dir={d / 'apiserver-certs'}",
            ],
            f"https://127.0.0.1:{API_PORT}/readyz",
        ),
        Component(
            "kube-controller-manager",
            [
                str(bin_dir / "kube-controller-manager"),
                *_serving("kube-controller-manager", CONTROLLER_MANAGER_PORT),
                f"--service-account-private-key-file={pki / 'sa.key'}",
                f"--root-ca-file={pki / 'ca.crt'}",
                f"--cluster-signing-cert-file={pki / 'ca.crt'}",
                f"--cluster-signing-key-file={pki / 'ca.key'}",
                "--use-service-account-credentials=true",
            ],
            f"https://127.0.0.1:{CONTROLLER_MANAGER_PORT}/healthz",
        ),
        Component(
            "kube-scheduler",
            [
                str(bin_dir / "kube-scheduler"),
                *_serving("kube-scheduler", SCHEDULER_PORT),
            ],
            f"https://127.0.0.1:{SCHEDULER_PORT}/healthz",
        ),
        Component(
            "kwok",
            [
                str(bin_dir / "kwok"),
                f"--kubeconfig={d / 'kwok.kubeconfig'}",
                f"--config={d / 'kwok-stages.yaml'}",
                "--manage-all-nodes=false",
                "--manage-nodes-with-annotation-selector={}={}".format(*FAKE_NODE_ANNOTATION),
                "--node-lease-duration-seconds=40",
                "--node-ip=127.0.0.1",
            ],
            "",
        ),
    ]


def _pid_file(name: str) -> Path:
    return CLUSTER_DIR / "pids" / f"{name}.pid"


def _running_pid(name: str, binary: str | None = None) -> int | None:
    """The pid recorded for a component, if that process is still the component."""
    try:
        pid = int(_pid_file(name).read_text().strip())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except (OSError, ValueError):
        return None
    program = cmdline[0].decode(errors="replace") if cmdline else ""
    if Path(program).name != name or (binary is not None and program != binary):
        return None
    return pid


def _healthy(url: str, timeout: float = 2.0) -> bool:
    context = ssl.create_default_context(cafile=str(CLUSTER_DIR / "pki" / "ca.crt"))
    if url.startswith("https://127.0.0.1:" + str(API_PORT)):
        context.load_cert_chain(
            CLUSTER_DIR / "pki" / "admin.crt", CLUSTER_DIR / "pki" / "admin.key"
        )
    else:
        # The controller manager and scheduler serve a self-signed certificate of their
        # own; their health endpoints need no client identity.
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    try:
        with urllib.request.urlopen(url, timeout=timeout, context=context) as response:
            return bool(response.status == 200)
    except (OSError, urllib.error.URLError):
        return False


def _start(component: Component) -> subprocess.Popen[bytes]:
    log_dir = CLUSTER_DIR / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    _pid_file(component.name).parent.mkdir(parents=True, exist_ok=True)
    with (log_dir / f"{component.name}.log").open("ab") as log:
        process = subprocess.Popen(
            component.argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=CLUSTER_DIR,
            start_new_session=True,
        )
    _pid_file(component.name).write_text(f"{process.pid}\n")
    return process


def _wait_healthy(component: Component, process: subprocess.Popen[bytes] | None) -> None:
    """Until the component answers; `process` is the one just started, if any.

    A recorded process that is still there may be on its way out (kube-apiserver
    takes up to a minute to shut down after SIGTERM, holding its port): once it is
    gone, a new one is started.
    """
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            log = CLUSTER_DIR / "logs" / f"{component.name}.log"
            tail = "".join(log.read_text(errors="replace").splitlines(keepends=True)[-15:])
            raise ClusterError(f"{component.name} exited; end of {log}:\n{tail}")
        if process is None and _running_pid(component.name, component.argv[0]) is None:
            process = _start(component)
        if not component.health or _healthy(component.health):
            return
        time.sleep(0.5)
    raise ClusterError(f"{component.name} did not become healthy in {START_TIMEOUT:.0f}s")


def kubectl(bin_dir: Path, *args: str, stdin: str | None = None) -> str:
    result = subprocess.run(
        [str(bin_dir / "kubectl"), f"--kubeconfig={KUBECONFIG}", *args],
        input=stdin,
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise ClusterError(f"kubectl {' '.join(args[:2])} failed: {result.stderr.strip()}")
    return result.stdout


def wait_for(bin_dir: Path, condition: str, *objects: str, timeout: float = 60.0) -> None:
    """`kubectl wait --for=condition=CONDITION` on OBJECTS, asked again while an object
    has no conditions yet: kubectl gives up at once ("accessor error") on an object
    whose status.conditions is still empty, as a CRD or a Node just created can be."""
    deadline = time.monotonic() + timeout
    while True:
        left = max(1, int(deadline - time.monotonic()))
        try:
            kubectl(bin_dir, "wait", f"--for=condition={condition}", f"--timeout={left}s", *objects)
            return
        except ClusterError as error:
            if "accessor error" not in str(error) or time.monotonic() >= deadline:
                raise
            time.sleep(0.5)


# --- the verbs --------------------------------------------------------------------


@contextlib.contextmanager
def exclusive() -> Iterator[None]:
    """Hold the test control plane for the block (waits while another user holds it)."""
    LOCK_FILE.parent.mkdir(parents=True, exist_ok=True)
    with LOCK_FILE.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def up(node_names: Iterable[str]) -> Path:
    """Start (or keep) the control plane and register NODE_NAMES as Nodes; the
    admin kubeconfig's path."""
    bin_dir = build()
    CLUSTER_DIR.mkdir(parents=True, exist_ok=True)
    pki = CLUSTER_DIR / "pki"
    _pki(pki)
    _kubeconfig(KUBECONFIG, pki, "admin")
    for user in ("kube-controller-manager", "kube-scheduler", "kwok"):
        _kubeconfig(CLUSTER_DIR / f"{user}.kubeconfig", pki, user)
    stages = CLUSTER_DIR / "kwok-stages.yaml"
    stages.write_text(kwok_stages())
    for component in components(bin_dir):
        running = _running_pid(component.name, component.argv[0]) is not None
        _wait_healthy(component, None if running else _start(component))
    kubectl(bin_dir, "apply", "--server-side", "-f", "-", stdin=operator_crds())
    for crd in OPERATOR_CRDS:
        wait_for(bin_dir, "Established", f"crd/{crd}")
    register_nodes(bin_dir, node_names)
    return KUBECONFIG


def register_nodes(bin_dir: Path, names: Iterable[str]) -> None:
    """One Node per name, as a kubelet would register it; fixture Nodes whose
    simulated node is gone are removed."""
    wanted = sorted(set(names))
    key, value = FAKE_NODE_ANNOTATION
    existing = json.loads(kubectl(bin_dir, "get", "nodes", "-o", "json"))["items"]
    for node in existing:
        annotations = node["metadata"].get("annotations") or {}
        if annotations.get(key) == value and node["metadata"]["name"] not in wanted:
            kubectl(bin_dir, "delete", "node", node["metadata"]["name"])
    present = {n["metadata"]["name"] for n in existing}
    for name in wanted:
        if name in present:
            continue
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "annotations": {key: value},
                "labels": {
                    "kubernetes.io/hostname": name,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                    "type": "kwok",
                },
            },
        }
        kubectl(bin_dir, "create", "-f", "-", stdin=json.dumps(node))
    if wanted:
        wait_for(bin_dir, "Ready", *(f"node/{n}" for n in wanted))


def down() -> list[str]:
    """Stop every process this fixture started (by pid) and forget the cluster."""
    stopped = []
    for name in ("kwok", "kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd"):
        pid = _running_pid(name)
        if pid is None:
            continue
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and _running_pid(name) == pid:
            time.sleep(0.2)
        if _running_pid(name) == pid:
            os.kill(pid, signal.SIGKILL)
        stopped.append(name)
    shutil.rmtree(CLUSTER_DIR, ignore_errors=True)
    return stopped


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        if args[:1] == ["up"]:
            print(up(args[1:]))
        elif args[:1] == ["down"]:
            down()
        else:
            print("usage: cluster.py up [NODE ...] | down", file=sys.stderr)
            return 2
    except ClusterError as exc:
        print(f"cluster: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
