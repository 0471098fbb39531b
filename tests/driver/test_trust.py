"""The driver's TLS clients against real servers behind their own CAs (issue 34).

Each server presents a chain shaped like an OpenShift service-serving
certificate (`lmeval_sandbox.pki.service_serving_chain`: root, intermediate,
leaf for 127.0.0.1 and localhost) whose root nothing else trusts:

- **S3** (versitygw over HTTPS, ``lmeval-driver fetch-s3`` as the init
  container runs it): refused without the CA, the message naming
  ``spec.offline.storage.s3`` and the two ways to fix it; trusted through
  ``--ca-bundle`` (``s3.caBundle``) or through the cluster's bundles
  (``$LMEVAL_CLUSTER_CA_BUNDLES``, where an absent and an empty entry are
  skipped with a note); a PEM-less caBundle is an error naming its field;
  ``--no-verify-ssl`` verifies nothing;
- **an OCI registry** (Debian's docker-registry with ``http.tls``, the run's
  push after a fake lm_eval): the push fails without the CA, the run still
  completes, and ``results_artifact_error`` names ``spec.outputs.oci``;
  trusted through ``--oci-ca-bundle`` or the cluster's bundles;
  ``--oci-tls=insecure`` verifies nothing; a PEM-less caBundle fails the run
  before lm_eval starts, naming ``spec.outputs.oci.caBundle``;
- **a Git server** (``git http-backend`` behind Python's HTTPS server, the
  host's real git): ``lmeval-driver ca-bundle`` writes the one file git's
  ``http.sslCAInfo`` takes (image + cluster + own), and the clone succeeds;
  without it git's words are what `gittasks.clone_failure` turns into a
  message naming ``spec.customTasks[i].git.caBundle``;
- a certificate for another host says so, and what to do, rather than
  asking for a CA.
"""

from __future__ import annotations

import json
import os
import socket
import ssl
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from lmeval_sandbox.pki import ServiceChain, service_serving_chain
from lmeval_sandbox.s3server import S3Server

from driver import trust
from driver.protocol import ENV_CLUSTER_CA_BUNDLES, EXIT_DRIVER_ERROR, EXIT_OK
from poller.jobpod import gittasks
from tests import ociregistry
from tests.driver.conftest import REPO_ROOT, WRITE_RESULTS, fake_child, run_driver
from tests.driver.test_outcomes import only_final
from tests.e2e.gitserver import GitHttp, commit_files, git

RESULTS = {"results": {"arc": {"acc,none": 0.5}}, "config": {"model": "fake"}}
UNTRUSTED = "certificate is not trusted (certificate verify failed: unable to get local issuer"
FIX = "or ask for it in the poller setting trusted-ca-bundles"


def _chain(tmp_path_factory: pytest.TempPathFactory, name: str) -> ServiceChain:
    return service_serving_chain(
        tmp_path_factory.mktemp(name), dns_names=("localhost",), ips=("127.0.0.1",)
    )


def _cluster(tmp_path: Path, *bundles: Path) -> str:
    """$LMEVAL_CLUSTER_CA_BUNDLES: an absent entry, an empty one, then `bundles`."""
    empty = tmp_path / "cluster-ca" / "empty-bundle" / "ca.crt"
    empty.parent.mkdir(parents=True, exist_ok=True)
    empty.write_text("")
    absent = tmp_path / "cluster-ca" / "odh-trusted-ca-bundle" / "ca-bundle.crt"
    return ":".join(str(p) for p in (absent, empty, *bundles))


# -- S3 ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServiceChain, S3Server]]:
    chain = _chain(tmp_path_factory, "s3-pki")
    root = tmp_path_factory.mktemp("s3") / "data"
    with S3Server(root, tls=(chain.served, chain.key)) as server:
        (server.bucket("evals") / "hub").mkdir()
        (server.bucket("evals") / "hub" / "model.bin").write_bytes(b"weights")
        yield chain, server


def _fetch(
    server: S3Server, dest: Path, *options: str, cluster: str | None = None
) -> tuple[int, str]:
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO_ROOT),
        "S3_ENDPOINT": server.endpoint,
        "S3_BUCKET": "evals",
        "AWS_ACCESS_KEY_ID": server.access_key,
        "AWS_SECRET_ACCESS_KEY": server.secret_key,
    }
    if cluster is not None:
        env[ENV_CLUSTER_CA_BUNDLES] = cluster
    done = subprocess.run(
        [sys.executable, "-m", "driver", "fetch-s3", f"--dest={dest}", "--path=hub", *options],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return done.returncode, done.stdout + done.stderr


def test_s3_endpoint_refused_without_its_ca(
    s3: tuple[ServiceChain, S3Server], tmp_path: Path
) -> None:
    server = s3[1]
    assert server.endpoint.startswith("https://127.0.0.1:")
    code, output = _fetch(server, tmp_path / "dest")
    assert code == 1, output
    assert (
        f"spec.offline.storage.s3: the S3 endpoint's {UNTRUSTED} certificate): give its CA in "
        f"spec.offline.storage.s3.caBundle, {FIX}"
    ) in output, output
    assert not (tmp_path / "dest" / "model.bin").exists()


def test_s3_endpoint_trusted_through_its_ca_or_the_clusters(
    s3: tuple[ServiceChain, S3Server], tmp_path: Path
) -> None:
    chain, server = s3
    code, output = _fetch(server, tmp_path / "own", f"--ca-bundle={chain.root}")
    assert code == 0, output
    assert (tmp_path / "own" / "model.bin").read_bytes() == b"weights"
    code, output = _fetch(server, tmp_path / "cluster", cluster=_cluster(tmp_path, chain.root))
    assert code == 0, output
    assert (tmp_path / "cluster" / "model.bin").read_bytes() == b"weights"
    # Optional: absent and empty picked-up files are skipped with a note.
    assert "trusted-ca-bundles: odh-trusted-ca-bundle/ca-bundle.crt is not in this namespace" in (
        output
    )
    assert "trusted-ca-bundles: empty-bundle/ca.crt: " in output and "is empty: skipped" in output


def test_s3_pemless_ca_is_an_error_and_no_verification_needs_none(
    s3: tuple[ServiceChain, S3Server], tmp_path: Path
) -> None:
    server = s3[1]
    junk = tmp_path / "junk.crt"
    junk.write_text("not a certificate\n")
    code, output = _fetch(server, tmp_path / "junk", f"--ca-bundle={junk}")
    assert code == 1 and "spec.offline.storage.s3.caBundle: " in output, output
    assert "holds no PEM certificate" in output
    code, output = _fetch(server, tmp_path / "insecure", "--no-verify-ssl")
    assert code == 0, output


# -- an OCI registry ---------------------------------------------------------------


@pytest.fixture(scope="module")
def registry(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[ServiceChain, ociregistry.Registry]]:
    if not ociregistry.available():
        pytest.skip("docker-registry/skopeo")
    chain = _chain(tmp_path_factory, "registry-pki")
    root = tmp_path_factory.mktemp("registry")
    with ociregistry.running(root, tls=(chain.served, chain.key), ca=chain.root) as running:
        yield chain, running


def _push(
    tmp_path: Path, env: dict[str, str], registry: ociregistry.Registry, *options: str
) -> tuple[int, dict[str, object]]:
    results = tmp_path / "results.json"
    tmp_path.mkdir(parents=True, exist_ok=True)
    results.write_text(json.dumps(RESULTS))
    env = {**env, "FAKE_RESULTS": str(results)}
    ref = f"{registry.address}/team/evals:{tmp_path.name}"
    run = run_driver(
        [
            "--output-root",
            str(tmp_path / "root"),
            "--run-id",
            "run-1",
            f"--oci-push={ref}",
            *options,
        ],
        fake_child(WRITE_RESULTS),
        env,
    )
    return run.returncode, only_final(run)


def test_registry_refused_without_its_ca_and_the_run_still_completes(
    registry: tuple[ServiceChain, ociregistry.Registry], tmp_path: Path, env: dict[str, str]
) -> None:
    running = registry[1]
    assert running.scheme == "https"
    code, final = _push(tmp_path / "none", env, running)
    assert code == EXIT_OK and final["event"] == "completed", final
    assert "results_artifact" not in final
    assert final["results_artifact_error"] == (
        f"spec.outputs.oci: the registry's {UNTRUSTED} certificate): give its CA in "
        f"spec.outputs.oci.caBundle, {FIX}"
    )


def test_registry_trusted_through_its_ca_the_clusters_or_not_verified(
    registry: tuple[ServiceChain, ociregistry.Registry], tmp_path: Path, env: dict[str, str]
) -> None:
    chain, running = registry
    for name, options, extra in (
        ("own", [f"--oci-ca-bundle={chain.root}"], {}),
        ("cluster", [], {ENV_CLUSTER_CA_BUNDLES: _cluster(tmp_path, chain.root)}),
        ("insecure", ["--oci-tls=insecure"], {}),
    ):
        code, final = _push(tmp_path / name, {**env, **extra}, running, *options)
        assert code == EXIT_OK and "results_artifact" in final, (name, final)
        digest = str(final["results_artifact"]).split("@")[1]
        manifest = running.skopeo_raw(f"team/evals@{digest}")
        assert manifest["artifactType"] == "application/vnd.lmeval.results.v1+json"


def test_a_pemless_registry_ca_fails_the_run_before_lm_eval(
    registry: tuple[ServiceChain, ociregistry.Registry], tmp_path: Path, env: dict[str, str]
) -> None:
    running = registry[1]
    junk = tmp_path / "junk.crt"
    junk.write_text("")
    code, final = _push(tmp_path / "junk", env, running, f"--oci-ca-bundle={junk}")
    assert code == EXIT_DRIVER_ERROR, final
    assert str(final["message"]).startswith("spec.outputs.oci.caBundle: "), final
    assert "is empty" in str(final["message"])


# -- a Git server ------------------------------------------------------------------


@pytest.fixture(scope="module")
def git_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServiceChain, GitHttp]]:
    chain = _chain(tmp_path_factory, "git-pki")
    root = tmp_path_factory.mktemp("git")
    work = root / "work"
    git("init", "-q", "-b", "main", str(work))
    commit_files(work, {"tasks/task.yaml": "task: t\n"}, "1")
    git("clone", "-q", "--bare", str(work), str(root / "served" / "tasks.git"))
    with GitHttp(root / "served", "alice", "pw", tls=(chain.served, chain.key)) as server:
        yield chain, server


def _clone(server: GitHttp, target: Path, ca_file: Path | None) -> subprocess.CompletedProcess[str]:
    # As the fetch container runs it: no system or user configuration, the
    # CA file (if any) in command-scope configuration, never a prompt.
    config = [("credential.helper", "")]
    if ca_file is not None:
        config.append(("http.sslCAInfo", str(ca_file)))
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(target.parent),
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": "/dev/null",
        "GIT_CONFIG_COUNT": str(len(config)),
    }
    for number, (key, value) in enumerate(config):
        env[f"GIT_CONFIG_KEY_{number}"], env[f"GIT_CONFIG_VALUE_{number}"] = key, value
    url = server.url("tasks.git").replace("://", "://alice:pw@")
    return subprocess.run(
        ["git", "clone", "-q", "--", url, str(target)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _ca_bundle(out: Path, *options: str, cluster: str | None = None) -> tuple[int, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    if cluster is not None:
        env[ENV_CLUSTER_CA_BUNDLES] = cluster
    done = subprocess.run(
        [sys.executable, "-m", "driver", "ca-bundle", f"--out={out}", *options],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return done.returncode, done.stdout + done.stderr


def test_git_trusts_the_one_file_the_driver_writes(
    git_server: tuple[ServiceChain, GitHttp], tmp_path: Path
) -> None:
    chain, server = git_server
    assert server.url("x").startswith("https://127.0.0.1:")
    refused = _clone(server, tmp_path / "refused", None)
    assert refused.returncode != 0
    raw = {"customTasks": [{"git": {"url": server.url("tasks.git")}}]}
    message = gittasks.clone_failure(raw, "git-0-fetch", refused.returncode, refused.stderr)
    assert message is not None and "its certificate is not trusted" in message, refused.stderr
    assert "spec.customTasks[0].git.caBundle" in message and FIX in message

    own = tmp_path / "own.pem"
    field = "--field=spec.customTasks[0].git.caBundle"
    code, output = _ca_bundle(own, f"--ca-bundle={chain.root}", field)
    assert code == 0, output
    assert own.read_bytes().endswith(chain.root.read_bytes())
    assert own.read_bytes().count(b"-----BEGIN CERTIFICATE-----") > 2  # the image's too
    assert _clone(server, tmp_path / "with-own", own).returncode == 0
    assert (tmp_path / "with-own" / "tasks" / "task.yaml").is_file()

    cluster = tmp_path / "cluster.pem"
    code, output = _ca_bundle(cluster, cluster=_cluster(tmp_path, chain.root))
    assert code == 0 and "is not in this namespace" in output, output
    assert _clone(server, tmp_path / "with-cluster", cluster).returncode == 0


def test_the_git_trust_step_refuses_a_pemless_bundle_naming_it(tmp_path: Path) -> None:
    junk = tmp_path / "junk.crt"
    junk.write_text("nothing here\n")
    field = "spec.customTasks[2].git.caBundle"
    code, output = _ca_bundle(tmp_path / "out.pem", f"--ca-bundle={junk}", f"--field={field}")
    assert code == 1
    assert f"{field}: {junk} holds no PEM certificate" in output, output


# -- what a failed verification says -------------------------------------------------


def test_a_certificate_for_another_host_says_so(tmp_path: Path) -> None:
    chain = service_serving_chain(tmp_path, dns_names=("elsewhere.invalid",))
    served = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    served.load_cert_chain(str(chain.served), str(chain.key))
    with socket.create_server(("127.0.0.1", 0)) as listener:

        def accept() -> None:
            conn, _ = listener.accept()
            try:
                served.wrap_socket(conn, server_side=True).close()
            except OSError:  # the client refused the certificate
                conn.close()

        thread = threading.Thread(target=accept, daemon=True)
        thread.start()
        context = trust.ssl_context(str(chain.root), "spec.outputs.oci.caBundle")
        url = f"https://127.0.0.1:{listener.getsockname()[1]}/v2/"
        with pytest.raises(urllib.error.URLError) as caught:
            urllib.request.urlopen(url, timeout=10, context=context)
        thread.join(10)
    message = trust.untrusted_message("spec.outputs.oci", "the registry", caught.value)
    assert message is not None and message.startswith(
        "spec.outputs.oci: the registry's certificate does not name the host it was reached at "
        "(certificate verify failed: IP address mismatch"
    ), message
    assert message.endswith("use a host name the certificate is issued for")
    assert trust.untrusted_message("x", "y", OSError("connection refused")) is None
