"""A real Kueue for the tests, built from its Go module and run against the sandbox.

Like the control plane (`lmeval_sandbox.build`) and Prometheus, Kueue is
compiled from its published Go module (`deploy/sandbox/kueue`, v0.15.x, which
matches the Kubernetes pin) and cached outside the clone, keyed by the module
files, the link flags and the Go version; ``LMEVAL_KUEUE_BIN`` may name a
directory that already holds a ``kueue`` binary and its ``crds``/``webhook``
manifests. Kueue's CRDs and webhook configurations come from the module's own
``config/components``.

`KueueServer` runs the manager as a process on loopback:

* its Configuration enables only what the tests use: the ``batch/job``
  integration (Kueue's default; nothing here makes Jobs) and LMEvalJob as an
  *external framework* (the poller creates and owns its Workloads), no leader
  election, no visibility server, no metrics server;
* its webhooks (Kueue's own resources, and the conversion of the CRDs it
  serves in two versions) listen on 127.0.0.1 and are registered with the
  apiserver by URL. Kueue's internal certificate management stays on (with
  it off, Kueue insists on metrics certificates under /etc): its rotator
  keeps the CA and serving certificate it finds in its Secret when they are
  valid, so the Secret and the certificate directory are filled beforehand
  with a certificate for 127.0.0.1 (`lmeval_sandbox.pki.make_webhook_pki`),
  and the rotator then injects that CA into the webhook configurations and
  CRDs itself;
* it runs with the sandbox's admin identity.
"""

from __future__ import annotations

import base64
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from lmeval_sandbox import build
from lmeval_sandbox.components import free_port
from lmeval_sandbox.controlplane import ControlPlane
from lmeval_sandbox.pki import make_webhook_pki
from lmeval_sandbox.supervise import Supervisor, http_ok, terminate
from poller import api

__all__ = [
    "EXTERNAL_FRAMEWORK",
    "KUEUE_MODULE",
    "KUEUE_NAMESPACE",
    "KueueError",
    "KueueServer",
    "ensure_kueue",
    "kueue_version",
]

KUEUE_MODULE = build.MODULES_DIR / "kueue"
_UPSTREAM = "sigs.k8s.io/kueue"
KUEUE_NAMESPACE = "kueue-system"
_SERVICE = "kueue-webhook-service"
_SECRET = "kueue-webhook-server-cert"  # noqa: S105 (a name)
# Kueue's name for a framework another controller runs: Kind.version.group.
EXTERNAL_FRAMEWORK = f"{api.KIND}.{api.API_VERSION}.{api.API_GROUP}"
# The CRDs Kueue serves in two versions (v1beta1 stored, v1beta2 its own):
# the apiserver converts through Kueue's /convert webhook.
_CONVERTED = (
    "localqueues.kueue.x-k8s.io",
    "clusterqueues.kueue.x-k8s.io",
    "workloads.kueue.x-k8s.io",
    "cohorts.kueue.x-k8s.io",
    "multikueueclusters.kueue.x-k8s.io",
)


class KueueError(RuntimeError):
    """Kueue could not be built or started."""


def kueue_version() -> str:
    return build._required_version(KUEUE_MODULE, _UPSTREAM)


def _ldflags() -> str:
    prefix = "sigs.k8s.io/kueue/pkg/version"
    return f"-s -w -X {prefix}.GitVersion={kueue_version()}"


def _build_key() -> str:
    return build.module_build_key((KUEUE_MODULE,), (_ldflags(),))


def _complete(directory: Path) -> bool:
    return (directory / "kueue").is_file() and (directory / "webhook.yaml").is_file()


def _build_steps(staging: Path, log: Path) -> None:
    build._run_go(["build", "-ldflags", _ldflags(), "-o", f"{staging}/", "tool"], KUEUE_MODULE, log)
    module = build.go_module_dir(_UPSTREAM, kueue_version(), KUEUE_MODULE, log, KueueError)
    components = module / "config" / "components"
    shutil.copytree(components / "crd" / "bases", staging / "crds")
    shutil.copyfile(components / "webhook" / "manifests.yaml", staging / "webhook.yaml")
    for path in [staging, *staging.rglob("*")]:
        path.chmod(0o755 if path.is_dir() or path.name == "kueue" else 0o644)


def _build(target: Path) -> float:
    return build.staged_build(
        target,
        "Kueue",
        _build_steps,
        lambda staging: "" if _complete(staging) else "kueue",
        {"kueue": kueue_version()},
        KueueError,
    )


def needs_build() -> bool:
    """Whether `ensure_kueue` would build (setup.sh says so before a long build)."""
    return not os.environ.get("LMEVAL_KUEUE_BIN") and not _complete(
        build.cache_root() / f"kueue-{_build_key()}"
    )


def ensure_kueue() -> Path:
    """A directory holding ``kueue``, ``crds/`` and ``webhook.yaml``; built at most once."""
    override = os.environ.get("LMEVAL_KUEUE_BIN")
    if override:
        directory = Path(override)
        if not _complete(directory):
            raise KueueError(f"LMEVAL_KUEUE_BIN={override} lacks kueue or webhook.yaml")
        return directory
    target = build.cache_root() / f"kueue-{_build_key()}"
    if _complete(target):
        return target
    with build._locked(build.cache_root() / "kueue-build.lock"):
        if _complete(target):
            return target
        elapsed = _build(target)
        print(f"Kueue built in {elapsed:.0f} s (cold)", file=sys.stderr)
    return target


def _b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


class KueueServer:
    """Kueue's manager against `plane`, its webhooks on 127.0.0.1."""

    def __init__(self, plane: ControlPlane, workdir: Path) -> None:
        self.plane = plane
        self.workdir = workdir.resolve()
        self.webhook_port = 0
        self.health_port = 0
        self.startup_seconds = 0.0
        self._supervisor = Supervisor(
            self.workdir, self.workdir / "logs", die_with_parent=True, error=KueueError
        )

    def configuration(self) -> dict[str, Any]:
        """Kueue's Configuration (config.kueue.x-k8s.io/v1beta2)."""
        return {
            "apiVersion": "config.kueue.x-k8s.io/v1beta2",
            "kind": "Configuration",
            "namespace": KUEUE_NAMESPACE,
            "health": {"healthProbeBindAddress": f"127.0.0.1:{self.health_port}"},
            "metrics": {"bindAddress": "0"},
            "webhook": {
                "host": "127.0.0.1",
                "port": self.webhook_port,
                "certDir": str(self.workdir / "certs"),
            },
            "leaderElection": {"leaderElect": False},
            "internalCertManagement": {
                "enable": True,
                "webhookServiceName": _SERVICE,
                "webhookSecretName": _SECRET,
            },
            "manageJobsWithoutQueueName": False,
            "integrations": {
                "frameworks": ["batch/job"],
                "externalFrameworks": [EXTERNAL_FRAMEWORK],
            },
            "featureGates": {"VisibilityOnDemand": False},
        }

    def start(self, timeout: float = 120.0) -> KueueServer:
        binaries = ensure_kueue()
        started = time.monotonic()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.webhook_port = free_port()
        self.health_port = free_port()
        ca, server = make_webhook_pki(
            self.workdir / "certs",
            "kueue-ca",
            (f"{_SERVICE}.{KUEUE_NAMESPACE}.svc", "127.0.0.1"),
        )
        self._install(binaries, ca.cert, ca.key, server.cert, server.key)
        config = self.workdir / "kueue-config.yaml"
        config.write_text(yaml.safe_dump(self.configuration()))
        argv = [str(binaries / "kueue"), f"--config={config}"]
        self._supervisor.spawn("kueue", [*argv, f"--kubeconfig={self.plane.kubeconfig}"])
        try:
            self._supervisor.wait_until("kueue", self._ready, timeout)
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - started
        return self

    def _ready(self) -> bool:
        """Ready: its probe answers and its webhook serves (a dry-run through it)."""
        if not http_ok(f"http://127.0.0.1:{self.health_port}/readyz"):
            return False
        probe = {
            "apiVersion": "kueue.x-k8s.io/v1beta1",
            "kind": "ResourceFlavor",
            "metadata": {"name": "lmeval-readiness-probe"},
        }
        path = self.workdir / "probe.yaml"
        path.write_text(yaml.safe_dump(probe))
        result = self.plane.kubectl(
            "create", "--dry-run=server", "-f", str(path), check=False, timeout=30
        )
        return result.returncode == 0

    def _install(self, binaries: Path, ca_cert: Path, ca_key: Path, cert: Path, key: Path) -> None:
        """Namespace, Secret, certificate files, CRDs and webhook configurations."""
        url = f"https://127.0.0.1:{self.webhook_port}"
        bundle = _b64(ca_cert)
        objects: list[dict[str, Any]] = [
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": KUEUE_NAMESPACE}},
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": _SECRET, "namespace": KUEUE_NAMESPACE},
                "data": {
                    "ca.crt": bundle,
                    "ca.key": _b64(ca_key),
                    "tls.crt": _b64(cert),
                    "tls.key": _b64(key),
                },
            },
        ]
        for path in sorted((binaries / "crds").glob("*.yaml")):
            crd = yaml.safe_load(path.read_text())
            if crd["metadata"]["name"] in _CONVERTED:
                crd["spec"]["conversion"] = {
                    "strategy": "Webhook",
                    "webhook": {
                        "clientConfig": {"url": f"{url}/convert", "caBundle": bundle},
                        "conversionReviewVersions": ["v1"],
                    },
                }
            objects.append(crd)
        for config in yaml.safe_load_all((binaries / "webhook.yaml").read_text()):
            if not config:
                continue
            kind = "mutating" if config["kind"].startswith("Mutating") else "validating"
            config["metadata"]["name"] = f"kueue-{kind}-webhook-configuration"
            # Only Kueue's own resources: the other frameworks are not enabled here.
            hooks = [
                hook
                for hook in config["webhooks"]
                if "kueue-x-k8s-io" in hook["clientConfig"]["service"]["path"]
            ]
            for hook in hooks:
                path = hook["clientConfig"]["service"]["path"]
                hook["clientConfig"] = {"url": f"{url}{path}", "caBundle": bundle}
            config["webhooks"] = hooks
            objects.append(config)
        manifest = self.workdir / "install.yaml"
        manifest.write_text(yaml.safe_dump_all(objects))
        self.plane.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(manifest))
        for name in _CONVERTED:
            # kubectl's 30 s default was seen to run out on a loaded 2-core
            # machine (Workload's schema is large): the apiserver was only slow.
            self.plane.kubectl(
                "wait", "--for=condition=Established", "--timeout=150s", f"crd/{name}", timeout=180
            )

    def log_tail(self, lines: int = 40) -> str:
        return self._supervisor.log_tail("kueue", lines)

    def stop(self) -> None:
        for pid in self._supervisor.pids().values():
            terminate(pid)
        self._supervisor.reap()

    def __enter__(self) -> KueueServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


if __name__ == "__main__":
    print(ensure_kueue())
