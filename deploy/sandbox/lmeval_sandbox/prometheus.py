"""A real Prometheus (and promtool) for the metrics tests, on loopback.

The metrics are only proven when a real Prometheus scrapes them and answers
PromQL over its HTTP API, and when promtool accepts the exposition and the
alerting rules. Like the control plane (`lmeval_sandbox.build`), both are
compiled from the published Go module (`deploy/sandbox/prometheus`) and
cached outside the clone, keyed by the module files, the link flags and the
Go version; ``LMEVAL_PROMETHEUS_BIN`` may name a directory holding ready
``prometheus`` and ``promtool`` binaries instead, and without a Go toolchain
the ones on PATH (Debian's ``prometheus`` package) are used. The web UI's
assets are not in the module zip, so the server is built without them: the
HTTP API, which is all the tests use, does not need them.

`PrometheusServer` writes a config that scrapes the given targets every
second (``honor_labels``, as the ServiceMonitor does), starts the server on a
free loopback port with a throwaway TSDB, waits until it is ready, and stops
it (by its PID) at the end.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from lmeval_sandbox import build
from lmeval_sandbox.components import free_port
from lmeval_sandbox.supervise import die_with_parent, terminate

__all__ = [
    "PROMETHEUS_MODULE",
    "PrometheusError",
    "PrometheusServer",
    "ensure_prometheus",
    "promtool",
]

PROMETHEUS_MODULE = build.MODULES_DIR / "prometheus"
BINARIES = ("prometheus", "promtool")
_UPSTREAM = "github.com/prometheus/prometheus"


class PrometheusError(RuntimeError):
    """Prometheus could not be built, started or queried."""


def prometheus_version() -> str:
    """The pinned release: module v0.308.1 is Prometheus 3.8.1."""
    module = build._required_version(PROMETHEUS_MODULE, _UPSTREAM)
    match = re.fullmatch(r"v0\.(\d+)\.(\d+)", module)
    if not match:
        return module.lstrip("v")
    minor = int(match.group(1))
    return f"{minor // 100}.{minor % 100}.{match.group(2)}"


def _ldflags() -> str:
    prefix = "github.com/prometheus/common/version"
    return " ".join(
        [
            "-s -w",
            f"-X {prefix}.Version={prometheus_version()}",
            f"-X {prefix}.Branch=module",
            f"-X {prefix}.Revision={build._required_version(PROMETHEUS_MODULE, _UPSTREAM)}",
        ]
    )


def _build_key() -> str:
    return build.module_build_key((PROMETHEUS_MODULE,), (_ldflags(),))


def _complete(directory: Path) -> bool:
    return all((directory / name).is_file() for name in BINARIES)


def _build(target: Path) -> float:
    return build.staged_build(
        target,
        "Prometheus",
        lambda staging, log: build._run_go(
            ["build", "-ldflags", _ldflags(), "-o", f"{staging}/", "tool"], PROMETHEUS_MODULE, log
        ),
        lambda staging: "" if _complete(staging) else ", ".join(BINARIES),
        {"prometheus": prometheus_version()},
        PrometheusError,
    )


def ensure_prometheus() -> Path:
    """A directory holding ``prometheus`` and ``promtool``; builds them at most once."""
    override = os.environ.get("LMEVAL_PROMETHEUS_BIN")
    if override:
        directory = Path(override)
        if not _complete(directory):
            raise PrometheusError(f"LMEVAL_PROMETHEUS_BIN={override} lacks prometheus or promtool")
        return directory
    if shutil.which("go") is None:
        found = [shutil.which(name) for name in BINARIES]
        if all(found) and found[0] is not None:
            return Path(found[0]).parent  # e.g. Debian's prometheus package
        raise PrometheusError("neither Go (to build Prometheus) nor prometheus/promtool found")
    target = build.cache_root() / f"prometheus-{_build_key()}"
    if _complete(target):
        return target
    with build._locked(build.cache_root() / "prometheus-build.lock"):
        if _complete(target):
            return target
        elapsed = _build(target)
        print(f"Prometheus built in {elapsed:.0f} s (cold)", file=sys.stderr)
    return target


def promtool(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run promtool; the caller checks ``returncode`` and the output."""
    return subprocess.run(
        [str(ensure_prometheus() / "promtool"), *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


class PrometheusServer:
    """One Prometheus on 127.0.0.1 scraping `targets` (``host:port``) every second."""

    def __init__(
        self,
        workdir: Path,
        targets: Sequence[str],
        *,
        rule_files: Sequence[Path] = (),
        scrape_interval: str = "1s",
    ) -> None:
        self.workdir = workdir
        self.targets = list(targets)
        self.rule_files = list(rule_files)
        self.scrape_interval = scrape_interval
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path = workdir / "prometheus.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def config(self) -> dict[str, Any]:
        return {
            "global": {
                "scrape_interval": self.scrape_interval,
                "scrape_timeout": self.scrape_interval,
                "evaluation_interval": self.scrape_interval,
            },
            "rule_files": [str(path) for path in self.rule_files],
            "scrape_configs": [
                {
                    "job_name": "lmeval-poller",
                    # The poller's per-job series carry their own `namespace`.
                    "honor_labels": True,
                    "static_configs": [{"targets": self.targets}],
                }
            ],
        }

    def start(self, timeout: float = 60.0) -> PrometheusServer:
        binaries = ensure_prometheus()
        self.workdir.mkdir(parents=True, exist_ok=True)
        config = self.workdir / "prometheus.yml"
        config.write_text(yaml.safe_dump(self.config()))
        self.port = free_port()
        log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            [
                str(binaries / "prometheus"),
                f"--config.file={config}",
                f"--storage.tsdb.path={self.workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--log.level=warn",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=self.workdir,
            start_new_session=True,
            preexec_fn=die_with_parent,
        )
        log.close()
        deadline = time.monotonic() + timeout
        while not self._ready():
            if self.process.poll() is not None or time.monotonic() > deadline:
                tail = self.log_path.read_text(errors="replace").splitlines()[-30:]
                self.stop()
                raise PrometheusError("Prometheus did not become ready:\n" + "\n".join(tail))
            time.sleep(0.1)
        return self

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as response:  # noqa: S310
                return bool(response.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def api(self, path: str, **params: str) -> Any:
        """GET ``/api/v1/<path>`` and return its ``data``."""
        query = urllib.parse.urlencode(params)
        url = f"{self.url}/api/v1/{path}" + (f"?{query}" if query else "")
        try:
            with urllib.request.urlopen(url, timeout=10) as response:  # noqa: S310
                body = json.loads(response.read())
        except urllib.error.HTTPError as error:
            raise PrometheusError(f"{url}: {error.code} {error.read()[:500]!r}") from error
        if body.get("status") != "success":
            raise PrometheusError(f"{url}: {body}")
        return body["data"]

    def query(self, promql: str) -> list[dict[str, Any]]:
        """An instant query's vector: ``[{"metric": {...}, "value": [t, "v"]}, ...]``."""
        data = self.api("query", query=promql)
        if data.get("resultType") != "vector":
            raise PrometheusError(f"{promql!r} returned a {data.get('resultType')}, not a vector")
        result: list[dict[str, Any]] = data["result"]
        return result

    def stop(self) -> None:
        if self.process is not None:
            terminate(self.process.pid)
            self.process.wait(timeout=10)
            self.process = None

    def __enter__(self) -> PrometheusServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


if __name__ == "__main__":
    print(ensure_prometheus())
