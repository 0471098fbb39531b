"""A suite's signed verdict, end to end, verified by the real cosign.

A real registry on loopback (``tests.ociregistry``) holds a small model
artifact; a suite names it in ``spec.attestation.push`` and its signing key
in a Secret made by the real ``cosign generate-key-pair`` (cosign's own
encrypted format, its password in the same Secret). The suite's run (real
lm_eval on the sample model server, through the local runner) is Passed
against a pinned job; then the poller's signing pod (the job image's
``python -m driver.attest``, the key mounted, no API rights) signs the
statement and pushes it beside the model. Checks:

- the run's ``attestation`` is Signed, with the payload's digest and the
  pushed manifest's; the envelope is in the run's attestation ConfigMap,
  owned by the run; the signing pod is gone;
- the real ``cosign verify-attestation --key cosign.pub --type <ours>``
  accepts the model's attestation, offline, and prints our statement: its
  subject is the model's digest, its predicate the suite, the run, the
  verdict Passed with the criterion's numbers and both jobs' provenance;
- the envelope in the ConfigMap verifies with ``driver.attest.verify_envelope``
  and is the one cosign printed; ``lmeval suite verify`` says OK with the
  suite's public key and refuses another key;
- one byte of the statement changed and pushed in its place: cosign refuses.
"""

from __future__ import annotations

import base64
import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from kubernetes import client
from lmeval_sandbox import cosign
from lmeval_sandbox.controlplane import ControlPlane
from lmeval_sandbox.model_server import ModelServer
from lmeval_sandbox.runner import LocalRunner

from driver import attest, ocipush, protocol
from poller import api
from poller.cycle.reconciler import Reconciler
from poller.jobpod import signer
from tests import ociregistry
from tests.cli.conftest import Cli
from tests.e2e.test_regression_gate import METRIC, TASK
from tests.e2e.test_regression_gate import _tasks_configmap as tasks_configmap
from tests.e2e.test_suites import _create_suite, _runs, _template
from tests.poller_fixtures import Jobs, cycle_until

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.lmeval,
    pytest.mark.skipif(not ociregistry.available(), reason="docker-registry/skopeo"),
]

LMEVAL_TIMEOUT = 300.0
PASSWORD = "suite-key-pass"


@pytest.fixture
def server() -> Iterator[ModelServer]:
    with ModelServer(generation_text="42") as good:
        yield good


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[ociregistry.Registry]:
    with ociregistry.running(tmp_path / "registry") as running:
        yield running


def _verified(reference: str, public: Path, home: Path) -> tuple[int, list[dict[str, Any]], str]:
    done = cosign.verify_attestation(
        reference, public, protocol.ATTESTATION_PREDICATE_TYPE, home=home, insecure_registry=True
    )
    statements = [
        json.loads(base64.b64decode(json.loads(line)["payload"]))
        for line in done.stdout.splitlines()
        if line.strip()
    ]
    return done.returncode, statements, done.stderr


def _other_key(directory: Path) -> tuple[Path, ec.EllipticCurvePrivateKey]:
    """Another P-256 key's public half (cosign.pub's format), for a refusal."""
    key = ec.generate_private_key(ec.SECP256R1())
    path = directory / "other.pub"
    path.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return path, key


def test_a_verdict_is_signed_and_cosign_verifies_it(
    poller: Reconciler,
    control_plane: ControlPlane,
    jobs: Jobs,
    runner: LocalRunner,
    server: ModelServer,
    registry: ociregistry.Registry,
    tmp_path: Path,
) -> None:
    model = ocipush.push_results(
        f"{registry.address}/team/toy-model:v1",
        b'{"weights": "tiny"}',
        b'{"origin": "test"}',
        plain_http=True,
    )
    home = tmp_path / "cosign-home"
    cosign.run_cosign("generate-key-pair", home=home, env={"COSIGN_PASSWORD": PASSWORD})
    public = home / "cosign.pub"
    jobs.core.create_namespaced_secret(
        jobs.namespace,
        client.V1Secret(
            metadata=client.V1ObjectMeta(name="suite-key"),
            string_data={
                "cosign.key": (home / "cosign.key").read_text(),
                "cosign.password": PASSWORD,
            },
        ),
    )
    jobs.core.create_namespaced_config_map(jobs.namespace, tasks_configmap())
    jobs.create("prod-eval", **_template(server, logSamples=True))
    _create_suite(
        jobs,
        "signed",
        {
            "template": _template(server),
            "criteria": [{"task": TASK, "metric": METRIC, "maxDrop": 0.1}],
            "baseline": {"pinned": "prod-eval"},
            "attestation": {
                "signingKey": {"name": "suite-key", "key": "cosign.key"},
                "passwordKey": "cosign.password",
                "push": {"reference": model, "plainHTTP": True},
            },
        },
        annotations={api.RUN_REQUESTED_ANNOTATION: "release-1"},
    )

    def signed() -> dict[str, Any] | None:
        runs = _runs(jobs, "signed")
        state = runs[0].get("attestation", {}).get("state") if runs else None
        return runs[0] if state in ("Signed", "Failed") else None

    run = cycle_until(poller, signed, timeout=LMEVAL_TIMEOUT, what="the run's signed verdict")
    record = run["attestation"]
    assert record["state"] == "Signed", record
    assert run["verdict"] == "Passed"
    assert record["subject"] == model
    assert record["pushed"].startswith("sha256:")
    # The envelope stays beside the run, owned by it; the signing pod is gone.
    kept = jobs.core.read_namespaced_config_map(record["configMap"], jobs.namespace)
    assert kept.metadata.owner_references[0].uid == run["uid"]
    envelope = json.loads(kept.data[signer.ATTESTATION_KEY])
    names = {pod.metadata.name for pod in jobs.pods()}
    assert signer.signer_name(run["name"]) not in names

    # The real cosign, offline, against the model in the registry.
    code, statements, stderr = _verified(model, public, tmp_path / "verify-home")
    assert code == 0, stderr
    (statement,) = statements
    assert statement == attest.verify_envelope(envelope, public.read_bytes())
    repository, digest = model.split("@")
    assert statement["subject"] == [{"name": repository, "digest": {"sha256": digest[7:]}}]
    predicate = statement["predicate"]
    assert predicate["verdict"] == "Passed" and predicate["run"]["name"] == run["name"]
    assert predicate["suite"]["name"] == "signed"
    (criterion,) = predicate["run"]["criteria"]
    assert criterion["pValue"] == run["criteria"][0]["pValue"]
    assert criterion["paired"] == run["criteria"][0]["paired"]
    assert set(predicate["provenance"]) == {run["name"], "prod-eval"}
    hashes = predicate["provenance"][run["name"]].get("taskHashes") or {}
    assert TASK in hashes, predicate["provenance"][run["name"]]

    # The CLI checks the kept envelope against the status, with the suite's key.
    cli = Cli(control_plane.kubeconfig, jobs.namespace)
    done = cli("suite", "verify", "signed", "--key", str(public))
    assert done.returncode == 0, done.stderr
    assert run["name"] in done.stdout and "OK" in done.stdout, done.stdout
    other, _ = _other_key(tmp_path)
    refused = cli("suite", "verify", "signed", "--key", str(other))
    assert refused.returncode == 1 and "does not verify" in refused.stdout + refused.stderr

    # One byte of the statement changed, pushed in the attestation's place.
    tampered = copy.deepcopy(envelope)
    payload = base64.b64decode(tampered["payload"])
    assert payload.count(b'"Passed"') >= 1
    tampered["payload"] = base64.b64encode(payload.replace(b'"Passed"', b'"Passes"', 1)).decode()
    attest.push_attestation(model, tampered, plain_http=True, replace=True)
    code, statements, stderr = _verified(model, public, tmp_path / "verify-home")
    assert code != 0 and not statements
    assert "no matching attestations" in stderr, stderr
