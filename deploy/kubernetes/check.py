"""Checks deploy/kubernetes offline, as far as a machine without a cluster can (check.sh runs
this in its own virtualenv, see requirements.txt).

1. kustomization.yaml lists every manifest of this folder and only files that exist.
2. Every manifest validates against the Kubernetes OpenAPI schemas (kubernetes-validate,
   strict: unknown fields fail) of the oldest and newest versions named below; the Prometheus
   Operator's ServiceMonitor and PrometheusRule against models generated from their CRDs, with
   unknown fields failing too.
3. The manifests agree with each other, with the image (deploy/container/Containerfile) and
   with the relay's config: selectors, ports, Secret keys, the image's name, tag and user, the
   schema `migrate` creates, the grace period against the relay's drain, and
   prometheusrule.yaml against deploy/prometheus/outbox-alerts.yml (generated from it:
   `check.sh --write` regenerates it).
4. A black-box run: the initContainer's command (three at once, as three pods start it),
   `outbox doctor` with the relay's settings, then the relay container's command, each with the
   Deployment's exact arguments and environment and the ConfigMap's relay.toml at the path the
   volume mounts it, on `outbox` ($OUTBOX_BIN). The Secret's database URL becomes a SQLite file
   and its broker URL a webhook receiver run here (no shared service needed); both listen
   addresses keep the file's host with a free port. Then: the probes' paths answer 200 on the
   probe port, /metrics has `outbox_` series, the metrics listener answers on every address
   and the dashboard's only on loopback, the Secret's read token guards the API, an event
   written to the outbox reaches the receiver, and SIGTERM stops the relay with exit 0 within
   the grace period.

Usage: python check.py OUTBOX_BIN [--write]
"""

from __future__ import annotations

import http.server
import json
import os
import random
import re
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import kubernetes_validate
import yaml
from cloudcoil.models.prometheus_operator.v1 import PrometheusRule, ServiceMonitor

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
ALERTS = ROOT / "deploy/prometheus/outbox-alerts.yml"
CONTAINERFILE = ROOT / "deploy/container/Containerfile"
RULES = HERE / "prometheusrule.yaml"

# The oldest Kubernetes the manifests are meant for (PodDisruptionBudget's
# unhealthyPodEvictionPolicy and topologySpreadConstraints' matchLabelKeys are on by default
# from 1.27) and the newest the validator bundles.
KUBERNETES_VERSIONS = ["1.29.0", "1.37.0"]

# Custom resources: the models generated from the Prometheus Operator's CRDs.
CUSTOM = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"): ServiceMonitor,
    ("monitoring.coreos.com/v1", "PrometheusRule"): PrometheusRule,
}

# What the relay needs beyond the manifests to stop within the grace period (see the
# Deployment's comment on terminationGracePeriodSeconds): its background tasks' 5 s, and the
# 5 s it waits past statement_timeout for a statement's answer.
UPKEEP_STOP_S = 5
ANSWER_MARGIN_S = 5

# How long each wait of the black-box run may take.
DEADLINE_S = 45


def fail(message: str) -> None:
    raise SystemExit(f"FAIL: {message}")


def check(condition: bool, message: str) -> None:
    if not condition:
        fail(message)


def load(name: str) -> dict:
    docs = [d for d in yaml.safe_load_all((HERE / name).read_text()) if d is not None]
    check(len(docs) == 1, f"{name}: expected one document, found {len(docs)}")
    return docs[0]


def seconds(text: str) -> float:
    """A humantime duration as the relay's config writes them ("30s", "2ms", "1m", "1h")."""
    total = 0.0
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
    parts = re.findall(r"(\d+)\s*(ms|s|m|h|d)", text)
    check(parts and "".join(n + u for n, u in parts) == text.replace(" ", ""),
          f"unreadable duration {text!r}")
    for number, unit in parts:
        total += int(number) * units[unit]
    return total


# 1. The kustomization ------------------------------------------------------------------------

def check_kustomization() -> list[str]:
    """The resources it lists: every *.yaml here but itself and the *.example.yaml files
    (applied by hand: see kustomization.yaml), each once, each existing."""
    kustomization = load("kustomization.yaml")
    listed = kustomization.get("resources") or []
    check(len(listed) == len(set(listed)), f"kustomization.yaml lists a file twice: {listed}")
    missing = [name for name in listed if not (HERE / name).is_file()]
    check(not missing, f"kustomization.yaml lists files that do not exist: {missing}")
    manifests = {
        p.name for p in HERE.glob("*.y*ml")
        if p.name != "kustomization.yaml" and not p.name.endswith(".example.yaml")
    }
    unlisted = sorted(manifests - set(listed))
    check(not unlisted, f"kustomization.yaml does not list {unlisted}")
    print(f"ok: kustomization.yaml lists all {len(listed)} manifests: {', '.join(listed)}")
    return listed


# 2. Schemas -----------------------------------------------------------------------------------

def ignored_fields(given, kept, path: str = "") -> list[str]:
    """Fields of `given` a model dropped on the way through: unknown to the CRD."""
    out = []
    if isinstance(given, dict):
        for key, value in given.items():
            if not isinstance(kept, dict) or key not in kept:
                out.append(f"{path}/{key}")
            else:
                out += ignored_fields(value, kept[key], f"{path}/{key}")
    elif isinstance(given, list):
        for i, (a, b) in enumerate(zip(given, kept)):
            out += ignored_fields(a, b, f"{path}[{i}]")
    return out


def validate(name: str, doc: dict) -> str:
    """Validates one manifest; returns what it was validated against."""
    key = (doc.get("apiVersion"), doc.get("kind"))
    if key in CUSTOM:
        try:
            model = CUSTOM[key].model_validate(doc)
        except Exception as error:  # pydantic's ValidationError, with every field named
            fail(f"{name}: {error}")
        kept = model.model_dump(by_alias=True, exclude_unset=True, mode="json")
        unknown = ignored_fields(doc, kept)
        check(not unknown, f"{name}: fields unknown to the {key[1]} CRD: {unknown}")
        return "the CRD's schema"
    for version in KUBERNETES_VERSIONS:
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.SchemaNotFoundError:
            fail(f"{name}: no schema for {key} in Kubernetes {version}")
        except kubernetes_validate.ValidationError as error:
            fail(f"{name}: invalid for Kubernetes {version}: {str(error).splitlines()[0]}")
    return f"Kubernetes {' and '.join(KUBERNETES_VERSIONS)} (strict)"


def check_schemas(names: list[str]) -> None:
    for name in names:
        print(f"ok: {name} valid against {validate(name, load(name))}")
    # The validators catch a mistake (strict mode really rejects an unknown field).
    broken = load("deployment.yaml")
    broken["spec"]["template"]["spec"]["containers"][0]["livenesProbes"] = {}
    try:
        kubernetes_validate.validate(broken, KUBERNETES_VERSIONS[-1], strict=True)
        fail("kubernetes-validate accepted a misspelt field")
    except kubernetes_validate.ValidationError:
        pass
    broken = load("servicemonitor.yaml")
    broken["spec"]["endpoints"][0]["intervall"] = "30s"
    kept = ServiceMonitor.model_validate(broken).model_dump(
        by_alias=True, exclude_unset=True, mode="json")
    check(ignored_fields(broken, kept) == ["/spec/endpoints[0]/intervall"],
          "the CRD check missed a misspelt field")
    print("ok: both validators reject a misspelt field")


# 3. Agreement ---------------------------------------------------------------------------------

def rules_text() -> str:
    """prometheusrule.yaml as generated from deploy/prometheus/outbox-alerts.yml: its groups,
    comments included, under `spec:`."""
    header = (
        "# GENERATED from deploy/prometheus/outbox-alerts.yml by `deploy/kubernetes/check.sh "
        "--write`:\n"
        "# edit that file and regenerate; check.sh fails when the two differ. Needs the\n"
        "# Prometheus Operator (monitoring.coreos.com/v1); without it, load that file as a rule\n"
        "# file instead (docs/deploy.md).\n"
        "apiVersion: monitoring.coreos.com/v1\n"
        "kind: PrometheusRule\n"
        "metadata:\n"
        "  name: outbox-relay\n"
        "  labels:\n"
        "    app.kubernetes.io/name: outbox-relay\n"
        "    app.kubernetes.io/part-of: outbox\n"
        "    app.kubernetes.io/component: relay\n"
        "spec:\n"
    )
    body = "".join(
        ("  " + line) if line.strip() else "\n"
        for line in ALERTS.read_text().splitlines(keepends=True)
    )
    return header + body


def write_rules() -> None:
    RULES.write_text(rules_text())
    print(f"wrote {RULES.relative_to(ROOT)}")


def check_rules() -> None:
    check(RULES.read_text() == rules_text(),
          f"{RULES.name} differs from what {ALERTS.relative_to(ROOT)} generates: run "
          "`bash deploy/kubernetes/check.sh --write`")
    check(load(RULES.name)["spec"] == yaml.safe_load(ALERTS.read_text()),
          f"{RULES.name}'s spec is not {ALERTS.name}")
    groups = load(RULES.name)["spec"]["groups"]
    alerts = sum(len(g["rules"]) for g in groups)
    print(f"ok: {RULES.name} is generated from {ALERTS.name} ({alerts} alerts)")


def matches(selector: dict, labels: dict) -> bool:
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())


def container(pod: dict, name: str, init: bool = False) -> dict:
    found = [c for c in pod["initContainers" if init else "containers"] if c["name"] == name]
    check(len(found) == 1, f"deployment.yaml: no single container named {name}")
    return found[0]


def port_number(c: dict, port) -> int:
    """A probe's or Service's port: a number, or the name of one of the container's ports."""
    if isinstance(port, int):
        return port
    found = [p["containerPort"] for p in c.get("ports", []) if p["name"] == port]
    check(len(found) == 1, f"container {c['name']} has no port named {port}")
    return found[0]


def host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def cargo_version() -> str:
    text = (ROOT / "Cargo.toml").read_text()
    section = text.split("[workspace.package]", 1)[1]
    return re.search(r'^version\s*=\s*"([^"]+)"', section, re.M).group(1)


def check_agreement() -> dict:
    deployment = load("deployment.yaml")
    pod_template = deployment["spec"]["template"]
    pod = pod_template["spec"]
    pod_labels = pod_template["metadata"]["labels"]
    relay = container(pod, "relay")
    migrate = container(pod, "migrate", init=True)
    configmap = load("configmap.yaml")
    secret = load("secret.example.yaml")
    service = load("service.yaml")
    monitor = load("servicemonitor.yaml")
    budget = load("poddisruptionbudget.yaml")
    config = tomllib.loads(configmap["data"]["relay.toml"])

    # Selectors pick the relay's pods, the Service's port is the relay's metrics port, and
    # the ServiceMonitor scrapes that Service's port.
    check(matches(deployment["spec"]["selector"], pod_labels),
          "the Deployment's selector does not match its pods")
    check(service["spec"]["selector"].items() <= pod_labels.items(),
          "the Service does not select the relay's pods")
    check(matches(budget["spec"]["selector"], pod_labels),
          "the PodDisruptionBudget does not select the relay's pods")
    check(budget["spec"].get("maxUnavailable") == 1, "the PodDisruptionBudget: maxUnavailable 1")
    check(matches(monitor["spec"]["selector"], service["metadata"]["labels"]),
          "the ServiceMonitor does not select the metrics Service")
    service_ports = {p["name"]: p for p in service["spec"]["ports"]}
    for endpoint in monitor["spec"]["endpoints"]:
        check(endpoint["port"] in service_ports,
              f"the ServiceMonitor scrapes port {endpoint['port']}, not one of the Service's")
    check(service["spec"].get("publishNotReadyAddresses") is True,
          "the metrics Service must publish not-ready relays (their outbox_unready is scraped)")

    # The probes and the Service reach metrics_listen; `listen` stays on loopback.
    metrics_host, metrics_port = host_port(config["metrics_listen"])
    admin_host, admin_port = host_port(config.get("listen", "127.0.0.1:9187"))
    check(metrics_host in ("0.0.0.0", "::"),
          f"metrics_listen {config['metrics_listen']}: the kubelet and Prometheus need every "
          "address of the pod")
    check(admin_host in ("127.0.0.1", "::1"),
          f"listen {config['listen']}: the dashboard and its API must stay on loopback")
    probes = {kind: relay[kind]["httpGet"]
              for kind in ("startupProbe", "livenessProbe", "readinessProbe")}
    for kind, probe in probes.items():
        check(port_number(relay, probe["port"]) == metrics_port,
              f"{kind} does not use metrics_listen's port {metrics_port}")
    check(probes["livenessProbe"]["path"] == "/healthz",
          "the liveness probe must be /healthz (see the Deployment's comment)")
    check(probes["readinessProbe"]["path"] == "/readyz", "the readiness probe must be /readyz")
    for port in service_ports.values():
        check(port_number(relay, port["targetPort"]) == metrics_port,
              f"the Service's port {port['name']} does not reach metrics_listen")
    check(admin_port not in [p["containerPort"] for p in relay.get("ports", [])],
          "the dashboard's port must not be a container port")

    # The Secret's keys are the ones the Deployment reads, and its values are placeholders.
    refs = [e["valueFrom"]["secretKeyRef"] for c in (relay, migrate) for e in c.get("env", [])
            if "secretKeyRef" in e.get("valueFrom", {})]
    values = secret["stringData"]
    for ref in refs:
        check(ref["name"] == secret["metadata"]["name"],
              f"the Deployment reads Secret {ref['name']}, the example is "
              f"{secret['metadata']['name']}")
        check(ref["key"] in values, f"the example Secret has no {ref['key']}")
    unused = set(values) - {r["key"] for r in refs}
    check(not unused, f"the example Secret has keys nothing reads: {unused}")
    for key, value in values.items():
        check("CHANGE-ME" in value or ".example." in value,
              f"secret.example.yaml: {key} does not look like a placeholder")

    # The image: the kustomization's `images` names the containers' image, the tag is this
    # workspace's version, and the image runs `outbox` as the uid the pod runs as.
    kustomization = load("kustomization.yaml")
    (image,) = kustomization["images"]
    for c in (relay, migrate):
        name, _, tag = c["image"].rpartition(":")
        check(name == image["name"], f"{c['name']}'s image {name} is not {image['name']}")
        check(tag == image["newTag"], f"{c['name']}'s tag {tag} is not {image['newTag']}")
    check(image["newTag"] == cargo_version(),
          f"the image tag {image['newTag']} is not the workspace's version {cargo_version()}")
    security = pod["securityContext"]
    check(security.get("runAsNonRoot") is True and security.get("runAsUser") == 10001,
          "the pod must run as non-root uid 10001")
    check(security.get("seccompProfile", {}).get("type") == "RuntimeDefault",
          "seccompProfile RuntimeDefault")
    for c in (relay, migrate):
        s = c["securityContext"]
        check(s.get("readOnlyRootFilesystem") is True and s.get("allowPrivilegeEscalation") is False
              and s.get("capabilities", {}).get("drop") == ["ALL"],
              f"{c['name']}: read-only root, no privilege escalation, every capability dropped")
        check({"requests", "limits"} <= c.get("resources", {}).keys(),
              f"{c['name']}: requests and limits")
    text = CONTAINERFILE.read_text()
    entrypoints = re.findall(r"^ENTRYPOINT\s+(.+)$", text, re.M)
    check(entrypoints and json.loads(entrypoints[-1]) == ["outbox"],
          f"{CONTAINERFILE.name}: the Deployment's args assume ENTRYPOINT [\"outbox\"]")
    users = re.findall(r"^USER\s+(\S+)", text, re.M)
    check(users and users[-1].split(":")[0] == str(security["runAsUser"]),
          f"{CONTAINERFILE.name}: USER {users} is not the pod's uid {security['runAsUser']}")
    print(f"ok: the Deployment runs {CONTAINERFILE.relative_to(ROOT)}'s entrypoint as its user "
          f"{security['runAsUser']}")

    # `migrate` creates the outbox the relay reads.
    def flag(args: list[str], name: str, default: str) -> str:
        return args[args.index(name) + 1] if name in args else default
    relay_settings = config.get("relay", {})
    for key, default in (("schema", "outbox"), ("table", "events")):
        created = flag(migrate["args"], f"--{key}", default)
        read = relay_settings.get(key, default)
        check(created == read, f"migrate creates {key} {created}, the relay reads {read}")

    # The grace period covers the relay's drain with this config (docs/configuration.md defaults otherwise).
    publish = seconds(relay_settings.get("publish_timeout", "30s"))
    statement = seconds(relay_settings.get("statement_timeout", "30s")) + ANSWER_MARGIN_S
    drain = publish + statement + UPKEEP_STOP_S + statement
    grace = pod["terminationGracePeriodSeconds"]
    check(grace >= drain, f"terminationGracePeriodSeconds {grace} < the relay's drain bound "
                          f"{drain:.0f}s (publish, mark, background tasks, release)")
    print(f"ok: the manifests agree (selectors, ports, Secret keys, image {image['name']}:"
          f"{image['newTag']}, schema); grace {grace}s covers a drain of at most {drain:.0f}s")
    return {"deployment": deployment, "configmap": configmap, "secret": secret, "config": config}


# 4. The black-box run -------------------------------------------------------------------------

class Receiver(http.server.BaseHTTPRequestHandler):
    """The webhook the relay publishes to: records each request's path and body, answers 204."""

    received: list[tuple[str, bytes]] = []

    def do_POST(self):  # noqa: N802 (the standard library's name)
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        Receiver.received.append((self.path, body))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args):
        pass


def free_port() -> int:
    """A port above 20000 (below the ephemeral range) free on every address."""
    for _ in range(100):
        port = random.randrange(20000, 32000)
        with socket.socket() as s:
            try:
                s.bind(("0.0.0.0", port))
                return port
            except OSError:
                continue
    fail("no free port")


def get(url: str, token: str | None = None) -> tuple[int, str]:
    request = urllib.request.Request(url)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def until(what: str, probe, deadline_s: float = DEADLINE_S, relay=None):
    """Polls `probe` until it returns a true value, or fails naming `what`."""
    deadline = time.monotonic() + deadline_s
    last = None
    while time.monotonic() < deadline:
        if relay is not None and relay.poll() is not None:
            fail(f"the relay exited with {relay.returncode} while waiting for {what}")
        try:
            result = probe()
            if result:
                return result
            last = result
        except OSError as error:
            last = error
        time.sleep(0.1)
    fail(f"timed out after {deadline_s}s waiting for {what} (last: {last!r})")


def listening(port: int) -> list[str]:
    """The local addresses of sockets listening on `port` (/proc/net/tcp and tcp6)."""
    out = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                address, port_hex = fields[1].split(":")
                if fields[3] == "0A" and int(port_hex, 16) == port:  # 0A: LISTEN
                    raw = bytes.fromhex(address)
                    if len(raw) == 4:
                        out.append(socket.inet_ntop(socket.AF_INET, raw[::-1]))
                    else:
                        words = b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))
                        out.append(socket.inet_ntop(socket.AF_INET6, words))
    return out


def environment(c: dict, secret: dict, overrides: dict) -> dict:
    """The container's environment as the kubelet builds it from the Secret, then the run's
    substitutions (each must replace a variable the container has)."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    for entry in c.get("env", []):
        if "value" in entry:
            env[entry["name"]] = entry["value"]
            continue
        ref = entry["valueFrom"]["secretKeyRef"]
        if ref["key"] in secret["stringData"]:
            env[entry["name"]] = secret["stringData"][ref["key"]]
        else:
            check(ref.get("optional", False), f"{c['name']}: {ref['key']} missing, not optional")
    for name, value in overrides.items():
        check(name in env or name.endswith("LISTEN"),
              f"{c['name']} has no {name} to substitute")
        env[name] = value
    return env


def mounted_args(c: dict, pod: dict, configmap: dict, root: Path) -> list[str]:
    """The container's args with each path under a ConfigMap volume moved under `root`, where
    that ConfigMap's files are written (as the kubelet mounts them)."""
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    args = list(c["args"])
    for mount in c.get("volumeMounts", []):
        volume = volumes[mount["name"]]
        check(volume.get("configMap", {}).get("name") == configmap["metadata"]["name"],
              f"volume {mount['name']} is not the ConfigMap {configmap['metadata']['name']}")
        check(mount.get("readOnly") is True, f"{mount['mountPath']} must be mounted read-only")
        target = root / mount["mountPath"].lstrip("/")
        target.mkdir(parents=True, exist_ok=True)
        for key, text in configmap["data"].items():
            (target / key).write_text(text)
        for i, arg in enumerate(args):
            if arg.startswith(mount["mountPath"] + "/"):
                check((root / arg.lstrip("/")).is_file(),
                      f"{arg}: the ConfigMap has no such key")
                args[i] = str(root / arg.lstrip("/"))
    check(args != c["args"], f"{c['name']}: no argument names a file of the ConfigMap")
    return args


def black_box(binary: str, parts: dict) -> None:
    deployment, configmap, secret, config = (
        parts["deployment"], parts["configmap"], parts["secret"], parts["config"])
    pod = deployment["spec"]["template"]["spec"]
    relay_c = container(pod, "relay")
    migrate_c = container(pod, "migrate", init=True)
    tmp = Path(tempfile.mkdtemp(prefix="outbox-k8s-check-"))
    receiver = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    database = tmp / "outbox.db"
    metrics_host, _ = host_port(config["metrics_listen"])
    admin_host, _ = host_port(config.get("listen", "127.0.0.1:9187"))
    metrics_port, admin_port = free_port(), free_port()
    while admin_port == metrics_port:
        admin_port = free_port()
    substitutes = {
        "OUTBOX_DATABASE_URL": f"sqlite://{database}",
        "OUTBOX_BROKER_URL": f"http://127.0.0.1:{receiver.server_address[1]}/{{destination}}",
    }
    relay = None
    try:
        # The initContainer, as three pods would start it: at once, each must exit 0.
        env = environment(migrate_c, secret,
                          {"OUTBOX_DATABASE_URL": substitutes["OUTBOX_DATABASE_URL"]})
        migrations = [subprocess.Popen([binary, *migrate_c["args"]], env=env, cwd=tmp,
                                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
                      for _ in range(3)]
        for m in migrations:
            out, _ = m.communicate(timeout=DEADLINE_S)
            check(m.returncode == 0, f"`outbox {' '.join(migrate_c['args'])}` exited "
                                     f"{m.returncode}: {out.decode()}")
        print(f"ok: the initContainer `outbox {' '.join(migrate_c['args'])}` exits 0 from three "
              "processes at once")

        # The relay, with the Deployment's args (the ConfigMap's file) and environment; only
        # the listen ports move (the file's hosts are kept) so that nothing here collides.
        args = mounted_args(relay_c, pod, configmap, tmp)
        env = environment(relay_c, secret, {
            **substitutes,
            "OUTBOX_METRICS_LISTEN": f"{metrics_host}:{metrics_port}",
            "OUTBOX_LISTEN": f"{admin_host}:{admin_port}",
        })

        # `outbox doctor` with the same settings (as docs/deploy.md has operators run it in a
        # relay's container) passes every check: config, database, broker.
        check(args[0] == "relay", f"the relay container runs `outbox {args[0]}`, not relay")
        doctor_args = ["doctor", *args[1:]]
        doctor = subprocess.run([binary, *doctor_args], env=env, cwd=tmp, capture_output=True,
                                timeout=DEADLINE_S, text=True)
        check(doctor.returncode == 0, f"`outbox doctor` on the Deployment's settings exited "
                                      f"{doctor.returncode}:\n{doctor.stdout}{doctor.stderr}")
        print(f"ok: `outbox doctor {' '.join(relay_c['args'][1:])}` passes: "
              f"{doctor.stdout.strip().splitlines()[-1]}")
        log = open(tmp / "relay.log", "wb")
        relay = subprocess.Popen([binary, *args], env=env, cwd=tmp, stdout=log,
                                 stderr=subprocess.STDOUT)
        probe_url = f"http://127.0.0.1:{metrics_port}"
        for kind in ("startupProbe", "livenessProbe", "readinessProbe"):
            path = relay_c[kind]["httpGet"]["path"]
            until(f"{kind} {path} to answer 200",
                  lambda: get(probe_url + path)[0] == 200, relay=relay)
            print(f"ok: {kind} {path} answers 200 on the probe port")
        status, text = get(probe_url + "/metrics")
        series = [line for line in text.splitlines() if line.startswith("outbox_")]
        check(status == 200 and series, f"/metrics: {status}, no outbox_ series: {text[:300]}")
        check("outbox_ready 1" in series, f"/metrics: outbox_ready is not 1: {series[:20]}")
        print(f"ok: /metrics answers {len(series)} outbox_ samples, outbox_ready 1")

        # Bound addresses: 127.0.0.2 is loopback too, but reaches only a socket bound to every
        # address, not one bound to 127.0.0.1; no traffic leaves the machine.
        check(get(f"http://127.0.0.2:{metrics_port}/healthz")[0] == 200,
              "the metrics listener does not answer on another address than 127.0.0.1")
        try:
            socket.create_connection(("127.0.0.2", admin_port), timeout=2).close()
            fail(f"the dashboard answers on 127.0.0.2:{admin_port}: it is not loopback-only")
        except ConnectionRefusedError:
            pass
        check(listening(admin_port) == [admin_host],
              f"the dashboard listens on {listening(admin_port)}, not {admin_host} only")
        check(listening(metrics_port) == [metrics_host],
              f"the metrics listener listens on {listening(metrics_port)}, not {metrics_host}")
        print(f"ok: the metrics listener is bound to {metrics_host}, the dashboard to "
              f"{admin_host} only (refused on 127.0.0.2)")

        # The Secret's read token reaches the relay: the API refuses reads without it.
        read_token = env.get("OUTBOX_READ_TOKEN")
        check(bool(read_token), "the relay gets no OUTBOX_READ_TOKEN from the Secret")
        api = f"http://127.0.0.1:{admin_port}/api/status"
        status, _ = get(api)
        check(status == 401, f"/api/status without a token: {status}, expected 401")
        status, _ = get(api, read_token)
        check(status == 200, f"/api/status with the Secret's read token: {status}")
        print("ok: the dashboard's API refuses reads without the Secret's read token (401) and "
              "answers with it")

        # An event written to the outbox reaches the broker the Secret names.
        tables = config.get("relay", {})
        table = f"{tables.get('schema', 'outbox')}_{tables.get('table', 'events')}"
        payload = json.dumps({"order_id": 42, "check": str(uuid.uuid4())}).encode()
        with sqlite3.connect(database, timeout=30) as db:
            db.execute(
                f"INSERT INTO {table} (event_id, aggregate_type, aggregate_id, "
                "aggregate_version, event_type, payload) VALUES (?, 'order', '42', 1, "
                "'OrderPlaced', ?)", (str(uuid.uuid4()), payload))
        path = until("the event at the webhook",
                     lambda: next((p for p, b in Receiver.received if b == payload), None),
                     relay=relay)
        print(f"ok: an event written to {table} reached the broker URL ({path})")

        # Memory: the peak so far, against the container's limit.
        status_text = Path(f"/proc/{relay.pid}/status").read_text()
        peak_kib = int(re.search(r"VmHWM:\s+(\d+) kB", status_text).group(1))
        limit = relay_c["resources"]["limits"]["memory"]
        check(limit.endswith("Mi"), f"memory limit {limit}: expected Mi")
        check(peak_kib < int(limit[:-2]) * 1024,
              f"the relay's peak memory {peak_kib} KiB exceeds the limit {limit}")

        # SIGTERM, as the kubelet stops the pod: exit 0 within the grace period.
        relay.send_signal(signal.SIGTERM)
        started = time.monotonic()
        code = relay.wait(timeout=pod["terminationGracePeriodSeconds"])
        took = time.monotonic() - started
        relay = None
        check(code == 0, f"the relay exited {code} on SIGTERM")
        print(f"ok: SIGTERM stops the relay with exit 0 in {took:.1f}s "
              f"(grace {pod['terminationGracePeriodSeconds']}s); peak memory "
              f"{peak_kib // 1024} MiB (limit {limit})")
    except BaseException:
        log_file = tmp / "relay.log"
        if log_file.exists():
            print("relay log (last 40 lines):\n" + "\n".join(
                log_file.read_text(errors="replace").splitlines()[-40:]), file=sys.stderr)
        raise
    finally:
        if relay is not None and relay.poll() is None:
            relay.kill()
            relay.wait()
        receiver.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    args = sys.argv[1:]
    if "--write" in args:
        write_rules()
        return
    check(len(args) == 1, __doc__.splitlines()[-1])
    binary = args[0]
    listed = check_kustomization()
    check_schemas(listed + sorted(p.name for p in HERE.glob("*.example.yaml")))
    check_rules()
    parts = check_agreement()
    black_box(binary, parts)


if __name__ == "__main__":
    main()
